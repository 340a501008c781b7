"""What an optimization changed, as the user reads it: rewrites, ops, costs, validation."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..optimization.derivation import Derivation
from ..validate import Validation


@dataclass
class Report:
    signature: str
    rewrites: list[tuple[str, str, int]] = field(default_factory=list)  # name, lhs -> rhs, matches
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    cost_before: dict[str, int] = field(default_factory=dict)
    cost_after: dict[str, int] = field(default_factory=dict)
    opaque: list[str] = field(default_factory=list)
    saturation: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)  # kernels the plan binds, by name
    latency: tuple | None = None  # (seconds before, seconds after, sources of the estimates after,
    # (kernels timed during this optimize, seconds it took, why timing stopped early or None))
    error: tuple | None = None  # first-order rounding error (ProgramError) before and after
    validation: Validation | None = None
    measured: list | None = None  # seconds of the original and the optimized, timed side by side
    fallback: str = ""  # why the original program is running instead, if it is
    bounded: list[str] = field(default_factory=list)  # work that ran on a sample or not at all, and why
    derivation: Derivation | None = None  # the steps the [REWRITE] lines are read from
    ranges: list[str] = field(default_factory=list)  # guarded rules a declared input range would let fire
    sizes: str = ""  # the sizes its plan serves, made from its size family (``families.py``)

    def to_html(self, path) -> str:
        """Write this report as one self-contained HTML page; returns the path."""
        from .html_report import write_report
        from .usage import require
        require("report", "Report.to_html")  # its pictures: refused, not dropped
        return write_report(self, path)

    @property
    def optimized(self) -> bool:
        return not self.fallback

    def __str__(self) -> str:
        lines = [f"egraph-opt report for {self.signature}"]
        if self.fallback and not self.ops_before:  # nothing was captured: the why is all there is
            return "\n".join(lines + [f"[FALLBACK] running the original program: {self.fallback}"])
        lines += [f"[REWRITE] {name}: {what}  ({n} matches)" for name, what, n in self.rewrites]
        unexplained = self.derivation is not None and not self.derivation.complete
        if not self.rewrites and not unexplained:
            lines.append("[REWRITE] none: no rule improved the program")
        if unexplained:  # the e-graph proved the output equal; the replay did not find every step
            lines.append(f"[REWRITE] steps not replayed up to: {self.derivation.unexplained}")
        if self.derivation is not None:  # a piecewise program: each regime and its form
            lines += [f"[REGIME] {label}" for label, _ in self.derivation.branches]
        lines += [f"[RANGES] {hint}" for hint in self.ranges]
        lines.append(f"[OPS] before: {_counts(self.ops_before)}")
        lines.append(f"[OPS] after:  {_counts(self.ops_after)}")
        lines += [f"[COST] {part}: {self.cost_before[part]} -> {self.cost_after[part]}"
                  for part in ("curvature", "latency") if part in self.cost_before]
        if self.latency:
            before, after, where, (timed, seconds, busy) = self.latency
            lines.append(f"[LATENCY] estimated {before * 1e6:.1f} us -> {after * 1e6:.1f} us "
                         f"({', '.join(f'{k} {v}' for k, v in where.items())}; "
                         f"{timed} kernels profiled now in {seconds:.2f} s"
                         f"{f'; no more: {busy}' if busy else ''})")
        if self.error:
            before, after = self.error
            lines.append(f"[ERROR] first-order estimate over the input ranges: worst {before.worst:.1f} -> "
                         f"{after.worst:.1f} bits, mean {before.mean:.2f} -> {after.mean:.2f} bits")
        if self.kernels:
            lines.append(f"[KERNELS] {_counts(self.kernels)}")
        lines += [f"[OPAQUE] {o}" for o in self.opaque]
        lines += [f"[SATURATION] {s}" for s in self.saturation]
        if self.seconds:
            lines.append("[TIME] " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items()))
        lines += self._measured()
        v = self.validation
        if v is not None:
            verdict = "passed" if v.passed else "FAILED"
            lines.append(f"[VALIDATION] {verdict}: max error {v.max_error:.3g} "
                         f"(original {v.original_error:.3g}){' - ' + v.detail if v.detail else ''}")
        lines += [f"[BOUNDED] {b}" for b in self.bounded]
        if self.sizes:
            lines.append(f"[SIZES] {self.sizes}")
        if self.fallback:
            lines.append(f"[FALLBACK] running the original program: {self.fallback}")
        return "\n".join(lines)

    __repr__ = __str__

    def _measured(self) -> list[str]:
        """The side-by-side timing, and what accuracy a plan kept though slower cost in time."""
        if not self.measured:
            return []
        before, after = self.measured
        lines = [f"[MEASURED] original {before * 1e6:.1f} us, optimized {after * 1e6:.1f} us "
                 f"({before / after:.2f}x), interleaved on the example inputs"]
        then, now = self.error or (None, None)
        if then and after > before and not self.fallback and now.worst <= then.worst and now.mean <= then.mean \
                and (now.worst, now.mean) != (then.worst, then.mean):  # kept for its accuracy
            lines.append(f"[TRADE] accuracy bought with time: error worst {then.worst:.1f} -> "
                         f"{now.worst:.1f} bits, mean {then.mean:.2f} -> {now.mean:.2f} bits, "
                         f"for {after / before:.2f}x the original's time")
        return lines


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in counts.items()) or "(none)"
