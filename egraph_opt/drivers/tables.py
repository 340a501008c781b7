"""A table that reads well in both places people look at results: an HTML table in Jupyter
(``_repr_html_``) and aligned columns in a terminal (``str``).

>>> print(Table("costs", ["program", "cost"], [["naive", 12], ["fused", 3]]))
costs
program  cost
-------  ----
naive    12
fused    3
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
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
