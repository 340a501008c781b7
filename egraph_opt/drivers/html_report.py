"""Reports a person can share: one self-contained HTML page (pictures inline as SVG or base64
PNG, no file beside it) for an optimized function's report, an Explorer, or an ONNX batch.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from .pictures import SVG, TextPicture, _figure, egraph_picture, impact_figure, program_picture
from .tables import Table

_STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}
th{background:#f3f3f3}pre{background:#f7f7f7;padding:.6em;overflow-x:auto}section{margin-bottom:3em}"""


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
    parts = [f"<pre>{html.escape(str(report))}</pre>"]
    d = report.derivation
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
    body = "".join(t._repr_html_() for t in parts)
    body += "<h4>rewrite impact</h4>" + picture(impact_figure(ex))
    body += "<h4>the e-graph</h4>" + picture(egraph_picture(ex))
    Path(path).write_text(page(f"egraph-opt explorer: {ex.name}", body), encoding="utf-8")
    return str(path)


def batch_page(records: list[dict], summary: str, interrupted: bool, status) -> str:
    """One page for an ONNX batch: the summary, then a section per model, headed by what became of
    it (``status(record)``, the summary's own word)."""
    body = f"<pre>{html.escape(summary)}</pre>" + ("<p><b>interrupted (Ctrl-C)</b></p>" if interrupted else "")
    for r in records:
        fields = [[k, v] for k, v in r.items() if not isinstance(v, (dict, list))]
        section = Table("record", ["field", "value"], fields)._repr_html_()
        if r.get("derivation"):
            section += "<h4>derivation</h4><ol>" + "".join(
                f"<li>{html.escape(s)}</li>" for s in r["derivation"]) + "</ol>"
        if r.get("ops_before"):
            section += picture(_ops_figure(r["ops_before"], r["ops_after"]))
        section += "".join(f"<h4>{html.escape(title)}</h4>{markup}"
                           for title, markup in r.get("pictures", {}).items())
        body += f"<section><h2>{html.escape(r['model'])}: {html.escape(status(r))}</h2>{section}</section>"
    return page("egraph-opt onnx batch", body)


def _ops_figure(before: dict, after: dict):
    ops = sorted(set(before) | set(after))
    fig = _figure(6.4, 0.3 * len(ops) + 1.2)
    ax = fig.add_subplot()
    for j, (counts, label) in enumerate([(before, "before"), (after, "after")]):
        ax.barh([i + (j - 0.5) * 0.4 for i in range(len(ops))], [counts.get(o, 0) for o in ops], 0.4,
                label=label)
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ops")
    ax.legend()
    return fig
