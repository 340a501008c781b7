"""Tables and pictures of an optimization: the e-graph and program graphs through Graphviz (SVG), and matplotlib
figures of precision, per-node error, rewrite impact and the latency model.

Without a Graphviz ``dot`` (``usage.find_dot``), a drawing is a ``TextPicture`` whose first line says so; a graph over
``max_nodes`` is never laid out but summarized. Reports a person can share are one self-contained HTML page each
(pictures inline as SVG or base64 PNG): an optimized function's report, an Explorer, or an ONNX batch."""
from __future__ import annotations

import base64
import html
import io
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..lang import pattern as pat
from ..lang.ops import OPS
from ..lang.term import Term, postorder, pretty
from .usage import find_dot, require

DOT_SECONDS = 20  # a layout that takes longer is abandoned for the summary
MAX_NODES = 300
CHOSEN, CHANGED, REMOVED = "#ffd54f", "#ef9a9a", "#e0e0e0"
_STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}
th{background:#f3f3f3}pre{background:#f7f7f7;padding:.6em;overflow-x:auto}section{margin-bottom:3em}"""


@dataclass
class Table:
    """A table of results for Jupyter (an HTML table, ``_repr_html_``) and a terminal (aligned columns, ``str``).
    >>> print(Table("costs", ["program", "cost"], [["naive", 12], ["fused", 3]]))
    costs
    program  cost
    -------  ----
    naive    12
    fused    3
    """
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""  # a line under the table: what it means, or why it is short
    items: list = field(default_factory=list, repr=False)  # the objects behind the rows

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        cells = [list(self.columns)] + [[_text(c) for c in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([self.title, *lines] + ([self.note] if self.note else []))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_text(c))}</td>" for c in row) + "</tr>"
                       for row in self.rows)
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return (f"<h4>{html.escape(self.title)}</h4><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{note}")


def clip(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[:width - 3] + "..."


def _text(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class SVG:
    text: str

    def save(self, path) -> str:
        Path(path).write_text(self.text)
        return str(path)

    def _repr_svg_(self) -> str:
        return self.text

    def __str__(self) -> str:
        return f"SVG picture ({len(self.text)} characters; .save(path) writes it)"


class TextPicture(SVG):
    """What a drawing falls back to: a message, then the graph or its summary as text."""

    def _repr_svg_(self):
        return None

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def render(source: str, fallback: str) -> SVG | TextPicture:
    """``source`` (DOT) laid out as SVG; ``fallback`` text when no ``dot`` runs in time."""
    if (dot := find_dot()) is None:
        return TextPicture("Graphviz dot not found (pip install graphviz-pure, or set "
                           f"EGRAPH_OPT_DOT): a text rendering instead\n{fallback}")
    try:
        done = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, timeout=DOT_SECONDS)
    except subprocess.TimeoutExpired:
        return TextPicture(f"dot took over {DOT_SECONDS} s: a text rendering instead\n{fallback}")
    return SVG(done.stdout) if done.returncode == 0 else \
        TextPicture(f"dot failed ({done.stderr.strip()[:200]}): a text rendering instead\n{fallback}")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _label(node) -> str:
    return node.attrs[0] if node.op in ("input", "param", "opaque") else f"{node.attrs[0]:g}" if node.op == "const" \
        else node.op


# --- the e-graph ---
def egraph_picture(ex, around=None, radius: int = 2, max_nodes: int = MAX_NODES) -> SVG | TextPicture:
    """An Explorer's e-graph, or the e-classes within ``radius`` of ``around``: chosen e-nodes filled."""
    classes = ex.snap.classes
    keep = set(classes) if around is None else _neighbourhood(classes, ex._id(around), radius)
    if (nodes := sum(len(classes[c]) for c in keep)) > max_nodes:
        biggest = sorted(keep, key=lambda c: -len(classes[c]))[:10]
        rows = [[c, len(classes[c]), ", ".join(sorted({n.op for n in classes[c]}))] for c in biggest]
        return TextPicture(str(Table(f"{len(keep)} e-classes, {nodes} e-nodes: too many to draw (max_nodes="
                                     f"{max_nodes}); egraph_picture(ex, around=<id>) draws one neighbourhood",
                                     ["e-class", "e-nodes", "ops"], rows, note="the largest e-classes")))
    lines = ["digraph egraph {", "compound=true; rankdir=TB; node [shape=box, style=rounded, fontsize=10];"]
    edges = []  # after every cluster: an edge inside one would draw its ends there
    for cid in sorted(keep):
        lo, hi = ex.snap.ranges.get(cid, (-float("inf"), float("inf")))
        lines.append(f"subgraph {_q('cluster_' + cid)} {{ label={_q(f'{cid} [{lo:.3g}, {hi:.3g}]')}; "
                     f"style={'bold' if cid in ex.root_classes else 'dashed'}; fontsize=9;")
        for i, node in enumerate(classes[cid]):
            fill = f', style="rounded,filled", fillcolor="{CHOSEN}"' if ex.chosen.get(cid) == node else ""
            lines.append(f"{_q(f'{cid}_{i}')} [label={_q(_label(node))}{fill}];")
            edges += [f"{_q(f'{cid}_{i}')} -> {_q(child + '_0')} [lhead={_q('cluster_' + child)}];"
                      for child in node.children if child in keep]
        lines.append("}")
    return render("\n".join(lines + edges + ["}"]), str(ex.classes()))


def _neighbourhood(classes: dict, start: str, radius: int) -> set[str]:
    parents: dict[str, set[str]] = {}
    for cid, c in ((cid, c) for cid, nodes in classes.items() for n in nodes for c in n.children):
        parents.setdefault(c, set()).add(cid)
    seen, frontier = {start}, {start}
    for _ in range(radius):
        frontier = {x for c in frontier for x in parents.get(c, set()) |
                    {k for n in classes[c] for k in n.children}} - seen
        seen |= frontier
    return seen


# --- programs before and after ---
def program_picture(before: list[Term], after: list[Term], max_nodes: int = MAX_NODES) -> SVG | TextPicture:
    """The input and the output program side by side; nodes one side only has are filled (red: new, grey: gone)."""
    numbers, sides = pat.structural_ids(before + after), {"before": before, "after": after}
    keys = {side: {numbers[id(t)]: t for t in postorder(roots)} for side, roots in sides.items()}
    fallback = "\n".join(f"{side}: " + "; ".join(pretty(r) for r in roots) for side, roots in sides.items())
    if sum(len(k) for k in keys.values()) > max_nodes:
        return TextPicture(f"programs too large to draw (max_nodes={max_nodes})\n{fallback}")
    lines = ["digraph programs {", "rankdir=BT; node [shape=box, style=rounded, fontsize=10];"]
    for side in sides:
        other, color = keys["after" if side == "before" else "before"], CHANGED if side == "after" else REMOVED
        lines.append(f"subgraph cluster_{side} {{ label={_q(side)};")
        for k, term in sorted(keys[side].items()):
            fill = f', style="rounded,filled", fillcolor="{color}"' if k not in other else ""
            lines.append(f"{side}_{k} [label={_q(_label(term))}{fill}];")
            lines += [f"{side}_{numbers[id(a)]} -> {side}_{k};" for a in term.args]
        lines.append("}")
    return render("\n".join(lines + ["}"]), fallback)


# --- matplotlib figures ---
def _figure(width: float = 6.4, height: float = 3.6, columns: int = 1):
    """A figure and its axes: one, or a row of ``columns``."""
    require("report", "drawing figures")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, columns)


def relative_error(value: torch.Tensor, truth: torch.Tensor) -> float:
    """||value - truth|| / ||truth|| in float64; inf where the value is not finite."""
    if not torch.isfinite(value := value.double()).all():
        return float("inf")
    return float(torch.linalg.vector_norm(value - truth) / torch.linalg.vector_norm(truth).clamp_min(1e-300))


def precision_errors(fn, args, dtypes=("float32", "bfloat16", "float16")) -> Table:
    """Error against float64 of ``fn`` (an optimized function) and its original, inputs cast to each dtype."""
    truth = fn.fn(*[a.double() for a in args]).double()
    casts = {name: [a.to(getattr(torch, name)) for a in args] for name in dtypes}
    rows = [[name, relative_error(fn.fn(*c), truth), relative_error(fn(*c), truth)] for name, c in casts.items()]
    return Table("relative error against float64", ["dtype", "original", "optimized"], rows)


def precision_figure(fn, args, dtypes=("float32", "bfloat16", "float16")):
    """Bars of ``precision_errors``: how each precision degrades, original vs optimized."""
    table, (fig, ax) = precision_errors(fn, args, dtypes), _figure()
    top = max((v for row in table.rows for v in row[1:] if v != float("inf") and v > 0), default=1.0) * 10
    for j, (label, color) in enumerate([("original", "#90a4ae"), ("optimized", "#1e88e5")]):
        values = [row[1 + j] for row in table.rows]
        xs = [i + (j - 0.5) * 0.38 for i in range(len(values))]
        ax.bar(xs, [min(v, top) if v > 0 else 1e-18 for v in values], 0.38, label=label, color=color)
        for x in (x for x, v in zip(xs, values) if v == float("inf")):
            ax.annotate("not finite", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(table.rows)), [row[0] for row in table.rows])
    ax.set(yscale="log", ylabel="relative error vs float64",
           title=f"precision degradation: {getattr(fn, '__name__', 'program')}")
    ax.legend()
    return fig


def waterfall_figure(report):
    """Bits of output error each node's rounding causes (the analyzer's table), in program order."""
    nodes = report.nodes
    fig, ax = _figure(6.4, 0.35 * len(nodes) + 1.2)
    ax.barh(range(len(nodes)), [n.error_bits for n in nodes], color="#ef6c00")
    ax.set_yticks(range(len(nodes)), [clip(n.text, 40) for n in nodes], fontsize=8)
    ax.invert_yaxis()
    total = f"worst {report.error.worst:.1f} bits" if report.error else "not estimable"
    ax.set(xlabel="bits of output error from this node's rounding", title=f"per-node error ({total})")
    return fig


def impact_figure(ex):
    """Per rule of the derivation: error (bits) and latency (us) it gained."""
    rows = ex.impact().rows
    fig, axes = _figure(8, 0.4 * max(len(rows), 2) + 1.2, columns=2)
    for i, (ax, column, title) in enumerate(zip(axes, (2, 3), ("error bits gained", "latency us gained"))):
        values = [r[column] for r in rows]
        ax.barh(range(len(rows)), values, color=["#43a047" if v >= 0 else "#e53935" for v in values])
        ax.set_yticks(range(len(rows)), [r[0] for r in rows] if i == 0 else [""] * len(rows), fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.5)
        ax.set_title(title)
    return fig


def latency_figure(db, op: str, dtype: str = "float32", device: str = "cpu", sizes=None):
    """``op``'s measured latencies in ``db`` and the model's interpolation over ``profiler.SPECS[op].shapes(n)``."""
    from ..profiling.latency import LatencyModel
    from ..profiling.profiler import EXAMPLE_ATTRS, SPECS, device_name, work
    where, attrs = device_name(device), {a: EXAMPLE_ATTRS[a] for a, _ in OPS[op].attrs}
    records, model = db.records(op, "torch", where, dtype), LatencyModel(db)
    sizes = sizes or [round(2 ** (k / 2)) for k in range(6, 25)]
    curve = [(work(op, SPECS[op].shapes(n), attrs).elements,
              model.predict(op, "torch", where, dtype, SPECS[op].shapes(n), attrs)) for n in sizes]
    fig, ax = _figure()
    ax.plot([x for x, _ in curve], [e.seconds * 1e6 for _, e in curve], "-", color="#1e88e5",
            label="model (interpolated)" if records else "model (roofline default)")
    if records:
        ax.plot([work(op, r.shapes, r.attrs).elements for r in records],
                [r.median_s * 1e6 for r in records], "o", color="#e53935", label="measured")
    ax.set(xscale="log", yscale="log", xlabel="elements read and written", ylabel="microseconds",
           title=f"latency of {op} ({dtype}, {where}): {len(records)} measurements")
    ax.legend()
    ax.set_xlim(left=max(1, min(x for x, _ in curve) / 2))
    return fig


# --- pages ---
def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def picture(item) -> str:
    """A picture inline: an SVG as markup, a matplotlib figure as a base64 PNG, text as <pre>."""
    if isinstance(item, (TextPicture, Table)):
        return item._repr_html_()
    if isinstance(item, SVG):
        return item.text[item.text.find("<svg"):]
    buffer = io.BytesIO()
    item.savefig(buffer, format="png", dpi=90)
    return f"<img alt='figure' src='data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}'>"


def write_report(report, path) -> str:
    """The report's text, its derivation and its costs as tables, and the programs drawn."""
    parts, d = [f"<pre>{html.escape(str(report))}</pre>"], report.derivation
    if d is not None:
        rows = [[i + 1, s.name, s.location, str(s).split(": ", 1)[1]] for i, s in enumerate(d.steps)]
        rows += [[f"regime {k + 1}, {i + 1}", s.name, s.location, str(s).split(": ", 1)[1]]
                 for k, (_, b) in enumerate(d.branches) for i, s in enumerate(b.steps)]  # piecewise
        note = "complete" if d.complete else f"not derived further: {d.unexplained}"
        parts.append(Table("derivation", ["step", "rule", "at", "rewrite"], rows, note=note)._repr_html_())
    costs = [[k, report.cost_before[k], report.cost_after.get(k)] for k in report.cost_before]
    ops = sorted(set(report.ops_before) | set(report.ops_after))
    parts.append(Table("cost", ["part", "before", "after"], costs)._repr_html_())
    parts.append(Table("ops", ["op", "before", "after"],
                       [[o, report.ops_before.get(o, 0), report.ops_after.get(o, 0)] for o in ops])._repr_html_())
    if d is not None and d.start:
        parts.append("<h4>programs before and after</h4>" + picture(program_picture(d.start, d.end)))
    Path(path).write_text(page(f"egraph-opt: {report.signature}", "".join(parts)), encoding="utf-8")
    return str(path)


def write_explorer(ex, path, alternatives: int = 5) -> str:
    """Everything the Explorer shows, on one page."""
    parts = [ex.derivation(), ex.impact(), ex.alternatives(alternatives), ex.classes(changed=True)]
    body = "".join(t._repr_html_() for t in parts) + "<h4>rewrite impact</h4>" + picture(impact_figure(ex))
    body += "<h4>the e-graph</h4>" + picture(egraph_picture(ex))
    Path(path).write_text(page(f"egraph-opt explorer: {ex.name}", body), encoding="utf-8")
    return str(path)


def batch_page(records: list[dict], summary: str, interrupted: bool, status) -> str:
    """An ONNX batch's page: the summary, then a section per model headed by ``status(record)``."""
    body = f"<pre>{html.escape(summary)}</pre>" + ("<p><b>interrupted (Ctrl-C)</b></p>" if interrupted else "")
    for r in records:
        fields = [[k, v] for k, v in r.items() if not isinstance(v, (dict, list))]
        section = Table("record", ["field", "value"], fields)._repr_html_()
        if r.get("derivation"):
            section += "<h4>derivation</h4><ol>" + "".join(
                f"<li>{html.escape(s)}</li>" for s in r["derivation"]) + "</ol>"
        if r.get("ops_before"):
            section += picture(_ops_figure(r["ops_before"], r["ops_after"]))
        section += "".join(f"<h4>{html.escape(title)}</h4>{markup}" for title, markup in r.get("pictures", {}).items())
        body += f"<section><h2>{html.escape(r['model'])}: {html.escape(status(r))}</h2>{section}</section>"
    return page("egraph-opt onnx batch", body)


def _ops_figure(before: dict, after: dict):
    ops = sorted(set(before) | set(after))
    fig, ax = _figure(6.4, 0.3 * len(ops) + 1.2)
    for j, (counts, label) in enumerate([(before, "before"), (after, "after")]):
        ax.barh([i + (j - 0.5) * 0.4 for i in range(len(ops))], [counts.get(o, 0) for o in ops], 0.4, label=label)
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ops")
    ax.legend()
    return fig
