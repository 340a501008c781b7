"""What the optimizer's own runs of a program (tracing, validation, timing) do to Python state.

A program that writes Python state (``self.calls += 1``, a global, ``self.seen.append(...)``, a
print or a log record) cannot be a plan: the plan runs tensor code alone, so eager's effects would
be lost, and a trace runs the code once on tracer objects, which would be left in that state. A
``Watch`` records the state reachable from the program before it is optimized, and afterwards
names what changed and puts it back, so the original, run untouched, does what eager does.
"""
from __future__ import annotations

import builtins
import dis
import functools
import logging
import sys
import threading
import types
from typing import Any, Callable

import torch

#: objects walked at most from one program (a Hugging Face model reaches a few thousand)
LIMIT = 50_000
_EMPTY = object()  # an empty closure cell
_local = threading.local()  # the watches of this thread (prints and log records of other threads pass)


def codes(code: types.CodeType):
    """``code`` and the code of the functions defined inside it."""
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)


@functools.lru_cache(maxsize=4096)  # disassembly cost more than a decode step: once per code object
def _globals_read(code: types.CodeType) -> frozenset[str]:
    """The global names ``code`` (or a function inside it) loads or stores: not every name it
    holds, which counts ``self.model``'s attribute as the module's global ``model`` too."""
    return frozenset({i.argval for c in codes(code) for i in dis.get_instructions(c)
            if i.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME")})


def _library(module: str | None) -> bool:
    """Code and objects of Python, torch, numpy or egraph-opt itself (an optimized method's plans):
    not the program's state, and never walked (nn.Modules are, torch's own included)."""
    top = (module or "builtins").split(".")[0]
    return top in sys.stdlib_module_names or top in ("torch", "numpy", "egraph_opt", "builtins")


class Watch:
    """``with Watch(fn) as w:`` ... ``w.changes()``: what the runs inside changed (``"sets
    self.calls"``, ``"prints"``); leaving the block puts every changed value back."""

    def __init__(self, fn: Callable):
        self.fn, self.effects, self.records = fn, [], []  # records: (logger, record) held back
        self._saved: list[tuple[str, Any, Any]] = []  # (name, holder, copy of its contents)

    def __enter__(self) -> Watch:
        self._saved = list(_walk(self.fn))
        # a watched thread's prints and log records are held back as effects; other threads' pass
        builtins.print = _print
        logging.Logger.handle = _handle
        _watches().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _watches().remove(self)
        for name, holder, saved in self._saved:
            if _differs(holder, saved):
                _restore(holder, saved)

    def changes(self) -> list[str]:
        """What changed so far: state written (by name), then prints and log records."""
        return [f"{'writes' if isinstance(h, (list, set)) else 'sets'} {_what(n, h, s)}"
                for n, h, s in self._saved if _differs(h, s)] + self.effects

    def logs_once(self, rerun: Callable[[], Any]) -> bool:
        """Whether the only effects so far are log records that running the program again does
        not log (``logger.warning_once``, a deprecation notice): then they reach their handlers
        now, as eager's first call's would, and a plan loses nothing of eager's effects."""
        if not self.records or len(self.changes()) != len(self.effects) or \
                any(not e.startswith("logs") for e in self.effects):
            return False
        with Watch(self.fn) as again:
            rerun()
        if again.changes():
            return False
        for logger, record in self.records:
            _ORIGINAL_HANDLE(logger, record)
        self.effects, self.records = [], []
        return True


def _watches() -> list[Watch]:
    if not hasattr(_local, "watches"):
        _local.watches = []
    return _local.watches


def _walk(fn: Callable):
    """(name, holder, copy) of every container the program can reach: modules' and objects'
    attribute dicts, the classes of the program's own code, closure cells, the globals its code
    names (of any function reached), lists, dicts and sets."""
    names: set[str] = set()
    todo, seen = [("self" if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", "fn"), fn)], set()
    while todo and len(seen) < LIMIT:
        name, o = todo.pop()
        if id(o) in seen or isinstance(o, (torch.Tensor, str, bytes, int, float, complex, bool, type(None))):
            continue
        seen.add(id(o))
        if isinstance(o, types.MethodType):
            todo += [(name, o.__func__), (name.rsplit(".", 1)[0] if "." in name else "self", o.__self__)]
        elif isinstance(o, functools.partial):
            todo += [(name, o.func), *((f"{name} argument", a) for a in (*o.args, *o.keywords.values()))]
        elif isinstance(o, types.FunctionType):
            if _library(o.__module__):
                continue
            for code in codes(o.__code__):
                names.update(code.co_names)
            for var, cell in zip(o.__code__.co_freevars, o.__closure__ or ()):
                yield f"{var}", cell, _copy(cell)
                todo.append((var, _copy(cell)))
            yield f"{name}.__defaults__", o, _copy(o)
            todo += [(f"{name} default", d) for d in (*(o.__defaults__ or ()), *(o.__kwdefaults__ or {}).values())]
            scope = {k: o.__globals__[k] for k in sorted(_globals_read(o.__code__) & o.__globals__.keys())}
            yield "global", o.__globals__, scope
            todo += [(f"global {k}", v) for k, v in scope.items()]
        elif isinstance(o, types.ModuleType):
            if _library(o.__name__):
                continue
            attributes = {k: v for k, v in vars(o).items() if k in names}
            yield f"{o.__name__}.__dict__", vars(o), attributes
            todo += [(f"{o.__name__}.{k}", v) for k, v in attributes.items()]
        elif isinstance(o, type):
            if _library(o.__module__):
                continue
            yield o.__qualname__, o, dict(vars(o))
            todo += [(f"{o.__qualname__}.{k}", v) for k, v in vars(o).items()
                     if not k.startswith("__") or k == "__call__"]
        elif isinstance(o, (list, dict, set)):
            yield name, o, _copy(o)
            items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ((None, v) for v in o)
            todo += [(f"{name}[{k!r}]" if k is not None else f"an item of {name}", v) for k, v in items]
        elif isinstance(getattr(o, "__dict__", None), dict) and (
                isinstance(o, torch.nn.Module) or not _library(getattr(type(o), "__module__", None))):
            yield f"{name}.__dict__", vars(o), dict(vars(o))
            todo += [(f"{name}.{k}", v) for k, v in vars(o).items()]
            todo.append((name, type(o)))


def _copy(o: Any) -> Any:
    if isinstance(o, types.CellType):
        try:
            return o.cell_contents
        except ValueError:
            return _EMPTY
    if isinstance(o, types.FunctionType):
        return o.__defaults__, o.__kwdefaults__
    if isinstance(o, type):
        return dict(vars(o))
    return dict(o) if isinstance(o, dict) else list(o)


def _differs(holder: Any, saved: Any) -> bool:
    if isinstance(holder, types.CellType):
        return not _same(_copy(holder), saved)
    if isinstance(holder, types.FunctionType):
        return any(a is not b for a, b in zip(_copy(holder), saved))
    if isinstance(holder, (dict, type)):
        return bool(_changed_keys(_copy(holder), saved, _scope(holder)))
    if isinstance(holder, set):
        return {id(v) for v in holder} != {id(v) for v in saved}
    return len(holder) != len(saved) or not all(map(_same, holder, saved))


def _scope(holder: Any) -> bool:
    """A scope of which only some names are watched (a module's globals)."""
    return isinstance(holder, dict) and "__builtins__" in holder


def _changed_keys(now: dict, saved: dict, partial: bool) -> list:
    keys = saved.keys() if partial else saved.keys() | now.keys()
    return sorted((k for k in keys if not _same(now.get(k, _EMPTY), saved.get(k, _EMPTY))), key=str)


def _same(a: Any, b: Any) -> bool:
    """The same object, or equal plain values (torch.export rebinds a LayerNorm's
    ``normalized_shape`` to an equal tuple)."""
    return a is b or _plain(a) and _plain(b) and type(a) is type(b) and a == b


def _plain(x: Any) -> bool:
    if isinstance(x, (tuple, list)):
        return all(map(_plain, x))
    if isinstance(x, dict):
        return all(map(_plain, (*x, *x.values())))
    return type(x) in (bool, int, float, complex, str, bytes, type(None))


def _what(name: str, holder: Any, saved: Any) -> str:
    """``self.calls``, ``global counter``, ``Counter.n``, ``self.seen``, ``self.cache (keys 'a')``."""
    if not isinstance(holder, (dict, type)):
        return name
    keys = _changed_keys(_copy(holder), saved, _scope(holder))[:3]
    if _scope(holder):
        return ", ".join(f"global {k}" for k in keys)
    if isinstance(holder, type) or name.endswith(".__dict__"):
        where = holder.__qualname__ if isinstance(holder, type) else name.removesuffix(".__dict__")
        return ", ".join(f"{where}.{k}" for k in keys)
    return f"{name} (keys {', '.join(map(repr, keys))})"


def _restore(holder: Any, saved: Any) -> None:
    if isinstance(holder, types.CellType):
        if saved is _EMPTY:
            del holder.cell_contents
        else:
            holder.cell_contents = saved
    elif isinstance(holder, types.FunctionType):
        holder.__defaults__, holder.__kwdefaults__ = saved
    elif isinstance(holder, (dict, type)):  # a dict subclass's own methods may do more than store
        put, drop = (setattr, delattr) if isinstance(holder, type) else (dict.__setitem__, dict.__delitem__)
        for k in _changed_keys(_copy(holder), saved, _scope(holder)):
            put(holder, k, saved[k]) if k in saved else drop(holder, k)
    elif isinstance(holder, set):
        holder.clear()
        holder.update(saved)
    else:
        holder[:] = saved


_ORIGINAL_PRINT = builtins.print
_ORIGINAL_HANDLE = logging.Logger.handle


def _print(*args, **kwargs):
    watches = getattr(_local, "watches", None)
    if not watches:
        return _ORIGINAL_PRINT(*args, **kwargs)
    if "prints" not in watches[-1].effects:
        watches[-1].effects.append("prints")


def _handle(self, record):
    watches = getattr(_local, "watches", None)
    if not watches or record.name.startswith(("torch", "egraph_opt")):
        return _ORIGINAL_HANDLE(self, record)
    what = f"logs to {record.name!r}"
    watches[-1].records.append((self, record))
    if what not in watches[-1].effects:
        watches[-1].effects.append(what)
