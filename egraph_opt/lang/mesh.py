"""A value spread over a mesh of n devices, and the four ops that place or move it.

A sharded program is one program that every device runs on its own part of each value (SPMD). In one process the
mesh is simulated: a value that differs between devices is a ``Local`` holding every device's part, and an op over
Locals runs once per device (``term.evaluate``). So a sharded program is its own float64 reference, and a rewrite into
sharded form is proven by the same generated tests as every other rule. On a real device (``sharding/run.py`` enters
``on_device``) the same ops split and communicate through torch.distributed instead.

- ``shard(x, axis, n)``: device r holds ``x.tensor_split(n, axis)[r]`` (x is the same on all);
- ``all_gather(x, axis, n)``: every device holds the parts concatenated along ``axis``;
- ``all_reduce(x, n)``: every device holds the sum of the parts (partial sums become the total);
- ``reduce_scatter(x, axis, n)``: device r holds part r of that sum.

A replicated value (a plain tensor) is the same on every device: gathering it concatenates n copies, all-reducing it
multiplies it by n, exactly as the collectives do on real devices."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch


class MeshError(ValueError):
    """A sharded value used where the program's placements do not allow it."""


@dataclass(frozen=True)
class Local:
    """Every device's part of one value, in one process (device r's part is ``parts[r]``)."""
    parts: tuple

    @property
    def shape(self) -> torch.Size:  # a device's shape (the first: tensor_split puts the larger first)
        return self.parts[0].shape

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype


@dataclass(frozen=True)
class Device:
    """This process's place in a real mesh: the collectives call ``comm`` (torch.distributed)."""
    rank: int
    size: int
    all_gather: Callable[[torch.Tensor, int], torch.Tensor]  # (this device's part, axis) -> whole
    all_reduce: Callable[[torch.Tensor], torch.Tensor]


_current: list[Device] = []  # the devices ``on_device`` entered, innermost last


@contextlib.contextmanager
def on_device(device: Device):
    """``with on_device(d):`` the mesh ops act as device ``d`` of a real mesh."""
    _current.append(device)
    try:
        yield device
    finally:
        _current.pop()


def each(impl: Callable, args: list, attrs: tuple) -> Local:
    """An ordinary op over sharded operands: once per device, on that device's parts."""
    if len(n := {len(a.parts) for a in args if isinstance(a, Local)}) != 1:
        raise MeshError(f"operands spread over meshes of different sizes {sorted(n)}")
    return Local(tuple(impl(*[a.parts[r] if isinstance(a, Local) else a for a in args], *attrs)
                       for r in range(n.pop())))


def _parts(x, n: int) -> tuple:
    if isinstance(x, Local):
        if len(x.parts) != n:
            raise MeshError(f"a value over {len(x.parts)} devices meets a collective over {n}")
        return x.parts
    return (x,) * n


def _device(n: int) -> Device | None:
    d = _current[-1] if _current else None
    if d is not None and d.size != n:
        raise MeshError(f"the program is sharded over {n} devices, this mesh has {d.size}")
    return d


def shard(x, axis: int, n: int):
    d = _device(n)
    if isinstance(x, Local):
        raise MeshError("shard takes a value every device holds whole, not a sharded one")
    if not -x.dim() <= axis < 0:
        raise MeshError(f"cannot shard a {x.dim()}-d value along axis {axis}")
    return x.tensor_split(n, axis)[d.rank] if d else Local(tuple(x.tensor_split(n, axis)))


def all_gather(x, axis: int, n: int):
    return d.all_gather(x, axis) if (d := _device(n)) else torch.cat(list(_parts(x, n)), axis)


def all_reduce(x, n: int):
    if d := _device(n):
        return d.all_reduce(x)
    first, *rest = _parts(x, n)
    return sum(rest, first)


def reduce_scatter(x, axis: int, n: int):
    return shard(all_reduce(x, n), axis, n)


def through_reshape(before: tuple, after: tuple) -> dict[int, tuple[int, str]]:
    """The axes a reshape from ``before`` to ``after`` keeps whole: for each axis ``a`` of the result (counted from the
    end), the operand's axis ``b`` it is and the reshape a device's part takes (``after`` with ``a`` as -1), so a split
    of the result along ``a`` is the reshape of the operand split along ``b``. Row-major: both read as (P, d, S) with
    the same P and d, which a split along d leaves alone. Nothing for an empty shape elsewhere (-1 is ambiguous)."""
    if math.prod(before) != math.prod(after):
        return {}
    prefix, kept = {}, {}
    for j, d in enumerate(before):
        prefix.setdefault((math.prod(before[:j]), d), j - len(before))
    for i, d in enumerate(after):
        if (b := prefix.get((math.prod(after[:i]), d))) is not None and math.prod(after[:i] + after[i + 1:]) > 0:
            kept[i - len(after)] = b, ",".join("-1" if k == i else str(e) for k, e in enumerate(after))
    return kept
