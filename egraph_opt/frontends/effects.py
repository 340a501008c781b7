"""Side effects in a traced program, which Terms (pure values) cannot express: an in-place op on an argument, parameter
or buffer (``x[0] = 0``, train-mode batch norm's statistics), or on an intermediate read again (fx names the value
before the mutation): these run untouched. One whose operand is never read again (``nn.ReLU(inplace=True)``) is pure."""
from __future__ import annotations

import operator

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

_AUGMENTED = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
              operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
              operator.ilshift, operator.irshift, operator.imatmul, operator.setitem}
_OPERATORS = {operator.and_, operator.or_, operator.not_}  # a | b: named with _ as Python keywords are
_AUGMENTED_METHODS = {f"__{op.__name__}__" for op in _AUGMENTED}  # x.__iadd__(y), x.__setitem__(i, v)
_VIEWS = {"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "T", "mT",
          "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "select", "narrow",
          "getitem", "__getitem__", "as_strided", "split", "chunk", "unbind", "detach", "movedim",
          "swapaxes", "diagonal", "real", "imag", "view_as_real", "view_as_complex", "alias"}
_VALUE_PRESERVING = {"detach_", "requires_grad_", "retain_grad"}  # in place, but on autograd state
_BATCH_NORMS = (torch.nn.modules.batchnorm._BatchNorm,)


def _name(node: fx.Node) -> str:
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.split(".")[0] if isinstance(target, torch._ops.OpOverload) else name


def written(node: fx.Node, gm: fx.GraphModule) -> list:
    """The operands ``node`` writes to (fx nodes), or a description of module state it writes."""
    name, args, kwargs = _name(node), node.args, node.kwargs
    if name in _VALUE_PRESERVING:
        return []
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        if isinstance(module, _BATCH_NORMS) and module.training and module.track_running_stats:
            return [f"{node.target}.running_mean"]
        return [args[0]] if getattr(module, "inplace", False) and args else []
    if node.op not in ("call_function", "call_method"):
        return []
    if isinstance(node.target, torch._ops.OpOverload):
        return [a for a, s in zip(args, node.target._schema.arguments) if s.alias_info and s.alias_info.is_write]
    written = [kwargs["out"]] if kwargs.get("out") is not None else []
    if node.target in _AUGMENTED or name in _AUGMENTED_METHODS \
            or (name.endswith("_") and not name.startswith("_") and node.target not in _OPERATORS) \
            or kwargs.get("inplace") is True:
        written.append(args[0])
    if node.target is torch.nn.functional.batch_norm and kwargs.get("training", args[5] if len(args) > 5 else False):
        written += [a for a in (kwargs.get("running_mean", args[1] if len(args) > 1 else None),) if a is not None]
    return written


def torchs_own(node: fx.Node) -> bool:
    """Whether ``node`` calls torch's own code (an aten overload, a torch, operator or builtin function, a tensor
    method), whose value follows from its operands: never a user's function kept opaque (``fx.wrap``)."""
    if node.op == "call_method":
        return hasattr(torch.Tensor, node.target)
    return node.op == "call_function" and (isinstance(node.target, torch._ops.OpOverload) or str(
        getattr(node.target, "__module__", None)).startswith(("torch", "_operator", "builtins", "math")))


def functional(target):
    """The out-of-place twin of an in-place op (``aten.add_.Tensor`` -> ``aten.add.Tensor``, ``"mul_"`` ->
    ``"mul"``), or None: where the written operand is never read again, the same value, writing nothing."""
    if isinstance(target, torch._ops.OpOverload):
        name = target._schema.name.split("::")[-1]
        packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
        return getattr(packet, target._overloadname, None) if packet is not None else None
    return target[:-1] if isinstance(target, str) and target.endswith("_") and not target.startswith("_") \
        and hasattr(torch.Tensor, target[:-1]) else None


def _base(node) -> tuple[object, bool]:
    """The value a written operand aliases (through views), and whether a view was crossed."""
    crossed = False
    while isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and (
            _name(node) in _VIEWS or getattr(node.target, "is_view", False)):  # an ATen view by its schema (slice)
        node, crossed = node.args[0], True
    return node, crossed


def mutations(gm: fx.GraphModule) -> tuple[list[str], set[str], bool, set[str]]:
    """What the program mutates, as the user would name it (empty: pure), the in-place nodes pure only if lowered to a
    Term (opaque, they would write into a shared value), whether each mutation is of a value it computed or of an
    argument (torch.export's functional form writes none), and its write-backs: a ``copy_`` into an argument read
    no more after (the functional form ends so: a StaticCache's update), which the plan makes last, as it does."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    found, in_place, functional, writes = [], set(), 0, set()
    for node in gm.graph.nodes:
        for target in written(node, gm):
            in_place.add(node.name)
            if isinstance(target, str):
                found.append(f"{target} (train-mode batch norm)")
                continue
            base, crossed = _base(target)
            if not isinstance(base, fx.Node):
                continue
            if base.op == "placeholder" and not crossed and node.target is torch.ops.aten.copy_.default and \
                    all(order[u] < order[node] for u in base.users if u is not node):
                writes.add(node.name)
                in_place.discard(node.name)
                continue
            if base.op == "placeholder":
                found.append(f"argument {base.name!r} ({_name(node) or node.target})")
                functional += 1
            elif base.op == "get_attr":
                found.append(f"{base.target!r} ({_name(node) or node.target})")
            elif crossed or any(order[u] > order[node] for u in base.users if u is not node):
                found.append(f"{base.name!r}, read again after {_name(node) or node.target}")
                functional += 1
    return found, in_place, functional == len(found), writes


class Draws(TorchDispatchMode):
    """Raises ``refuse(op)`` before an op that draws from a random generator runs (train-mode dropout, ``torch.rand``):
    each run the optimizer makes would advance the caller's generator, and two runs never agree. A thread's own mode."""

    def __init__(self, refuse):
        super().__init__()
        self.refuse = refuse

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            named = {a.name: kwargs.get(a.name, args[i] if i < len(args) else a.default_value)
                     for i, a in enumerate(func._schema.arguments)}
            # a seeded op draws, but for attention with dropout_p=0 and dropout outside training
            if not (named.get("dropout_p", 1) == 0 or named.get("train", True) is False):
                raise self.refuse(func.name().split("::")[-1])
        return func(*args, **kwargs)
