"""The plan key besides the inputs' signature: grad mode, the default dtype and what the program's code reads
(``holders``, ``_generated_key``). Tensors' values do not enter it: parameters range over their dtype in every
analysis, and folded constants are recomputed when a tensor's version changes (``torch_backend``); which tensor
objects are the parameters does (``m.weight = nn.Parameter(...)`` leaves the traced graph holding the old one).

What the optimizer's own runs of a program (tracing, validation, timing) write of state (``self.calls += 1``, a global,
``self.seen.append(...)``, a buffer written in place, a print, a log record) is the other side: the plan runs tensor code
alone, so eager's effects would be lost, and a trace leaves tracers behind. A ``Watch`` first records the state reachable
from the program, then names what changed and puts it back: the original, run untouched, does what eager does."""
from __future__ import annotations

import builtins
import contextlib
import dis
import functools
import inspect
import itertools
import logging
import pickle
import random
import sys
import threading
import types
import weakref
from typing import Any, Callable, NamedTuple

import torch
from torch._C._dynamo.guards import dict_version  # a dict's version: a new one whenever it changes
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

_grad_enabled = torch.is_grad_enabled  # read once: the attribute lookup is a third of the call
_default_dtype = torch.get_default_dtype  # the dtype of the tensors a program makes (torch.arange(4.0))
_rebindings = [0]  # bumped whenever a module some key reads registers a parameter, buffer or submodule
_watched: weakref.WeakSet = weakref.WeakSet()  # those modules (a forward that slices a ModuleList
# builds a new one per call, registering into it: no key reads that one)


def _bump(module: torch.nn.Module, name: str, value: Any) -> None:
    if module in _watched and not any(table.get(name, _bump) is value for table in (  # not the object already there:
            module._parameters, module._buffers, module._modules)):  # CTRL's x = x.to(dtype) on every call
        _rebindings[0] += 1


for _register in (_module.register_module_parameter_registration_hook, _module.register_module_buffer_registration_hook,
                  _module.register_module_module_registration_hook):
    _register(_bump)

_GLOBAL_HOOKS = (_module._global_forward_hooks, _module._global_forward_pre_hooks,
                 _module._global_backward_hooks, _module._global_backward_pre_hooks)
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def around(fn: Callable) -> list[str]:
    """Hooks that run around the whole call, which a plan (the traced forward) would skip: the module's own, and
    global module hooks (torch's FlopCounterMode registers some), which run around every module call."""
    own = [f"{type(fn).__name__}.{h[1:]}" for h in _HOOKS if getattr(fn, h, None) and isinstance(fn, torch.nn.Module)]
    return own + ["global module hooks"] * any(_GLOBAL_HOOKS)


#: values a trace bakes into the program as constants (a tuple of them too)
_SCALARS = (bool, int, float, complex, str, type(None))


def _scalar(value: Any) -> bool:
    return type(value) in _SCALARS or type(value) is tuple and all(type(v) in _SCALARS for v in value)


#: where a value is read: ``holder[name]`` (a scope, an attribute dict, a defaults tuple) or, with ``attribute`` set,
#: ``holder.name`` (a closure cell's contents, a function's defaults, a class's attribute)
Slot = tuple[Any, Any, bool]


class Reads(NamedTuple):
    """What a program reads state from."""
    modules: list[torch.nn.Module]
    containers: list  # lists, dicts and tuples of tensors (keyed by their items' identities)
    scalars: list[Slot]  # slots holding a Python number, string or None (keyed by value)
    objects: list[Slot]  # slots holding anything else (keyed by identity)
    contents: list[Slot]  # those of ``objects`` holding a small list or dict of numbers (read whole)
    shadows: list[tuple[dict, str]]  # an instance's dict and a class attribute's name read off it


def holders(fn: Callable) -> Reads:
    """What ``fn`` reads state from: itself, the object of a bound method, what its closure, defaults and globals name,
    and so on through the Python functions those are (a trace bakes in the scalars and tensors a helper reads)."""
    found: list = [fn, getattr(fn, "__self__", None), getattr(fn, "func", None)]
    reads = Reads([], [], [], [], [], [])
    seen, read = set(), set()  # read: every name the code reads, a global's or an attribute's (cfg.scale)
    def slot(holder: Any, name: Any, attribute: bool = False) -> None:
        value = _read((holder, name, attribute))
        (reads.scalars if _scalar(value) else reads.objects).append((holder, name, attribute))
        if _numbers(value):
            reads.contents.append((holder, name, attribute))
        found.append(value)
    for f in found:
        if isinstance(f, torch.nn.Module) and id(f) not in seen:  # its modules' forwards read globals too
            seen.add(id(f))
            found.extend({type(m).forward: None for m in f.modules()})
        code = getattr(inspect.unwrap(f), "__code__", None) if callable(f) and id(f) not in seen else None
        if code is None or (getattr(f, "__module__", None) or "").startswith("torch"):
            continue
        seen.add(id(f))
        read.update(code.co_names)
        inner = inspect.unwrap(f)
        for cell in getattr(inner, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # a cell not assigned yet
                slot(cell, "cell_contents", True)
        for where in ("__defaults__", "__kwdefaults__"):  # reassignable, as a tuple or dict
            if (defaults := getattr(inner, where, None)) is not None:
                reads.objects.append((inner, where, True))
                reads.objects.extend((defaults, i, False) for i, v in
                            (defaults.items() if isinstance(defaults, dict) else enumerate(defaults))
                            if isinstance(v, torch.Tensor))
        scope = getattr(inner, "__globals__", {})
        for name in code.co_names:
            if name in scope:
                slot(scope, name)
    reads.modules.extend({id(m): m for m in found if isinstance(m, torch.nn.Module)}.values())
    reads.containers.extend(c for c in found if isinstance(c, (list, tuple, dict)) and
                            any(isinstance(v, torch.Tensor) for v in (c.values() if isinstance(c, dict) else c)))
    _attributes([o for o in found if _plain(o) or _user_class(o)], read, reads)  # cfg.scale, math.pi, Config.SCALE
    return reads


def _attributes(roots: list, names: set[str] | frozenset[str], reads: Reads) -> None:
    """Into ``reads``, the attributes code reads by ``names`` off ``roots`` (a module, a config, a class) and the plain
    objects they hold: scalars, objects by identity (a Python module's tensors only), small lists and dicts by contents.
    One its class holds is read off the class, and ``reads.shadows`` gets the instance's dict and the name."""
    todo, seen = list(roots), set()
    while todo:
        if id(o := todo.pop()) in seen:
            continue
        seen.add(id(o))
        attributes = {} if isinstance(o, type) else vars(o)
        found = [(attributes, n, False) for n in sorted(names & attributes.keys())]
        if not isinstance(o, types.ModuleType):
            for n in sorted(names - attributes.keys()):
                klass = next((k for k in _classes(o) if n in vars(k)), None)
                if klass is not None and (_scalar(vars(klass)[n]) or isinstance(vars(klass)[n], torch.Tensor)
                                          or _numbers(vars(klass)[n])):
                    found.append((klass, n, True))
                    if not isinstance(o, type):
                        reads.shadows.append((attributes, n))
        for slot in found:
            if _scalar(value := _read(slot)):
                reads.scalars.append(slot)
            elif isinstance(value, torch.Tensor) or not isinstance(o, types.ModuleType):  # cfg.w, cfg.act
                reads.objects.append(slot)
                if _plain(value) or _user_class(value):
                    todo.append(value)
                elif _numbers(value):
                    reads.contents.append(slot)


def _classes(o: Any) -> list[type]:
    """The classes an attribute of ``o`` may come from, before torch's Module and object."""
    return [k for k in (o.__mro__ if isinstance(o, type) else type(o).__mro__) if k not in (torch.nn.Module, object)]


def _user_class(o: Any) -> bool:
    """A class of the program's own (not torch's or Python's): its class attributes are state."""
    return isinstance(o, type) and not (o.__module__ or "").startswith(("torch", "builtins"))


def _numbers(value: Any) -> bool:
    """A small list or dict of scalars, read whole each call (``CFG["scale"]``: written in place, same identity)."""
    return type(value) is list and len(value) <= 64 and all(map(_scalar, value)) or \
        type(value) is dict and len(value) <= 64 and all(map(_scalar, (*value, *value.values())))


def _plain(o: Any) -> bool:
    """An object whose attributes code reads as numbers (``cfg.scale``, ``math.pi``): not an nn.Module (read on its
    own), a tensor, a class or a function (whose attributes are not what a program computes with)."""
    return isinstance(getattr(o, "__dict__", None), dict) and not isinstance(
        o, (torch.nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType, functools.partial))


WALKS = 4096  # the walks remembered: a hook registered anew on every call walks anew
_TOKENS: dict[tuple, int] = {}  # an int per walk (parameter and object identities, slots, hooks)
_NEXT = itertools.count()  # never one int for two walks, even after one was forgotten (then a plan is missed)


def _token(walked: tuple) -> int:
    if (token := _TOKENS.get(walked)) is None:
        while len(_TOKENS) >= WALKS:
            del _TOKENS[next(iter(_TOKENS))]
        token = _TOKENS[walked] = next(_NEXT)
    return token


@functools.lru_cache(maxsize=None)
def names_read(cls: type) -> frozenset[str]:
    """The attribute and global names the code a module class's forward runs reads: its forward and the methods and
    properties it names, transitively (``self.training``, ``self.eps``): only those attributes' values can change what
    a traced program means (not those of methods a forward never runs, such as a Hugging Face model's ``generate``)."""
    members = {k: v for klass in reversed(_classes(cls)) for k, v in vars(klass).items()}  # a subclass's win
    names, todo = set(), ["forward"]
    while todo:
        member = members.get(todo.pop())
        for f in (member.fget, member.fset) if isinstance(member, property) else (member,):
            wrapped = [f]  # a decorated forward: the wrappers' code and the function's
            while hasattr(wrapped[-1], "__wrapped__"):
                wrapped.append(wrapped[-1].__wrapped__)
            for c in (c for w in wrapped if hasattr(w, "__code__") for c in codes(w.__code__)):
                todo += [n for n in c.co_names if n not in names and n in members]
                names.update(c.co_names)
    return frozenset(names)


class StateKey:
    """``key()``: the part of a plan's key that the program's modules and closures determine. It runs on every call,
    as one generated expression (as torch.compile's guards): the walks run only when something was rebound."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._held: set[int] = set()  # tensors a plan's graph holds itself: it sees their writes
        self._pinned: dict[tuple, list] = {}  # the objects a plan's key names by identity
        self._written: set[tuple[int, Any]] = set()  # slots the program's own run rebinds
        self.current: Callable[[], tuple | None] = lambda: None  # walked at the first key (a copy's fn is half-made)
        self._slots, self._read_whole = [], []

    def _refresh(self) -> None:
        """Walk ``fn`` again (an object slot holds something else now: a rebound global, cell,
        default or attribute, whose modules, containers and scalars are the ones read now)."""
        self._found = holders(self.fn)
        self.modules, self.containers = self._found.modules, self._found.containers
        self._read_identities()

    def _read_identities(self) -> None:
        subs = list({id(s): s for m in self.modules for s in m.modules()}.values())
        _watched.update(subs)
        reads = Reads(*map(list, self._found))  # a copy, which the modules' attributes join
        for m in subs:  # from __dict__: no Module.__getattr__
            _attributes([m], names_read(type(m)), reads)
        scalars, objects, contents = (list({(id(o[0]), o[1]): o for o in slots  # a class's once
                                            if (id(o[0]), o[1]) not in self._written}.values())
                                      for slots in (reads.scalars, reads.objects, reads.contents))
        self._slots, self._read_whole = scalars + objects, contents
        identities = tuple(id(t) for m in subs for t in (*m._parameters.values(), *m._buffers.values()))
        self._values = [_read(o) for o in objects]
        ids = tuple(map(id, self._values))
        # a tensor the trace only computed from (W * 2 at trace time) is baked in: its writes count
        versioned = [o for o, v in zip(objects, self._values) if isinstance(v, torch.Tensor)
                     and not v.is_inference() and id(v) not in self._held]
        tables = [(t, n, False) for m in subs for t in (m._parameters, m._buffers) for n in t]  # put in directly (by
        objects, self._values = objects + tables, self._values + [_read(o) for o in tables]  # torch.func.functional_call)
        # hooks run inside a trace: registered anywhere (a new handle id), or removed from one here
        hooks = [d for m in subs for d in map(vars(m).get, _HOOKS) if d] + [d for d in _GLOBAL_HOOKS if d]
        # the key of the reads as walked now: None (or KeyError, ValueError) once they changed layout
        walked = (identities, ids, tuple((id(h), n) for h, n, _ in scalars), tuple(tuple(d) for d in hooks))
        self.current = _generated_key(  # the walk as one int: hashed once, not per call
            _rebindings[0], _token(walked), list(zip(objects, self._values)),
            scalars, versioned, self.containers, contents, hooks, reads.shadows)

    def hold(self, graph: torch.nn.Module) -> None:
        """The tensors ``graph`` holds (and their views' bases): a plan reads them, so a write needs no plan itself."""
        tensors = [t for t in (*graph.parameters(), *graph.buffers(), *vars(graph).values())
                   if isinstance(t, torch.Tensor)]
        self._held.update(id(t) for t in tensors + [t._base for t in tensors if t._base is not None])
        self._read_identities()

    def pin(self) -> None:
        """Keep the objects the current key names by identity alive: no other object may take one of their ids."""
        self._pinned.setdefault(tuple(map(id, self._values)), self._values)

    def snapshot(self) -> tuple[list[tuple[Slot, Any]], list[tuple[Any, tuple]]]:
        return [(slot, _read(slot)) for slot in self._slots], [(c, _whole(_read(c))) for c in self._read_whole]

    def settle(self, before: tuple[list[tuple[Slot, Any]], list[tuple[Any, tuple]]]) -> None:
        """Slots that running the program (its trace, or the original) rebound since ``before``, and lists or dicts of
        numbers it wrote (``self.last = ...``, a call counter) are its outputs, not what it computes from: they leave
        the key (else each call of the original would make a key, and an optimization, of its own)."""
        slots, contents = before
        for slot, value in slots:
            with contextlib.suppress(KeyError, ValueError):  # a slot deleted: rebound
                if _read(slot) is value:
                    continue
            self._written.add((id(slot[0]), slot[1]))
        for slot, whole in contents:  # each also an object slot: rebound or deleted, it is written already
            if (id(slot[0]), slot[1]) not in self._written and _whole(_read(slot)) != whole:
                self._written.add((id(slot[0]), slot[1]))
        self._refresh()

    def key(self) -> tuple:
        """Flat (a fixed number of values per identities token; each container's identities a tuple of their own, so
        no two fillings of the containers share a key). A scalar set to something else enters as that value (a
        caller's plan lookup refuses an unhashable one); a deleted one leaves the key with another slots layout."""
        with contextlib.suppress(KeyError, ValueError):  # a global or attribute deleted, a cell emptied
            if (key := self.current()) is not None:
                return key
        self._refresh()  # walked again: what is deleted is no longer read
        return self.current()


def _whole(numbers: list | dict) -> tuple:
    return tuple(numbers.items() if isinstance(numbers, dict) else numbers)


def _read(slot: Slot) -> Any:
    holder, name, attribute = slot
    return getattr(holder, name) if attribute else holder[name]


@functools.lru_cache(maxsize=64)
def _first_equal(values: tuple) -> tuple:
    """The tuple equal to ``values`` met first (a TypeError where one is unhashable): the state part
    of a plan's key then compares by identity, not item by item, however often it is walked again."""
    return values


def _generated_key(seen: int, walked: int, objects, scalars: list[Slot],
                   versioned: list[Slot], containers: list, contents: list, hooks: list[dict],
                   shadows: list[tuple[dict, str]]) -> Callable[[], tuple | None]:
    """``key()`` as one expression: None where the walk no longer holds (a module rebound since ``seen``, an object slot
    holding another object, a hook registered or removed, a class attribute now shadowed); else the values it reads."""
    env: dict[str, Any] = {"_rebindings": _rebindings, "_grad": _grad_enabled, "_dtype": _default_dtype,
                           "_Handle": RemovableHandle, "_version": dict_version, "_first": _first_equal}
    def bind(value: Any) -> str:
        env[f"v{len(env)}"] = value
        return f"v{len(env) - 1}"
    def read(slot: Slot) -> str:
        holder, name, attribute = slot
        return f"{bind(holder)}.{name}" if attribute else f"{bind(holder)}[{name!r}]"
    same = [f"_rebindings[0] == {seen}", f"_Handle.next_id == {RemovableHandle.next_id}",
            *(f"{read(o)} is {bind(v)}" for o, v in objects if type(o[0]) is not dict),
            *(f"len({bind(d)}) == {len(d)}" for d in hooks),
            *(f"{n!r} not in {bind(d)}" for d, n in shadows if type(d) is not dict)]  # no version: every call
    held = [s for s in scalars if type(s[0]) is dict]  # read again only once one of their dicts changed
    kept = [*(f"{read(o)} is {bind(v)}" for o, v in objects if type(o[0]) is dict),  # checked so too (globals),
            *(f"{n!r} not in {bind(d)}" for d, n in shadows if type(d) is dict)]  # and an instance's gaining a name
    versions = [f"_version({bind(d)})" for d in {id(d): d for d in [s[0] for s in held] + [o[0] for o, _ in objects]
                                                 + [d for d, _ in shadows] if type(d) is dict}.values()]
    env["_held"] = [None] * len(versions) + [()]  # their versions, then their values
    parts = [str(walked), "_grad()", "_dtype()", "_held[-1]",
             *(read(s) for s in scalars if type(s[0]) is not dict), *(f"{read(o)}._version" for o in versioned),
             *(f"tuple([id(v) for v in {bind(c)}{'.values()' if isinstance(c, dict) else ''}])" for c in containers),
             *(f"tuple({read(c)}{'.items()' if isinstance(_read(c), dict) else ''})" for c in contents)]
    exec(f"def key():\n    if not ({' and '.join(same)}):\n        return None\n"
         f"    if not ({' and '.join(f'{v} == _held[{i}]' for i, v in enumerate(versions)) or 'True'}):\n"
         f"        if not ({' and '.join(kept) or 'True'}):\n            return None\n"
         f"        _held[:] = [{''.join(v + ', ' for v in versions)}_first(({''.join(read(s) + ', ' for s in held)}))]\n"
         f"    return ({', '.join(parts)},)", env)
    return env["key"]


LIMIT = 50_000  #: objects walked at most from one program (a Hugging Face model reaches a few thousand)
COPIED = 1 << 26  #: bytes of a tensor the program reaches that a Watch copies at most (a write past it is named only)
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
    """``with Watch(fn) as w:`` ... ``w.changes()``: what the runs inside changed; leaving the block puts it back."""

    def __init__(self, fn: Callable):
        self.fn, self.effects, self.records = fn, [], []  # records: (logger, record) held back

    def __enter__(self) -> Watch:
        self._saved = list(_walk(self.fn)) + [(m.__name__, m, (get := getattr(m, "getstate", None) or m.get_state, get())) for m in (
            random, "numpy" in sys.modules and __import__("numpy.random").random) if m]  # a draw: a trace's constant
        builtins.print, logging.Logger.handle = _print, _handle  # a watched thread's prints and logs are held back
        _local.__dict__.setdefault("watches", []).append(self)
        return self

    def __exit__(self, *exc) -> None:
        _local.watches.remove(self)
        self.put_back()

    def put_back(self) -> None:
        for name, holder, saved in self._saved:
            if _differs(holder, saved):
                _restore(holder, saved)

    def changes(self) -> list[str]:
        """What changed so far: state written (by name), then prints and log records."""
        return [f"{('sets', 'writes', 'draws from')[isinstance(h, (list, set, torch.Tensor)) + 2 * isinstance(h, types.ModuleType)]} "
                f"{_what(n, h, s)}" for n, h, s in self._saved if _differs(h, s)] + self.effects

    def settles(self, rerun: Callable[[], Any]) -> bool:
        """Whether what changed is the trace's alone: put back, a real run from the state before changes nothing (a cache
        filled before, a length written alike each call: the trace wrote tracers). Its log records (then ones a run does
        not log again, ``logger.warning_once``) reach their handlers now, as eager's first call's would."""
        self.put_back()
        with Watch(self.fn) as again:
            rerun()
        if again.changes():
            return False
        for logger, record in self.records:
            _ORIGINAL_HANDLE(logger, record)
        self.effects, self.records = [], []
        return True


def _walk(fn: Callable):
    """(name, holder, copy) of every container the program can reach: modules' and objects' attribute dicts, the
    classes of its own code, closure cells, the globals any function reached names, lists, dicts, sets and tensors."""
    names: set[str] = set()
    todo, seen = [("self" if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", "fn"), fn)], set()
    while todo and len(seen) < LIMIT:
        name, o = todo.pop()
        if id(o) in seen or isinstance(o, (str, bytes, int, float, complex, bool, type(None))):
            continue
        seen.add(id(o))
        if isinstance(o, (types.FunctionType, types.ModuleType, type)) and \
                _library(o.__name__ if isinstance(o, types.ModuleType) else o.__module__):
            continue
        if isinstance(o, torch.Tensor):  # written in place (``self.count += 1``: no graph shows it): its version and,
            yield from () if o.is_inference() else [(name, o, (o._version, None if isinstance(o, torch.nn.Parameter)
                or o.nbytes > COPIED else o.detach().clone()))]  # but for a parameter or a KV cache, a copy to put back
        elif isinstance(o, types.MethodType):
            todo += [(name, o.__func__), (name.rsplit(".", 1)[0] if "." in name else "self", o.__self__)]
        elif isinstance(o, functools.partial):
            todo += [(name, o.func), *((f"{name} argument", a) for a in (*o.args, *o.keywords.values()))]
        elif isinstance(o, types.FunctionType):
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
            attributes = {k: v for k, v in vars(o).items() if k in names}
            yield f"{o.__name__}.__dict__", vars(o), attributes
            todo += [(f"{o.__name__}.{k}", v) for k, v in attributes.items()]
        elif isinstance(o, type):
            yield o.__qualname__, o, dict(vars(o))
            todo += [(f"{o.__qualname__}.{k}", v) for k, v in vars(o).items()
                     if not k.startswith("__") or k == "__call__"]
        elif isinstance(o, (list, dict, set)):
            yield name, o, _copy(o)
            items = dict.items(o) if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else \
                ((None, v) for v in o)
            todo += [(f"{name.rsplit('.', 1)[0]}.{k}" if name.endswith(("._buffers", "._parameters")) else  # self.count
                      f"{name}[{k!r}]" if k is not None else f"an item of {name}", v) for k, v in items]
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
    # a dict's stored values, not what a subclass's __getitem__ makes of them (transformers' ACT2FN makes instances)
    return dict(vars(o)) if isinstance(o, type) else dict(dict.items(o)) if isinstance(o, dict) else list(o)


def _differs(holder: Any, saved: Any) -> bool:
    if isinstance(holder, types.ModuleType):  # random, numpy.random: their global generator's state
        return pickle.dumps(saved[0]()) != pickle.dumps(saved[1])  # saved: its getter, and the state it gave
    if isinstance(holder, torch.Tensor):
        return holder._version != saved[0] or saved[1] is not None and (  # a write through ``.data`` moves no version
            holder.dtype != saved[1].dtype or holder.shape != saved[1].shape or not torch.equal(holder, saved[1]) and
            not (holder.is_floating_point() and torch.allclose(holder, saved[1], 0, 0, equal_nan=True)))
    if isinstance(holder, types.CellType):
        return not _same(_copy(holder), saved)
    if isinstance(holder, types.FunctionType):
        return any(a is not b for a, b in zip(_copy(holder), saved))
    if isinstance(holder, (dict, type)):
        return bool(_changed_keys(holder, saved))
    if isinstance(holder, set):
        return {id(v) for v in holder} != {id(v) for v in saved}
    return len(holder) != len(saved) or not all(map(_same, holder, saved))


def _changed_keys(holder: Any, saved: dict) -> list:
    now = _copy(holder)  # of a scope (a module's globals), only some names are watched
    keys = saved.keys() if isinstance(holder, dict) and "__builtins__" in holder else saved.keys() | now.keys()
    return sorted((k for k in keys if not _same(now.get(k, _EMPTY), saved.get(k, _EMPTY))), key=str)


def _same(a: Any, b: Any) -> bool:
    """The same object, or equal plain values (torch.export rebinds ``normalized_shape`` to an equal tuple)."""
    return a is b or _plain_value(a) and _plain_value(b) and type(a) is type(b) and a == b


def _plain_value(x: Any) -> bool:
    if isinstance(x, (tuple, list, dict)):
        return all(map(_plain_value, (*x, *x.values()) if isinstance(x, dict) else x))
    return type(x) in (bool, int, float, complex, str, bytes, type(None))


def _what(name: str, holder: Any, saved: Any) -> str:
    """``self.calls``, ``global counter``, ``Counter.n``, ``self.seen``, ``self.cache (keys 'a')``."""
    if not isinstance(holder, (dict, type)):
        return f"{name} in place" if isinstance(holder, torch.Tensor) else name
    keys = _changed_keys(holder, saved)[:3]
    if isinstance(holder, dict) and "__builtins__" in holder:
        return ", ".join(f"global {k}" for k in keys)
    if isinstance(holder, type) or name.endswith(".__dict__"):
        where = holder.__qualname__ if isinstance(holder, type) else name.removesuffix(".__dict__")
        return ", ".join(f"{where}.{k}" for k in keys)
    return f"{name} (keys {', '.join(map(repr, keys))})"


def _restore(holder: Any, saved: Any) -> None:
    if isinstance(holder, types.ModuleType):
        (getattr(holder, "setstate", None) or holder.set_state)(saved[1])
    elif isinstance(holder, torch.Tensor):
        with torch.no_grad():  # a parameter's write is named, not undone
            saved[1] is None or holder.resize_(saved[1].shape).copy_(saved[1])
    elif isinstance(holder, types.CellType):
        delattr(holder, "cell_contents") if saved is _EMPTY else setattr(holder, "cell_contents", saved)
    elif isinstance(holder, types.FunctionType):
        holder.__defaults__, holder.__kwdefaults__ = saved
    elif isinstance(holder, (dict, type)):  # a dict subclass's own methods may do more than store: its builtin base's
        base = next(c for c in type(holder).__mro__ if c.__module__ in ("builtins", "collections"))  # (an OrderedDict's
        put, drop = (setattr, delattr) if isinstance(holder, type) else (base.__setitem__, base.__delitem__)  # links)
        for k in _changed_keys(holder, saved):
            put(holder, k, saved[k]) if k in saved else drop(holder, k)
    elif isinstance(holder, set):
        holder.clear()
        holder.update(saved)
    else:
        holder[:] = saved


_ORIGINAL_PRINT, _ORIGINAL_HANDLE = builtins.print, logging.Logger.handle


def _print(*args, **kwargs):
    if not (watches := getattr(_local, "watches", None)):
        return _ORIGINAL_PRINT(*args, **kwargs)
    if "prints" not in watches[-1].effects:
        watches[-1].effects.append("prints")


def _handle(self, record):
    if not (watches := getattr(_local, "watches", None)) or record.name.startswith(("torch", "egraph_opt")):
        return _ORIGINAL_HANDLE(self, record)
    what = f"logs to {record.name!r}"
    watches[-1].records.append((self, record))
    if what not in watches[-1].effects:
        watches[-1].effects.append(what)
