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
import operator
import types
from typing import Any, Callable

import torch
from torch.nn.modules import module as _module

_grad_enabled = torch.is_grad_enabled  # read once: the attribute lookup is a third of the call
_default_dtype = torch.get_default_dtype  # the dtype of the tensors a program makes (torch.arange(4.0))
_rebindings = [0]  # bumped whenever any module anywhere registers a parameter, buffer or submodule


def _bump(*_: Any) -> None:
    _rebindings[0] += 1


for _register in (_module.register_module_parameter_registration_hook,
                  _module.register_module_buffer_registration_hook,
                  _module.register_module_module_registration_hook):
    _register(_bump)


#: values a trace bakes into the program as constants (a tuple of them too)
_SCALARS = (bool, int, float, complex, str, type(None))


def _scalar(value: Any) -> bool:
    return type(value) in _SCALARS or type(value) is tuple and all(type(v) in _SCALARS for v in value)


def holders(fn: Callable) -> tuple[list[torch.nn.Module], list[Any], list[tuple[Any, str | None]]]:
    """The modules, the lists/dicts/tuples of tensors, and the Python scalars (a global's scope
    and name; a closure cell and None) that ``fn`` reads state from: itself, the object of a bound
    method, what its closure and globals name, and so on through the Python functions those are
    (a helper's own globals: a trace reads them all, and bakes scalars in as constants)."""
    found: list = [fn, getattr(fn, "__self__", None), getattr(fn, "func", None)]
    scalars: list[tuple[Any, str | None]] = []
    seen: set[int] = set()
    read: set[str] = set()  # every name the code reads: a global's, or an attribute's (cfg.scale)
    for f in found:
        code = getattr(inspect.unwrap(f), "__code__", None) if callable(f) and id(f) not in seen else None
        if code is None or (getattr(f, "__module__", None) or "").startswith("torch"):
            continue
        seen.add(id(f))
        read.update(code.co_names)
        cells = getattr(inspect.unwrap(f), "__closure__", None) or ()
        for cell in filter(_filled, cells):
            (scalars.append((cell, None)) if _scalar(cell.cell_contents) else found.append(cell.cell_contents))
        scope = getattr(inspect.unwrap(f), "__globals__", {})
        for name in code.co_names:
            if name in scope:
                (scalars.append((scope, name)) if _scalar(scope[name]) else found.append(scope[name]))
    modules = [m for m in found if isinstance(m, torch.nn.Module)]
    containers = [c for c in found if isinstance(c, (list, tuple, dict)) and
                  any(isinstance(v, torch.Tensor) for v in (c.values() if isinstance(c, dict) else c))]
    for o in {id(o): o for o in found if _plain(o)}.values():  # a config object, a Python module
        scalars += [(vars(o), n) for n in sorted(read) if n in vars(o) and _scalar(vars(o)[n])]
    return list({id(m): m for m in modules}.values()), containers, scalars


def _plain(o: Any) -> bool:
    """An object whose attributes code reads as numbers (``cfg.scale``, ``math.pi``): not an
    nn.Module (read on its own), a tensor, a class or a function (whose attributes are not what a
    program computes with)."""
    return isinstance(getattr(o, "__dict__", None), dict) and not isinstance(
        o, (torch.nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType, functools.partial))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not assigned yet
        return False
    return True


_ABSENT = object()  # the value of an attribute deleted since it was read


def _readers(pairs) -> list[tuple[dict, tuple[str, ...], Callable]]:
    """(dict, names) pairs grouped per dict: each dict, its names, and one itemgetter of them (a
    key reads every scalar of a dict in one C call)."""
    grouped: dict[int, tuple[dict, set[str]]] = {}
    for where, name in pairs:
        grouped.setdefault(id(where), (where, set()))[1].add(name)
    return [(where, tuple(sorted(names)), operator.itemgetter(*sorted(names)))
            for where, names in grouped.values()]


_TOKENS: dict[tuple, int] = {}  # a small int per set of parameter identities ever seen


@functools.lru_cache(maxsize=None)
def names_read(cls: type) -> frozenset[str]:
    """The attribute and global names a module class's own code reads (``self.training`` in
    dropout or batch norm, ``self.eps``, ``self.scale`` of a custom block): only those attributes'
    values can change what a traced program means. torch's Module base (whose train() and eval()
    set the flag) does not count."""
    return frozenset(name for klass in cls.__mro__ if klass not in (torch.nn.Module, object)
                     for method, f in vars(klass).items() if method not in _NOT_RUN
                     for name in getattr(getattr(f, "__code__", None), "co_names", ()))


#: methods a forward never runs: what they read (a Linear's in_features) is no constant of a trace
_NOT_RUN = frozenset({"__init__", "__repr__", "__setstate__", "__getstate__", "extra_repr",
                      "reset_parameters", "_reset_parameters"})


class StateKey:
    """``key()``: the part of a plan's key that the program's modules and closures determine."""

    def __init__(self, fn: Callable):
        self.modules, self.containers, scalars = holders(fn)
        self._cells = [cell for cell, name in scalars if name is None]
        self._globals = [(where, name) for where, name in scalars if name is not None]  # a scope, a config object's
        self._seen = -1
        self._identities = -1
        self._reads: list[tuple[dict, tuple[str, ...], Callable]] = []  # _readers: training, eps, a global
        self._getters: list[Callable] = []  # theirs, and their dicts, as map() takes them
        self._dicts: list[dict] = []

    def _read_identities(self) -> None:
        subs = list({id(s): s for m in self.modules for s in m.modules()}.values())
        pairs = list(self._globals)
        for m in subs:
            names = names_read(type(m))
            for o in [m] + [v for n, v in m.__dict__.items() if n in names and _plain(v)]:  # a config it holds
                pairs += [(o.__dict__, n) for n in names if n in o.__dict__ and _scalar(o.__dict__[n])]
        self._reads = _readers(pairs)  # from __dict__: no Module.__getattr__
        self._getters, self._dicts = [g for _, _, g in self._reads], [d for d, _, _ in self._reads]
        identities = tuple(id(t) for m in subs for t in (*m._parameters.values(), *m._buffers.values()))
        self._identities = _TOKENS.setdefault(identities, len(_TOKENS))  # hashed once, not per call
        self._seen = _rebindings[0]

    def key(self) -> tuple:
        """Flat (a fixed number of values per identities token; each container's identities a
        tuple of their own, so no two fillings of the containers share a key). A scalar set to
        something else enters as that value (a caller's plan lookup refuses an unhashable one)."""
        if self._seen != _rebindings[0]:
            self._read_identities()
        key = [self._identities, _grad_enabled(), _default_dtype()]
        try:
            key += list(map(operator.call, self._getters, self._dicts))  # the loop in C
        except KeyError:  # an attribute or global deleted since: its absence is the value
            key += [tuple(d.get(n, _ABSENT) for n in names) for d, names, _ in self._reads]
        for cell in self._cells:
            key.append(cell.cell_contents)
        for c in self.containers:
            key.append(tuple([id(v) for v in (c.values() if isinstance(c, dict) else c)]))
        return tuple(key)
