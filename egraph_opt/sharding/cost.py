"""What a sharded program costs on one device of the mesh, in the latency database's units.

Every device runs the same program on its own parts at once, so a program's time sums one device's time for each op:
compute from the database at one device's shapes, communication by an alpha-beta model (``Link``) per collective, and a
copy to split a value every device computed. Memory per device (``memory``) is a constraint, not a price."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..analysis.facts import Facts, class_constants
from ..extractors.cost import CostModel, Objective
from ..lang.ops import OPS, parse_shape
from ..lang.term import postorder
from ..profiling.latency import UNIT_S, MeasuredLatency
from ..profiling.profile_db import default_path

COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter")
COPY_S_PER_BYTE = 1e-10  # a local copy at ~10 GB/s: splitting a value every device computed
INFEASIBLE = 10 ** 15  # an uneven split, or an op whose shapes are unknown: never chosen


@dataclass(frozen=True)
class Link:
    """Seconds of one collective moving ``bytes`` (a device's result) over 2 devices: ``alpha_s + bytes * beta_s``; over
    n a ring takes n - 1 steps of 1/n of the bytes, twice for an all-reduce: (n - 1) steps and 2 (n - 1) / n bytes."""
    alpha_s: float
    beta_s: float  # seconds per byte

    def seconds(self, nbytes: int, n: int) -> float:
        return self.alpha_s * (n - 1) + self.beta_s * nbytes * 2 * (n - 1) / n


#: gloo over loopback, 2 processes, as ``egraph-opt profile --collectives`` fits them (reduce_scatter
#: runs as an all-reduce kept in part: gloo has none on CPU)
DEFAULT_LINKS = {"all_gather": Link(alpha_s=394e-6, beta_s=0.93e-9),
                 "all_reduce": Link(alpha_s=418e-6, beta_s=1.14e-9),
                 "reduce_scatter": Link(alpha_s=441e-6, beta_s=1.79e-9)}


def links_path(db=None) -> Path:
    """collectives.json, beside the latency database ``db`` (default: the user's)."""
    return (Path(db).expanduser() if db else default_path()).with_name("collectives.json")


def measured_links(db=None) -> dict[str, Link]:
    """The links ``egraph-opt profile --collectives`` wrote beside ``db``, else the defaults."""
    if not (path := links_path(db)).exists():
        return dict(DEFAULT_LINKS)
    try:
        return {**DEFAULT_LINKS, **{k: Link(**v) for k, v in json.loads(path.read_text()).items() if k in COLLECTIVES}}
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a collectives file written by egraph-opt profile ({e})") from None


def save_links(links: dict[str, Link], db=None) -> Path:
    path = links_path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")  # whole or not at all
    staging.write_text(json.dumps({k: asdict(v) for k, v in links.items()}, indent=1))
    os.replace(staging, path)
    return path


def nbytes(meta: tuple) -> int:
    return math.prod(meta[0]) * meta[1].itemsize  # meta: (shape, dtype)


@dataclass
class MeshCost:
    """``cost(class, e-node)`` for extraction: one device's time for the e-node, in UNIT_S."""
    n: int
    meta: dict  # e-class -> (a device's shape, dtype)
    classes: dict  # e-class -> e-nodes
    latency: MeasuredLatency | None = None
    links: dict | None = None

    def __post_init__(self):
        self.links, self.model = self.links or measured_links(), CostModel(Objective.LATENCY, latency_of=self.latency)
        self.facts = Facts(self.meta, scalars=class_constants(self.classes))
        self.placed = {c for c, nodes in self.classes.items() if any(n.op in ("input", "param") for n in nodes)}

    def __call__(self, cid: str, node) -> int:
        if OPS[node.op].is_leaf:
            return 0
        if cid not in self.meta or any(c not in self.meta for c in node.children):
            return INFEASIBLE
        if node.op == "shard":
            full, axis = self.meta[node.children[0]][0], node.attrs[0]
            if len(full) < -axis or full[axis] % self.n:
                return INFEASIBLE  # parts of unequal size: gloo's collectives need equal ones
            return 0 if node.children[0] in self.placed else self._units(nbytes(self.meta[cid]) * COPY_S_PER_BYTE)
        if node.op in COLLECTIVES:
            moved = self.meta[cid] if node.op == "all_gather" else self.meta[node.children[0]]
            return self._units(self.links[node.op].seconds(nbytes(moved), self.n))
        return max(1, self.model.latency(self.facts(node.op, node.attrs, node.children, cid)))

    @staticmethod
    def _units(seconds: float) -> int:
        return max(1, round(seconds / UNIT_S))


def memory(terms, meta_of) -> int:
    """Bytes one device holds: the inputs and weights it reads (only its part where it reads only
    a part) and the largest value it computes. ``meta_of(term)``: (a device's shape, dtype)."""
    order, leaves = postorder(terms), ("input", "param")
    whole, held, largest = {a.attrs[0] for t in order if t.op != "shard" for a in t.args if a.op in leaves}, {}, 0
    for t in order:
        if t.op in leaves and t.attrs[0] in whole:
            held[t.attrs[0]] = nbytes((parse_shape(t.attrs[1]), meta_of(t)[1]))
        elif t.op == "shard" and t.args[0].op in leaves:
            if t.args[0].attrs[0] not in whole:
                held[t.args[0].attrs[0]] = held.get(t.args[0].attrs[0], 0) + nbytes(meta_of(t))
        elif t.args:
            largest = max(largest, nbytes(meta_of(t)))
    return sum(held.values()) + largest


def fit_links(timings: list[tuple], n: int = 2) -> dict[str, Link]:
    """alpha and beta per collective from (collective, bytes, seconds) timings on ``n`` devices, fitted in
    relative error (a small message's time matters as a large one's), scaled to ``Link``'s 2-device form."""
    out = {}
    for name in COLLECTIVES:
        if len(rows := [(b, s) for c, b, s in timings if c == name and s > 0]) < 2:
            continue
        terms = np.array([(1 / s, b / s) for b, s in rows])  # (alpha + beta b) / s should be 1
        alpha, beta = map(float, np.linalg.lstsq(terms, np.ones(len(rows)), rcond=None)[0])
        if alpha < 0 or beta < 0:  # one term explains it: the other is 0
            alone = terms[:, int(alpha < 0)]
            best = float(alone.sum() / (alone @ alone))
            alpha, beta = (0.0, best) if alpha < 0 else (best, 0.0)
        out[name] = Link(alpha_s=alpha / (n - 1), beta_s=beta * n / (2 * (n - 1)))
    return out
