"""Backend: a Program back into an executable torch.fx.GraphModule.

Each Term becomes a call of the kernel it is bound to (see ``kernels.binding``: Triton on CUDA
where it runs, torch otherwise), with conversion kernels where a value changes memory (torch and
Triton share one: nothing runs between them); opaque calls are copied as they were, scalar
constants are folded, and every value is emitted once, after what it uses.
"""
from __future__ import annotations

import warnings

import torch
from torch import fx
from torch.fx.node import map_aggregate

from collections import Counter

from ..analysis.facts import Facts
from ..kernels.binding import Estimator, bind, default_estimate
from ..kernels.registry import MOVES, Use, copies
from ..kernels.torch_ops import TORCH
from ..lang.program import OpaqueRef, Program, leaves
from ..lang.term import Term, evaluate, postorder, topological


class FoldedConstant:
    """A subterm over parameters alone (batch norm folded into conv weights, QKV weights
    concatenated): computed once per version of its parameters. Where autograd needs it (grad
    enabled and a parameter requires grad) it is computed on every call, so training is unchanged;
    so it is for inference tensors, which keep no version counter."""

    def __init__(self, term: Term, names: list[str], index: int):
        self.term, self.names = term, names
        self.__name__ = self.__qualname__ = f"folded_constant_{index}"
        self._key, self._value = None, None

    def __call__(self, *tensors: torch.Tensor):
        cacheable = not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and \
            not any(t.is_inference() for t in tensors)  # inference tensors keep no version
        if not cacheable:
            return evaluate([self.term], dict(zip(self.names, tensors)), kernels=TORCH)[0]
        key = tuple((t.data_ptr(), t._version, t.device) for t in tensors)
        if key == self._key and self._value._version == self._written:  # nobody wrote the value
            return self._value
        # a normal tensor even in inference mode: its version shows writes, and kernels may
        # cache facts about it by its version (sdpa_masked's mask)
        with torch.inference_mode(False):
            value = evaluate([self.term], dict(zip(self.names, tensors)), kernels=TORCH)[0]
        self._key, self._value, self._written = key, value, value._version
        return value


def _schedule(program: Program) -> list:
    """Terms and opaque call names in an order where each comes after what it uses."""
    def deps(item):
        if isinstance(item, Term):
            if item.op == "opaque":
                return [item.attrs[0]]
            return list(item.args)
        call = program.opaque[item]
        return [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)] + [
            x.name for x in leaves((call.args, call.kwargs)) if isinstance(x, OpaqueRef)]

    key = lambda item: ("t", id(item)) if isinstance(item, Term) else ("o", item)  # noqa: E731
    roots = [x if not isinstance(x, OpaqueRef) else x.name for x in leaves(program.outputs)
             if isinstance(x, (Term, OpaqueRef))]
    return topological(roots, deps, key)


def _get_attr(graph: fx.Graph, owner: torch.nn.Module, name: str) -> fx.Node:
    """A node reading ``owner``'s attribute ``name``. fx warns where it is a plain tensor, not a
    parameter or buffer, as torch.export lifts a decorated method's tensors; it is there, and
    GraphModule copies it, so the warning only alarms the user."""
    held = owner
    for part in name.split("."):
        held = getattr(held, part, None)
    with warnings.catch_warnings():
        if isinstance(held, torch.Tensor):
            warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node", UserWarning)
        return graph.get_attr(name)


def build_module(program: Program, root: torch.nn.Module | None = None, device: str = "cpu",
                 estimate: Estimator = default_estimate, meta: dict | None = None) -> fx.GraphModule:
    """The program as a GraphModule; ``.kernels`` on it counts the kernels it binds by name.
    ``meta``: the terms' shapes, where a program with the same terms already inferred them."""
    if device == "meta":
        raise ValueError("meta tensors hold no values: no kernel runs on them and nothing can be "
                         "validated, so the original runs")
    owner = root if root is not None else torch.nn.Module()
    build = _Build(program, owner, device, estimate, meta if meta is not None else program.meta())
    for item in _schedule(program):
        if isinstance(item, Term):
            build.term(item)
        else:
            call = program.opaque[item]
            args, kwargs = map_aggregate((call.args, call.kwargs), build.arg)
            build.value[("o", item)] = build.graph.create_node(call.kind, call.target, args, kwargs, name=item)
    graph = build.graph
    graph.output(map_aggregate(program.outputs, build.arg))
    graph.eliminate_dead_code()  # folded constants inside larger folded constants
    build.kernels["folded"] = sum(isinstance(n.target, FoldedConstant) for n in graph.nodes)
    graph.lint()
    module = fx.GraphModule(owner, graph)
    module.kernels = dict(sorted((+build.kernels).items()))  # + drops a count of 0 ("folded")
    return module


class _Build:
    """One program's graph under construction: each value's fx node (or Python scalar) by key,
    ("t", term id) or ("o", opaque name); the backend whose memory holds it (absent: torch); the
    conversions made; and whether every leaf below it is a parameter or constant (one pass: no
    walk per node)."""

    def __init__(self, program: Program, owner, device: str, estimate: Estimator, meta: dict):
        self.graph = fx.Graph(owning_module=owner)  # dead-code elimination asks the owner whether
        # its submodules are pure (a train-mode batch norm kept opaque updates running statistics)
        self.owner, self.device, self.estimate = owner, device, estimate
        self.value, self.backend, self.converted, self.fixed = {}, {}, {}, {}
        self.placeholders = {t.attrs[0]: self.graph.placeholder(t.attrs[0]) for t in program.inputs}
        self.facts = Facts.of_program(program.roots(), meta)
        self.kernels: Counter = Counter()

    def on(self, key, target: str):
        """The value at ``key`` in ``target``'s memory, through a conversion kernel if needed."""
        source = self.backend.get(key, "torch")
        if not copies(source, target) or not isinstance(self.value[key], fx.Node):
            return self.value[key]
        if (key, target) not in self.converted:
            self.converted[key, target] = self.graph.call_function(MOVES[source, target].impl, (self.value[key],))
        return self.converted[key, target]

    def arg(self, x):
        if isinstance(x, Term):
            return self.on(("t", id(x)), "torch")
        return self.value[("o", x.name)] if isinstance(x, OpaqueRef) else x

    def term(self, item: Term) -> None:
        key = ("t", id(item))
        if key in self.value:
            return
        self.fixed[key] = item.op in ("param", "const") or bool(item.args) and \
            all(self.fixed[("t", id(a))] for a in item.args)
        leaf = {"const": lambda: item.attrs[0], "param": lambda: _get_attr(self.graph, self.owner, item.attrs[0]),
                "opaque": lambda: self.value[("o", item.attrs[0])],
                "input": lambda: self.placeholders[item.attrs[0]]}.get(item.op)
        self.value[key] = leaf() if leaf else self._computed(item, key)

    def _computed(self, item: Term, key):
        """A scalar folded now, a subterm of parameters and constants folded once, or a kernel."""
        operands = [("t", id(a)) for a in item.args]
        if not any(isinstance(self.value[k], fx.Node) for k in operands):
            return evaluate([item], {}, kernels=TORCH)[0]
        if self.fixed[key]:  # its walk covers parameters and constants alone
            params = [t for t in postorder([item]) if t.op == "param"]
            folded = FoldedConstant(item, [t.attrs[0] for t in params], len(self.kernels))
            self.kernels["folded"] += 1
            return self.graph.call_function(folded, tuple(self.value[("t", id(t))] for t in params))
        n = self.facts.of(item)
        use = Use(op=n.op, attrs=n.attrs, shapes=n.shapes, dtypes=n.tensor_dtypes, device=self.device,
                  layouts=n.layouts)
        kernel = bind(use, tuple(self.backend.get(k, "torch") for k in operands), self.estimate)
        self.kernels[kernel.name] += 1
        self.backend[key] = kernel.backend
        args = [self.on(k, kernel.backend) for k in operands]
        return self.graph.call_function(kernel.impl, tuple(args) + tuple(item.attrs))
