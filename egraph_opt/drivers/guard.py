"""The key of a plan besides the inputs' signature: the modules' ``training`` flags, which tensor
objects are the parameters and buffers (``m.weight = nn.Parameter(...)`` leaves the traced graph
holding the old one), grad mode. Values do not enter it: parameters range over their dtype in every
analysis, and folded constants are recomputed when a tensor's version changes (``torch_backend``).
Identities are re-read only after torch's registration hooks count a rebinding (microseconds per
parameter otherwise, on every call).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch.nn.modules import module as _module

_grad_enabled = torch.is_grad_enabled  # read once: the attribute lookup is a third of the call
_rebindings = [0]  # bumped whenever any module anywhere registers a parameter, buffer or submodule


def _bump(*_: Any) -> None:
    _rebindings[0] += 1


for _register in (_module.register_module_parameter_registration_hook,
                  _module.register_module_buffer_registration_hook,
                  _module.register_module_module_registration_hook):
    _register(_bump)


def holders(fn: Callable) -> tuple[list[torch.nn.Module], list[Any]]:
    """The modules, and the lists/dicts/tuples of tensors, that ``fn`` reads state from: itself,
    the object of a bound method, and what its closure and globals name."""
    found: list = [fn, getattr(fn, "__self__", None), getattr(fn, "func", None)]
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    if code is not None:
        cells = getattr(inspect.unwrap(fn), "__closure__", None) or ()
        found += [c.cell_contents for c in cells if _filled(c)]
        scope = getattr(inspect.unwrap(fn), "__globals__", {})
        found += [scope[n] for n in code.co_names if n in scope]
    modules = [m for m in found if isinstance(m, torch.nn.Module)]
    containers = [c for c in found if isinstance(c, (list, tuple, dict)) and
                  any(isinstance(v, torch.Tensor) for v in (c.values() if isinstance(c, dict) else c))]
    return list({id(m): m for m in modules}.values()), containers


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not assigned yet
        return False
    return True


_TOKENS: dict[tuple, int] = {}  # a small int per set of parameter identities ever seen


@functools.lru_cache(maxsize=None)
def reads_training(cls: type) -> bool:
    """Whether a module class's own code reads ``self.training`` (dropout, batch norm, a custom
    block): only those modules' flags can change what a traced program means. torch's Module
    base (whose train() and eval() set the flag) does not count."""
    return any("training" in getattr(getattr(f, "__code__", None), "co_names", ())
               for klass in cls.__mro__ if klass not in (torch.nn.Module, object)
               for f in vars(klass).values())


class StateKey:
    """``key()``: the part of a plan's key that the program's modules and closures determine."""

    def __init__(self, fn: Callable):
        self.modules, self.containers = holders(fn)
        self._seen = -1
        self._identities = -1
        self._flags: list[dict] = []  # the modules' __dict__s: reading them skips Module.__getattr__

    def _read_identities(self) -> None:
        subs = list({id(s): s for m in self.modules for s in m.modules()}.values())
        self._flags = [m.__dict__ for m in subs if reads_training(type(m))]
        identities = tuple(id(t) for m in subs for t in (*m._parameters.values(), *m._buffers.values()))
        self._identities = _TOKENS.setdefault(identities, len(_TOKENS))  # hashed once, not per call
        self._seen = _rebindings[0]

    def key(self) -> tuple:
        """Flat (a fixed number of flags per identities token; each container's identities a
        tuple of their own, so no two fillings of the containers share a key)."""
        if self._seen != _rebindings[0]:
            self._read_identities()
        key = [self._identities, _grad_enabled()]
        for flags in self._flags:
            key.append(flags["training"])
        for c in self.containers:
            key.append(tuple([id(v) for v in (c.values() if isinstance(c, dict) else c)]))
        return tuple(key)
