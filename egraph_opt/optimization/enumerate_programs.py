"""The alternative programs of an optimized program's outputs, priced exactly as ``optimize``
priced its extraction (../shared/DESIGN.md, principle 6): for profiling every path and for
notebooks."""
from __future__ import annotations

from typing import Iterator

from ..extractors.enumerate import Alternative, alternatives
from .pipeline import Optimized


def alternatives_of(optimized: Optimized, root_index: int = 0, limit: int | None = 10
                    ) -> Iterator[Alternative]:
    """Programs of root ``root_index`` (in the order of the original program's ``roots()``:
    outputs, then operands of opaque calls), cheapest first as ``extractors.enumerate``
    guarantees, with the cost model and e-class shapes the extraction used. For a program whose
    repeated blocks were templates, these are the programs around the blocks (blocks as leaves);
    ``optimize(program, templates=False)`` enumerates the whole program."""
    if optimized.cost is None or not optimized.root_classes:
        raise ValueError("this result carries no extraction state to enumerate")
    snap = optimized.egraph.snapshot()
    return alternatives(snap.classes, optimized.root_classes[root_index], optimized.cost,
                        limit=limit)
