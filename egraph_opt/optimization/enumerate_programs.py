"""The alternative programs of an optimized program's outputs, priced as its extraction was."""
from __future__ import annotations

from typing import Iterator

from ..extractors.enumerate import Alternative, alternatives
from .pipeline import Optimized


def alternatives_of(optimized: Optimized, root_index: int = 0, limit: int | None = 10
                    ) -> Iterator[Alternative]:
    """Programs of root ``root_index`` (of the original's ``roots()``), cheapest first. Where blocks
    were templates, the programs around them (blocks as leaves): ``templates=False`` gives all."""
    if optimized.cost is None or not optimized.root_classes:
        raise ValueError("this result carries no extraction state to enumerate")
    snap = optimized.egraph.snapshot()
    return alternatives(snap.classes, optimized.root_classes[root_index], optimized.cost,
                        limit=limit)
