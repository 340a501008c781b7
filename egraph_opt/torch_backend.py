"""Backend: a Program back into an executable torch.fx.GraphModule.

Terms become calls of their ops' torch implementations, opaque calls are copied as they were,
scalar constants are folded, and every value is emitted once, after what it uses.
"""
from __future__ import annotations

import torch
from torch import fx
from torch.fx.node import map_aggregate

from .ops import OPS
from .program import OpaqueRef, Program, leaves
from .term import Term, evaluate


def _schedule(program: Program) -> list:
    """Terms and opaque call names in an order where each comes after what it uses."""
    order, done = [], set()

    def deps(item):
        if isinstance(item, Term):
            if item.op == "opaque":
                return [item.attrs[0]]
            return list(item.args)
        call = program.opaque[item]
        return [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)] + [
            x.name for x in leaves((call.args, call.kwargs)) if isinstance(x, OpaqueRef)]

    key = lambda item: ("t", id(item)) if isinstance(item, Term) else ("o", item)  # noqa: E731
    roots = [x if not isinstance(x, OpaqueRef) else x.name for x in leaves(program.outputs)
             if isinstance(x, (Term, OpaqueRef))]
    for root in roots:
        stack = [(root, False)]
        while stack:
            item, ready = stack.pop()
            if key(item) in done:
                continue
            if ready:
                done.add(key(item))
                order.append(item)
                continue
            stack.append((item, True))
            stack.extend((d, False) for d in reversed(deps(item)) if key(d) not in done)
    return order


def build_module(program: Program, root: torch.nn.Module | None = None) -> fx.GraphModule:
    graph = fx.Graph()
    value: dict = {}  # ("t", id) / ("o", name) -> fx.Node or Python scalar
    placeholders = {t.attrs[0]: graph.placeholder(t.attrs[0]) for t in program.inputs}

    def arg(x):
        if isinstance(x, Term):
            return value[("t", id(x))]
        if isinstance(x, OpaqueRef):
            return value[("o", x.name)]
        return x

    for item in _schedule(program):
        if not isinstance(item, Term):
            call = program.opaque[item]
            args, kwargs = map_aggregate((call.args, call.kwargs), arg)
            value[("o", item)] = graph.create_node(call.kind, call.target, args, kwargs, name=item)
            continue
        key = ("t", id(item))
        if key in value:
            continue
        spec = OPS[item.op]
        if item.op == "const":
            value[key] = item.attrs[0]
        elif item.op == "param":
            value[key] = graph.get_attr(item.attrs[0])
        elif item.op == "opaque":
            value[key] = value[("o", item.attrs[0])]
        elif item.op == "input":
            value[key] = placeholders[item.attrs[0]]
        else:
            args = [value[("t", id(a))] for a in item.args]
            if not any(isinstance(a, fx.Node) for a in args):
                value[key] = evaluate([item], {})[0]  # scalar constant folding
            else:
                value[key] = graph.call_function(spec.impl, tuple(args) + tuple(item.attrs))
    graph.output(map_aggregate(program.outputs, arg))
    graph.lint()
    return fx.GraphModule(root if root is not None else torch.nn.Module(), graph)
