"""A call's arguments: tensors are the program's inputs; every other argument (a flag, a size) is
a constant of the trace and part of the plan's key, as torch.compile specializes on them. A call
of anything but positional tensors is traced through a function of the tensors alone (``specialize``).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

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
    """The tensors of one call, the plan key they and the other arguments make, and how to call
    the function again with other tensors. ``refused``: why the call runs untouched."""
    tensors: tuple
    names: list[str]
    key: tuple
    arguments: dict = field(default_factory=dict)
    refused: str = ""
    signature: inspect.Signature | None = None
    direct: bool = True
    trees: dict = field(default_factory=dict)  # argument -> (its TreeSpec, where its leaves start, how many)
    returned: list[str] = field(default_factory=list)  # those of ``trees`` the program returns as themselves

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
        out = fn(*bound.args, **bound.kwargs)
        self.returned = [name for name in self.trees if any(v is arguments[name] for v in _items(out))]
        for name, (_, start, n) in self.trees.items():
            if name not in self.returned and list(map(id, tree_flatten(arguments[name])[0])) != \
                    list(map(id, tensors[start:start + n])):
                raise SideEffect(f"the program updates argument {name!r} without returning it")
        return out


def _items(out: Any) -> list:
    """What a program returned, one level down (a ModelOutput's fields)."""
    return list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, tuple) else [out]


def adopt(out: Any, caller: Any) -> Any:
    """``out`` with the object ``caller`` passed in place of the one of its type the plan rebuilt:
    the original updates its argument (a KV cache) and returns it, so ``caller`` takes the rebuilt
    one's state."""
    for key, value in (out.items() if isinstance(out, dict) else ()):
        if type(value) is type(caller) and value is not caller:
            vars(caller).update(vars(value))
            out[key] = caller
    return out


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
    scope["specialized"].__qualname__ = getattr(fn, "__qualname__", None) or getattr(
        fn, "__name__", type(fn).__name__)
    return scope["specialized"]


class Binder:
    """Binds calls of one function: the fast path (tensors alone, positionally, as declared)
    costs a few attribute reads; everything else goes through ``inspect``."""

    def __init__(self, signature: inspect.Signature | None, name: str):
        self.signature, self.name = signature, name
        params = list(signature.parameters.values()) if signature else []
        self._names = [p.name for p in params]
        # plain calls: positional tensors for the leading parameters, defaults for every other
        # (F.gelu(x) leaves ``approximate`` the function's own); any number without a signature
        positional = [p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params] + [False]
        self._most = positional.index(False) if signature else math.inf
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
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}: {e}") from None
        # the arguments as given: defaults stay the function's own (a decorated forward, as Hugging
        # Face models have, may fill one itself and refuse it passed twice)
        tensors, names, constants, refused, trees = [], [], [], "", {}
        for name, value in bound.arguments.items():
            leaves, spec = _tree(value)
            if leaves is not None:  # its leaves are inputs; it is rebuilt from them
                trees[name] = (spec, len(tensors), len(leaves))
                tensors += leaves
                names += [f"{name}_{i}" for i in range(len(leaves))]
                refused = refused or next((f"argument {name!r} holds {why}" for t in leaves if (why := unusual(t))), "")
                constants.append((name, ("tree", repr(spec))))
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
        kinds = {p.kind for p in self.signature.parameters.values()}
        direct = not constants and len(tensors) == len(self.signature.parameters) and \
            kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}
        return BoundCall(tuple(tensors), names, (_tensor_key(tensors), tuple(constants)),
                         arguments=dict(bound.arguments), refused=refused, signature=self.signature,
                         direct=direct, trees=trees)


def _tree(value: Any) -> tuple[list | None, Any]:
    """The tensor leaves and spec of an object registered as a pytree that is no plain container
    (a cache class); (None, None) for anything else."""
    if value is None or isinstance(value, (torch.Tensor, tuple, list, dict, *_SIMPLE)):
        return None, None
    cache_pytrees()
    leaves, spec = tree_flatten(value)
    if spec.is_leaf() or not all(isinstance(t, torch.Tensor) for t in leaves):
        return None, None
    return leaves, spec


def _tensor_key(tensors) -> tuple | None:
    """Shape, dtype, device, grad and layout of each tensor: what a plan is specialized to (one
    flat tuple: fewer objects to build and hash per call); None if one is not a tensor. A tensor
    the capture cannot take (``unusual``) is keyed by its kind (it has no strides, or no shape)."""
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
    """Why the capture cannot take tensor ``t`` ("" where it can): its tracing and the Term
    language hold dense tensors of one shape."""
    if type(t) not in _DENSE:
        return f"a {type(t).__name__} (a tensor subclass)"
    if t.is_nested:
        return "a nested tensor"
    if t.layout is not torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor"
    return "a quantized tensor" if t.is_quantized else ""
