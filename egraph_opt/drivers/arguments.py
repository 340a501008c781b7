"""A call's arguments: tensors are the program's inputs; every other argument (a flag, a size) is a constant of the
trace and part of the plan's key, as torch.compile specializes on them. A call of anything but positional tensors is
traced through a function of the tensors alone (``specialize``)."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
from torch.utils._pytree import SUPPORTED_NODES, TreeSpec, register_pytree_node, tree_flatten, tree_unflatten, treespec_leaf

from ..frontends.capture import SideEffect, cache_pytrees

_DENSE = (torch.Tensor, torch.nn.Parameter)  # tensor types, not subclasses that change what ops do
_SIMPLE = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.Size)


def _constant_key(value: Any):
    """A hashable key for a value the program is specialized to, or None if it cannot be one."""
    if isinstance(value, _SIMPLE):
        return type(value).__name__, repr(value)  # repr: NaN keys equal themselves
    if isinstance(value, (tuple, dict)):  # also *args and **kwargs
        items = value.items() if isinstance(value, dict) else enumerate(value)
        parts = tuple((k, _constant_key(v)) for k, v in items)
        return None if any(p is None for _, p in parts) else (type(value).__name__, parts)
    return None


@dataclass(slots=True, eq=False)
class BoundCall:
    """One call's tensors, the plan key they and the others make, how to call again; ``refused``: why untouched."""
    tensors: tuple
    names: list[str]
    key: tuple
    arguments: dict = field(default_factory=dict)
    refused: str = ""
    signature: inspect.Signature | None = None
    direct: bool = True
    trees: dict = field(default_factory=dict)  # argument -> (its TreeSpec, where its leaves start, how many)
    numbered: dict = field(default_factory=dict)  # tree -> where its objects hold numbers, whether carried, a memo
    returned: list[str] = field(default_factory=list)  # those of ``trees`` the program returns as themselves

    def layout(self, args: tuple, kwargs: dict) -> Layout | None:
        """How ``args`` and ``kwargs``, the values this call was bound from, make its key; None where its
        values do not give its tensors one by one (a tensor in a tuple), or one is no dense tensor (which
        torch.compile's check refuses). A refused call's takes calls its refusal holds for too."""
        trees = {id(self.arguments[n]): (s, n, _node(s), self.numbered.get(n)) for n, (s, _, _) in self.trees.items()}
        slots = tuple(None if isinstance(v, torch.Tensor) else trees.get(id(v)) or  # an immutable
                      (v if type(v) in _SIMPLE else _NEVER, _constant_key(v))  # constant is itself
                      for v in (*args, *kwargs.values()))
        layout = Layout(len(args), tuple(kwargs), slots, self.key[1] if self.signature else None, None)
        flat = None if any(map(unusual, self.tensors)) else layout.tensors(args, kwargs)
        if flat is None or list(map(id, flat)) == list(map(id, self.tensors)):
            return None if flat is None else layout
        where = {id(t): i for i, t in enumerate(flat)}  # bound in another order than passed (keywords)
        order = tuple(where.get(id(t), -1) for t in self.tensors)
        return layout._replace(order=order) if sorted(order) == list(range(len(flat))) else None

    def uncarried(self, returned: tuple) -> str:
        """Why a tree the original updated and returned (run on this call) now holds a number its pytree carries not."""
        return next((why for n in returned if n in self.numbered and (why := _carried(
            n, self.arguments[n], tree_unflatten(*tree_flatten(self.arguments[n]))))), "")

    def traceable(self, fn: Callable) -> Callable:
        """``fn`` as a function of ``self.tensors`` alone (``fn`` itself when it is one)."""
        return fn if self.direct else specialize(fn, self.names, self.rebuild)

    def rebuild(self, fn: Callable, tensors: tuple):
        """Call ``fn`` with ``tensors`` in place of this call's tensors, other arguments as bound."""
        if self.signature is None:
            return fn(*tensors)
        arguments = dict(self.arguments)
        arguments.update((n, t) for n, t in zip(self.names, tensors) if n in arguments)
        for name, (spec, start, n) in self.trees.items():
            arguments[name] = tree_unflatten(list(tensors[start:start + n]), spec)
        bound = inspect.BoundArguments(self.signature, arguments)
        out = fn(*bound.args, **bound.kwargs)  # read one level down (a ModelOutput's fields)
        items = out.values() if isinstance(out, dict) else out if isinstance(out, tuple) else [out]
        self.returned = [name for name in self.trees if any(v is arguments[name] for v in items)]
        for name, (_, start, n) in self.trees.items():
            if name not in self.returned and [id(t) for t in tree_flatten(arguments[name])[0] if t is not None] != \
                    list(map(id, tensors[start:start + n])):
                raise SideEffect(f"the program updates argument {name!r} without returning it")
        return out

    def as_called(self, fn: Callable, into: Into, returned: tuple, writes: tuple = ()) -> tuple[Callable, Callable]:
        """``fn`` and a plan's ``into`` as functions of this call's tensors that pass ``trees``' objects as a caller
        does: kept (private ones, given back their tensors and plain state before each call: a cache the original
        initializes lazily would grow; their values too where the plan ``writes`` back), not rebuilt; writing through
        an ``Into`` of their own, not the plan's."""
        objects = {name: tree_unflatten([t.detach().clone() for t in self.tensors[start:start + n]], spec)
                   for name, (spec, start, n) in self.trees.items()}
        kept = [(obj, path, v, v.clone() if writes and isinstance(v, torch.Tensor) else None) for obj in
                objects.values() for path, v in _held(obj) if isinstance(v, (torch.Tensor, *_SIMPLE))]
        into = Into(into.forward, into.returns)

        def restored(tensors: tuple) -> dict:
            for obj, path, held, saved in kept:
                _write(obj, [path], [held if saved is None else held.copy_(saved)])
            return {**self.arguments, **{n: t for n, t in zip(self.names, tensors) if n in self.arguments}, **objects}

        def original(*tensors):
            bound = inspect.BoundArguments(self.signature, restored(tensors))
            return fn(*bound.args, **bound.kwargs)
        return original, lambda *tensors: into(tensors, [restored(tensors)[name] for name in returned])


_NEVER = object()  # no value is it
# None in an argument's tree: torch's pytree takes it for a leaf, and a plan's inputs are tensors; a node of no children
# instead, rebuilt as None (a multimodal generate()'s pre-encoded image output holds some)
_Absent = type("_Absent", (), {})
register_pytree_node(_Absent, lambda _: ([], None), lambda _, __: None, serialized_type_name="egraph_opt.Absent")


class Layout(NamedTuple):
    """A call's values (positional, then keyword) laid out as the Binder bound them: a call laid out alike (the same
    constants' keys and tree specs) has the key ``key(tensors)`` without binding: the fast path's check of a call."""
    arity: int
    keywords: tuple
    slots: tuple  # per value: None (a tensor), (its TreeSpec, name, _node, numbers), (the constant where immutable, its key)
    constants: tuple | None  # the key's constants (None: a call of tensors alone, keyed by them)
    order: tuple | None  # where each tensor the Binder gives is in the call (None: where it stands)

    def tensors(self, args: tuple, kwargs: dict) -> list | None:
        """The tensors of a call laid out so; None where it is not or a value differs."""
        if len(args) != self.arity or (tuple(kwargs) != self.keywords if kwargs else self.keywords):
            return None  # a call without keywords builds no tuple of them
        flat: list = []
        for value, slot in zip((*args, *kwargs.values()), self.slots):
            if slot is None:
                flat.append(value)
            elif type(slot[0]) is TreeSpec:
                if not _leaves(value, slot[2], flat) or slot[3] and ([_at(value, p) for p in slot[3][0]] == _rebuilt(
                        flat[len(flat) - slot[0].num_leaves:], slot[0], slot[3][0], slot[3][2])) != slot[3][1]:
                    return None  # its numbers are (or are not: refused) those of one rebuilt from its leaves, no longer
            elif value is not slot[0] and _constant_key(value) != slot[1]:
                return None
        return flat if self.order is None else [flat[i] for i in self.order]

    def key(self, tensors: list) -> tuple | None:
        return _key(tensors, self.constants)

    def trees(self, args: tuple, kwargs: dict) -> dict:
        """The objects of a call rebuilt from their leaves, by argument name."""
        return {slot[1]: value for value, slot in zip((*args, *kwargs.values()), self.slots)
                if slot and type(slot[0]) is TreeSpec}


def _node(spec: TreeSpec) -> tuple | None:
    """``spec`` as ``_leaves`` reads it: None for a leaf, else its type, flatten function, context,
    number of children and their nodes (None where all are leaves: a cache's list of layers)."""
    nodes = tuple(map(_node, spec.children()))
    return None if spec.type is None else \
        (spec.type, SUPPORTED_NODES[spec.type].flatten_fn, spec.context, len(nodes), nodes if any(nodes) else None)


def _leaves(value: Any, node: tuple | None, flat: list) -> bool:
    """``value``'s leaves onto ``flat`` if its tree is ``node``'s (types by identity): ``tree_flatten`` with no spec."""
    if node is None:
        flat.append(value)
        return True
    kind, flatten, context, n, nodes = node
    children, found = flatten(value) if type(value) is kind or kind is _Absent and value is None else ((), _NEVER)
    if found != context or len(children) != n:
        return False
    if nodes is None:
        flat.extend(children)
        return True
    return all(_leaves(child, inner, flat) for child, inner in zip(children, nodes))


def _key(tensors, constants: tuple | None) -> tuple | None:
    """The plan key of a call's tensors and its other arguments' keys (None: tensors alone)."""
    key = _tensor_key(tensors)
    return key if constants is None or key is None else (key, constants)


class Into:
    """Where the original updates an argument and returns it (a KV cache): the plan's new tensors are written where the
    caller's object holds its own, and the object returned. Where the first call finds that this leaves other state
    unlike a rebuilt object's, each call rebuilds one and the caller takes its state."""

    def __init__(self, forward: Callable, returns: TreeSpec):
        self.forward, self.returns = forward, returns
        self.outer = TreeSpec(returns.type, returns.context, [treespec_leaf()] * returns.num_children)
        self.paths: dict[int, tuple | bool] = {}  # child -> where its leaves (and numbers) are held, or False

    def __call__(self, tensors: tuple, callers: list) -> Any:
        flat, parts, start = self.forward(*tensors), [], 0
        for index, child in enumerate(self.returns.children()):
            leaves, start = flat[start:start + child.num_leaves], start + child.num_leaves
            caller = next((c for c in callers if type(c) is child.type), None)
            parts.append(tree_unflatten(leaves, child) if caller is None else self._into(index, caller, leaves, child))
        return tree_unflatten(parts, self.outer)

    def _into(self, index: int, caller: Any, leaves: list, spec: TreeSpec) -> Any:
        if index not in self.paths:  # the first call: where the caller holds its tensors; numbers a rebuilt one holds
            held = {id(v): path for path, v in _held(caller) if isinstance(v, torch.Tensor)}
            where = [held.get(id(t)) for t in tree_flatten(caller)[0]], list(_numbers(rebuilt := tree_unflatten(leaves, spec))), {}
            try:  # written there, the caller must equal one rebuilt from them
                same = all(where[0]) and len(set(where[0])) == len(leaves) and _put(caller, leaves, spec, *where) \
                    is None and _plain(caller) == _plain(rebuilt)
            except (TypeError, AttributeError):  # held in a tuple or a read-only attribute
                same = False
            self.paths[index] = same and where
        if self.paths[index]:
            _put(caller, leaves, spec, *self.paths[index])
        else:
            vars(caller).update(vars(tree_unflatten(leaves, spec)))
        return caller


def _put(caller: Any, leaves: list, spec: TreeSpec, paths: list, numbers: list, memo: dict) -> None:
    """``leaves`` where ``caller`` holds its own, with the numbers one rebuilt from them holds (a rebuild a call: 90 us)."""
    _write(caller, paths + numbers, [*leaves, *(_rebuilt(leaves, spec, numbers, memo) if numbers else ())])


def _held(obj: Any):
    """(path, value) of what ``obj`` holds through attributes, lists and dicts, each object walked
    once: where a pytree object keeps its tensors, and the plain state beside them."""
    stack, seen = [((), obj)], {id(obj)}
    while stack:
        path, x = stack.pop()
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else \
            vars(x).items() if hasattr(x, "__dict__") and not isinstance(x, (torch.Tensor, type)) else ()
        for key, value in items:
            yield path + (key,), value
            if id(value) not in seen and not isinstance(value, torch.Tensor):
                seen.add(id(value))
                stack.append((path + (key,), value))


def _plain(obj: Any) -> dict:
    return {path: v for path, v in _held(obj) if isinstance(v, _SIMPLE)}


def _at(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key] if isinstance(obj, (list, dict)) else getattr(obj, key)
    return obj


def _write(obj: Any, paths: list, leaves: list) -> None:
    for path, leaf in zip(paths, leaves):
        if isinstance(holder := _at(obj, path[:-1]), (list, dict)):
            holder[path[-1]] = leaf
        else:
            setattr(holder, path[-1], leaf)


def specialize(fn: Callable, names: list[str], rebuild: Callable) -> Callable:
    """A function (a module, when ``fn`` is one, so its parameters stay attributes) whose
    parameters are ``names``: fx names its inputs after them and calls ``rebuild(fn, tensors)``."""
    params = ", ".join(names)
    scope: dict = {"rebuild": rebuild}
    if isinstance(fn, torch.nn.Module):
        exec(f"def forward(self, {params}):\n    return rebuild(self.inner, ({params},))", scope)
        module = type("Specialized", (torch.nn.Module,), {"forward": scope["forward"]})()
        module.inner = fn
        return module
    scope["fn"] = fn
    exec(f"def specialized({params}):\n    return rebuild(fn, ({params},))", scope)
    scope["specialized"].__qualname__ = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(fn).__name__)
    return scope["specialized"]


class Binder:
    """Binds calls of one function: tensors alone, positionally, cost a few attribute reads; the rest ``inspect``."""

    def __init__(self, signature: inspect.Signature | None, name: str):
        self.signature, self.name = signature, name
        params = list(signature.parameters.values()) if signature else []
        self._names = [p.name for p in params]
        # plain calls: positional tensors for the leading parameters, defaults for every other
        # (F.gelu(x) leaves ``approximate`` the function's own); any number without a signature
        positional = [p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params] + [False]
        self._most = positional.index(False) if signature else math.inf
        self._var = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        self._least = max((i + 1 for i, p in enumerate(params) if p.default is p.empty and
                           p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)), default=0)

    def __call__(self, args: tuple, kwargs: dict) -> BoundCall:
        key = None if kwargs or not self._least <= len(args) <= self._most else _tensor_key(args)
        if key is not None:  # tensors alone, positionally
            names = self._names[:len(args)] if self.signature else [f"arg{i}" for i in range(len(args))]
            refused = next((f"argument {n!r} is {why}" for n, a in zip(names, args) if (why := unusual(a))), "")
            return BoundCall(args, names, key, refused=refused,
                             direct=bool(self.signature) and len(args) == len(self._names))
        if self.signature is None:
            return BoundCall((), [], ("refused", len(args), tuple(kwargs)),
                             refused=f"{self.name} has no signature to bind keyword or non-tensor arguments to")
        try:
            bound, signature = self.signature.bind(*args, **kwargs), self.signature
            if self._var and bound.arguments.get(self._var):  # what **kwargs took: arguments of their own
                signature = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != self._var]
                                              + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY)
                                                 for k in bound.arguments[self._var]])
                bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}: {e}") from None
        # the arguments as given: defaults stay the function's own (a decorated forward, as Hugging
        # Face models have, may fill one itself and refuse it passed twice)
        tensors, names, constants, refused, trees, numbered = [], [], [], "", {}, {}
        for name, value in bound.arguments.items():
            leaves, spec = _tree(value)
            if leaves is not None:  # its leaves are inputs; it is rebuilt from them
                trees[name] = (spec, len(tensors), len(leaves))
                tensors += leaves
                names += [f"{name}_{i}" for i in range(len(leaves))]
                refused = refused or next((f"argument {name!r} holds {why}" for t in leaves if (why := unusual(t))), "")
                if numbers := _numbers(value):  # numbers its tree carries not: the original runs, its key says so
                    why = _carried(name, value, tree_unflatten(leaves, spec))
                    numbered[name], refused = (tuple(numbers), not why, {}), refused or why
                constants.append((name, ("tree", repr(spec), numbered.get(name, (0, True))[1])))
                continue
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                names.append(name)
                refused = refused or (f"argument {name!r} is {why}" if (why := unusual(value)) else "")
                continue
            key = _constant_key(value)
            if key is None and not refused:
                refused = (f"argument {name!r} is a {type(value).__name__}: egraph-opt specializes "
                           "on tensors and plain constants")
            constants.append((name, key if key is not None else id(value)))
        kinds = {p.kind for p in signature.parameters.values()}
        direct = not constants and len(tensors) == len(signature.parameters) and \
            kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}
        return BoundCall(tuple(tensors), names, _key(tensors, tuple(constants)),
                         arguments=dict(bound.arguments), refused=refused, signature=signature,
                         direct=direct, trees=trees, numbered=numbered)


def _tree(value: Any) -> tuple[list | None, Any]:
    """The tensor leaves and spec of a registered pytree (a cache, a tuple of tensors, a ModelOutput, a dict of masks):
    a program that writes into a list or dict it is given is refused where it is traced (``BoundCall.rebuild``)."""
    if value is None or isinstance(value, (torch.Tensor, *_SIMPLE)):
        return None, None
    cache_pytrees()
    try:
        leaves, spec = tree_flatten(value)
        if any(leaf is None for leaf in leaves):  # each None an _Absent: a node of the spec, no input
            leaves, spec = tree_flatten(tree_unflatten([_Absent() if leaf is None else leaf for leaf in leaves], spec))
    except Exception:  # noqa: BLE001 - a registered flatten refusing this one (a cache of Mamba's layers), or an
        return None, None  # unflatten refusing a None's stand-in: no tree
    return (None, None) if spec.is_leaf() or not all(isinstance(t, torch.Tensor) for t in leaves) else (leaves, spec)


def _numbers(obj: Any) -> dict:
    return {path: v for path, v in _held(obj) if type(v) in (int, float)}


def _carried(name: str, obj: Any, rebuilt: Any) -> str:
    """Why ``obj``'s pytree cannot stand for it: a number it holds that ``rebuilt``, made from its leaves, holds not (a
    sliding window cache layer counts the tokens it has seen in ``cumulative_length``, a rebuilt one its kept keys)."""
    theirs = _numbers(rebuilt)
    path, v = next(((p, v) for p, v in _numbers(obj).items() if theirs.get(p, _NEVER) != v), (None, 0))
    return path and f"argument {name!r} holds {type(_at(obj, path[:-1])).__name__}.{path[-1]} = {v}, which its " \
        f"pytree carries not (rebuilt from its tensors: {theirs.get(path)})" or ""


def _rebuilt(leaves: list, spec: TreeSpec, paths: list, memo: dict) -> list:
    """The numbers at ``paths`` of an object rebuilt from ``leaves``: of their shapes, so rebuilt once per shapes (70 us)."""
    if (shapes := tuple(t.shape for t in leaves)) not in memo:
        memo[shapes] = list(map(_numbers(tree_unflatten(list(leaves), spec)).get, paths))
    return memo[shapes]


def _tensor_key(tensors) -> tuple | None:
    """Shape, dtype, device, grad and layout of each tensor: what a plan is specialized to (one flat tuple: fewer
    objects to build and hash per call); None if one is not a tensor. One the capture cannot take: by its kind."""
    key: list = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return None
        if type(t) in _DENSE and t.layout is torch.strided and not t.is_nested:
            key += (t.shape, t.dtype, t.device, t.requires_grad, t.is_contiguous())
        else:
            key += (type(t), t.layout, t.is_nested, t.dtype, t.device)
    return tuple(key)


def unusual(t: torch.Tensor) -> str:
    """Why the capture cannot take tensor ``t`` ("" where it can): tracing and Terms hold dense tensors."""
    if type(t) not in _DENSE:
        return f"a {type(t).__name__} (a tensor subclass)"
    if t.is_nested:
        return "a nested tensor"
    return f"a {str(t.layout).removeprefix('torch.')} tensor" if t.layout is not torch.strided else \
        "a quantized tensor" if t.is_quantized else ""
