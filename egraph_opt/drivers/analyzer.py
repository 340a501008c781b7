"""The curvature analyzer: each node's range, kappa, L, Delta and the bits of output error its rounding causes; the
program's first-order error. Ranges not declared come from the example inputs: an estimate, never a soundness proof."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..frontends.capture import capture
from ..extractors.curvature import kappa, kappa_cost, lipschitz, rounding
from ..extractors.rounding_error import ProgramError, program_error
from ..lang.program import Program
from ..analysis.ranges import Interval, analyze
from ..lang.term import dtype_name, postorder, pretty
from .pictures import Table, clip


@dataclass(frozen=True, kw_only=True)
class NodeCurvature:
    text: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    range: Interval
    kappa: float
    lipschitz: float
    rounding: float
    cost: int  # the integer curvature cost the extractor minimizes
    error_bits: float  # the most bits of output error this node's rounding alone causes


@dataclass
class CurvatureReport:
    nodes: list[NodeCurvature]
    error: ProgramError | None  # None: not evaluable (opaque calls)

    @property
    def total(self) -> float:
        """Total kappa of the program (inf when any node's range leaves it unbounded)."""
        return sum(n.kappa for n in self.nodes)

    def table(self, width: int = 44) -> str:
        rows = [[clip(n.text, width), f"[{n.range[0]:.3g}, {n.range[1]:.3g}]", f"{n.kappa:.3g}",
                 f"{n.lipschitz:.3g}", f"{n.rounding:.3g}", f"{n.error_bits:.1f}"] for n in self.nodes]
        error = "" if self.error is None else f"\nestimated error: worst {self.error.worst:.1f} bits, mean " \
            f"{self.error.mean:.2f} bits (first order, at points sampled from the ranges)"
        return str(Table("curvature per node", ["node", "range", "kappa", "L", "Delta", "err bits"], rows,
                         note=f"total kappa {self.total:.4g}{error}"))

    __str__ = table


def analyze_program(program: Program, ranges: dict[str, Interval] | None = None) -> CurvatureReport:
    roots, shapes = program.roots(), program.meta()
    intervals, error, nodes = analyze(roots, ranges, program.leaf_meta(), shapes), program_error(program, ranges), []
    for t in [t for t in postorder(roots) if t.args]:
        operands, out, dtype = [intervals[id(a)] for a in t.args], intervals[id(t)], dtype_name(shapes[id(t)][1])
        nodes.append(NodeCurvature(text=pretty(t), op=t.op, shape=shapes[id(t)][0], dtype=dtype, range=out,
                                   kappa=kappa(t.op, t.attrs, operands), lipschitz=lipschitz(t.op, t.attrs, operands),
                                   rounding=rounding(dtype, out), cost=kappa_cost(t.op, t.attrs, operands, out, dtype),
                                   error_bits=error.by_node.get(id(t), 0.0) if error else 0.0))
    return CurvatureReport(nodes, error)


def curvature(fn, *example_args, input_ranges: dict[str, Interval] | None = None) -> CurvatureReport:
    """Annotate ``fn`` traced on ``example_args`` with range, kappa, L and Delta per node."""
    program, ranges = capture(fn, example_args)[0], dict(input_ranges or {})
    for term, value in zip(program.inputs, example_args):
        if (name := term.attrs[0]) not in ranges and value.is_floating_point() and value.numel():
            if (finite := value[torch.isfinite(value)].double()).numel():
                ranges[name] = (float(finite.min()), float(finite.max()))
    return analyze_program(program, ranges)
