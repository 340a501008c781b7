"""Backend: a Program back into an executable torch.fx.GraphModule.

Each Term becomes a call of the kernel it is bound to (``kernels.binding``), with conversion kernels where a value
changes memory; on the Triton path a region of elementwise ops (and the row reduction or softmax they feed) is one
generated kernel where it measures faster. Opaque calls are copied as they were, scalar constants folded, and every
value is emitted once, after what it uses. What no input reaches (a mask built from ``arange``, weights concatenated)
is computed once per version of what it reads."""
from __future__ import annotations

import operator
import warnings

import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.node import map_aggregate

from collections import Counter

from ..analysis.facts import Facts
from ..frontends.effects import torchs_own, written
from ..kernels import triton as triton_kernels
from ..kernels.binding import Estimator, bind, default_estimate, ready, region_chosen
from ..kernels.registry import MOVES, Use, copies
from ..kernels.torch_ops import PLAIN, TORCH
from ..kernels.triton.codegen import REDUCTIONS, STATS, TEMPLATES, span
from ..lang.ops import COMPARISONS, shape_attr
from ..lang.program import WRITE, OpaqueRef, Program, leaves
from ..lang.pattern import structural_ids
from ..lang.term import Term, dtype_name, evaluate, postorder, topological


class FoldedConstant:
    """A value of parameters, buffers, literals and a family's sizes alone (QKV weights concatenated, a causal mask):
    computed once per version of what it reads, per size; each call where autograd needs it or for inference tensors."""

    def __init__(self, nodes: list[fx.Node], reads: list[fx.Node], index: int):
        at = {n: i for i, n in enumerate(reads + [n for n in nodes if n not in reads])}
        # the steps as (kind, target, operands with each node's value as its position): the nodes
        # are erased from the plan's graph; an fx module per value would cost codegen per plan
        self.steps = [(n.op, n.target, fx.node.map_arg((n.args, n.kwargs), lambda a: Slot(at[a])))
                      for n in nodes if n not in reads]
        self.__name__ = self.__qualname__ = f"folded_constant_{index}"
        self._cached, self._bytes = {}, 0  # sizes -> (what identifies the tensors read, the value, its version); their bytes

    def __call__(self, *reads):
        key, sizes, grad = [], [], torch.is_grad_enabled()  # one pass: every call of a plan reads each constant
        for r in reads:
            if not isinstance(r, torch.Tensor):
                sizes.append(r)
            elif grad and r.requires_grad or r.is_inference():  # inference tensors keep no version
                return self.run(reads)
            else:
                key += (r.data_ptr(), r._version, r.device)
        seen, value, version = self._cached.get(sizes := tuple(sizes), (None, None, None))
        if key == seen and getattr(value, "_version", None) == version:  # nobody wrote the value
            return value
        with torch.inference_mode(False):  # a normal tensor: its version shows writes (sdpa_masked's facts by it)
            value = self.run(reads)
        if len(self._cached) >= 4096 or self._bytes > 1 << 26:  # a long generation's sizes, each its mask (cleared,
            self._cached, self._bytes = {}, 0  # not cycled through: 64 MiB; counted as made, not summed per size)
        self._cached[sizes] = key, value, getattr(value, "_version", None)  # one per size: no stale weights kept
        self._bytes += getattr(value, "nbytes", 0)
        return value

    def run(self, tensors: tuple):
        values = list(tensors)
        for kind, target, operands in self.steps:
            args, kwargs = map_aggregate(operands, lambda a: values[a] if isinstance(a, Slot) else a)
            values.append(getattr(args[0], target)(*args[1:], **kwargs) if kind == "call_method"
                          else target(*args, **kwargs))
        return values[-1]


class Slot(int):
    """A folded step's operand: the value at this position."""


def _pure(node: fx.Node, owner, kernels: set) -> bool:
    """Whether ``node``'s value follows from its operands alone and stays as computed: a bound kernel or
    torch's own op (the capture refuses random draws) that writes nothing and that nothing writes."""
    return (node.target in kernels or torchs_own(node)) and not written(node, owner) and \
        not any(node in written(u, owner) for u in node.users)


def fold_constants(graph: fx.Graph, kernels: set, sizes: tuple = ()) -> int:
    """Each value a call uses of parameters, buffers, literals and ``sizes`` alone: one FoldedConstant; how many."""
    fixed, order = {}, {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        fixed[node] = node.op == "get_attr" or node in sizes or _pure(node, graph.owning_module, kernels) and \
            all(fixed[a] for a in node.all_input_nodes)
    edges = [n for n in graph.nodes if fixed[n] and n.op not in ("get_attr", "placeholder") and not all(
        fixed[u] for u in n.users) and not (n.target is torch.transpose and n.args[0].op == "get_attr")]  # a view
    done: dict = {}  # an earlier edge -> its call: read, not computed again (a mask, then its rows' maxima)
    for index, node in enumerate(edges):
        nodes = sorted(topological([node], lambda n: () if n in done else n.all_input_nodes, id), key=order.__getitem__)
        own = [a for a in nodes if a.op == "get_attr" or a in sizes or a in done]  # and the sizes an earlier edge
        reads = list(dict.fromkeys([s for a in own if a in done for s in done[a].args if s in sizes] + own))  # read
        with graph.inserting_before(node):
            done[node] = graph.call_function(FoldedConstant(nodes, reads, index), tuple(done.get(a, a) for a in reads))
            node.replace_all_uses_with(done[node], delete_user_cb=lambda user: not fixed.get(user, False))
    for node in reversed(list(fixed)):  # what only folded constants read (fx keeps a detach_)
        if fixed[node] and not node.users and node.op != "placeholder":
            graph.erase_node(node)
    return len(edges)


def _schedule(program: Program) -> list:
    """Terms and opaque call names in an order where each comes after what it uses."""
    def deps(item):
        if isinstance(item, Term):
            return [item.attrs[0]] if item.op == "opaque" else list(item.args)
        call = program.opaque[item]
        return [x.name if isinstance(x, OpaqueRef) else x for x in leaves((call.args, call.kwargs))
                if isinstance(x, (Term, OpaqueRef))]

    key = lambda item: ("t", id(item)) if isinstance(item, Term) else ("o", item)  # noqa: E731
    roots = [x if not isinstance(x, OpaqueRef) else x.name for x in leaves(program.outputs)
             if isinstance(x, (Term, OpaqueRef))] + [n for n, c in program.opaque.items() if c.target is WRITE]
    order, late = topological(roots, deps, key), set()  # inputs written back last, then what reads them written
    for item in order:
        if any(key(d) in late for d in deps(item)) or type(item) is str and program.opaque[item].target is WRITE:
            late.add(key(item))
    return sorted(order, key=lambda item: key(item) in late)  # stable: each part keeps its order


def _in_place(graph: fx.Graph, program: Program) -> None:
    """A write-back ``copy_(x, f(x, ...))`` where nothing else reads x, f an ATen op keeping x's shape and dtype: f in
    place (``index_copy_``), as the original wrote it: a StaticCache's step writes its row, not its cache twice."""
    inputs = {t.attrs[0]: t.attrs[1:] for t in program.inputs}
    for node in [n for n in graph.nodes if n.target is WRITE]:
        x, made = node.args
        call = program.opaque.get(made.name) if isinstance(made.target, torch._ops.OpOverload) else None
        twin = call and getattr(getattr(torch.ops.aten, made.target._schema.name.split("::")[-1] + "_", None),
                                made.target._overloadname, None)
        if twin and made.args[0] is x and set(x.users) == {made, node} and call.meta and \
                (shape_attr(call.meta[0]), dtype_name(call.meta[1])) == inputs.get(x.name):
            made.target = twin
            node.replace_all_uses_with(made)
            graph.erase_node(node)


def _held(owner: torch.nn.Module, name: str):
    return operator.attrgetter(name)(owner)  # a dotted name: attribute by attribute


def build_module(program: Program, root: torch.nn.Module | None = None, device: str = "cpu",
                 estimate: Estimator = default_estimate, meta: dict | None = None) -> fx.GraphModule:
    """The program as a GraphModule; ``.kernels`` on it counts the kernels it binds by name.
    ``meta``: the terms' shapes, where a program with the same terms already inferred them."""
    if device == "meta":
        raise ValueError("meta tensors hold no values: no kernel runs on them and nothing can be "
                         "validated, so the original runs")
    owner = root if root is not None else torch.nn.Module()
    build = _Build(program, owner, device, estimate, meta if meta is not None else program.meta())
    for item in _schedule(program):
        if isinstance(item, Term):
            build.term(item)
        else:
            call = program.opaque[item]
            args, kwargs = map_aggregate((call.args, call.kwargs), build.arg)
            build.value[("o", item)] = build.graph.create_node(call.kind, call.target, args, kwargs, name=item)
    graph = build.graph
    graph.output(map_aggregate(program.outputs, build.arg))
    _in_place(graph, program)
    for node in graph.nodes:  # x @ w.T, w held of rank 2: aten's linear runs that matmul, and no transpose
        w = node.args[1] if node.target is operator.matmul else None
        if getattr(w, "target", None) is torch.transpose and w.args[0].op == "get_attr" and \
                getattr(build.reads[w.args[0].target], "ndim", 0) == 2 and w.args[1] % 2 != w.args[2] % 2:
            node.target, node.args = F.linear, (node.args[0], w.args[0])
    pure = {n.target for n in build.named} | {m.impl for m in MOVES.values()}
    folded = fold_constants(graph, pure)
    # each attribute under a name of its own: one read per call, not one per module on its path
    module = fx.GraphModule({n.target: build.reads[n.target] if n.target in build.reads else _held(owner, n.target)
                             for n in graph.nodes if n.op in ("get_attr", "call_module")}, graph)
    module.graph.lint()
    plain_attributes(module)
    module.pure, module.writes = pure, bool(program.written())  # its arguments written back: run once, never twice
    module.kernels = ({"folded": folded} if folded else {}) | dict(sorted(Counter(
        build.named[n] for n in graph.nodes if n in build.named).items()))
    return module


def plain_attributes(module: fx.GraphModule) -> fx.GraphModule:
    """Its tensors as plain attributes: the generated code reads each on every call, and a registered
    parameter or buffer is found by Module.__getattr__, ten times as slow. No one else reads this module."""
    for table in (module._parameters, module._buffers):
        module.__dict__.update(table)
        table.clear()
    return module


class _Build:
    """One program's graph being built: each value's fx node (or Python scalar) by key, ("t", term id) or
    ("o", opaque name); the backend holding it (absent: torch); conversions made; each call node's kernel."""

    def __init__(self, program: Program, owner, device: str, estimate: Estimator, meta: dict):
        self.graph = fx.Graph(owning_module=owner)  # dead-code elimination asks the owner whether
        # its submodules are pure (a train-mode batch norm kept opaque updates running statistics)
        self.owner, self.device, self.estimate = owner, device, estimate
        self.value, self.backend, self.converted = {}, {}, {}
        self.placeholders = {t.attrs[0]: self.graph.placeholder(t.attrs[0]) for t in program.inputs}
        self.facts = Facts.of_program(program.roots(), meta)
        self.named: dict[fx.Node, str] = {}
        self.reads: dict[str, object] = {}  # the attributes read, by the names the graph reads them
        self.regions: dict[int, tuple] = {}  # region root id -> its generated kernel, its operands' keys
        self.inside: set[int] = set()  # the regions' other ops: their kernels compute them
        ids = structural_ids([*program.roots(), *program.own]) if program.own else {}
        mine = {ids[id(t)] for t in program.own}
        self.own = {i for i, n in ids.items() if n in mine}  # the user's own calls, kept as called
        if triton_kernels.available(device):
            self._fuse(program.roots(), meta)

    def _fuse(self, roots: list[Term], meta: dict) -> None:
        """A generated kernel for each maximal region of two or more ops (codegen's templates, on float or bool operands
        that broadcast (``codegen.span``) or constants, a mask of float32 values inside but never its root, at most one
        softmax or norm over the last axis, under at most one root sum, mean or max; an operand joins its users' region
        where only they read it) where it replaces their kernels (``binding.region_chosen``), rounding as torch's do."""
        floats, mask = (torch.float16, torch.bfloat16, torch.float32), torch.bool

        def fusible(t: Term) -> bool:  # a 0-d tensor of another dtype stays out of torch's type promotion
            shape, dtype = meta[id(t)]  # torch compares in the operands' dtype (a constant rounded to it): float32's alone
            rows = t.op not in STATS or meta[id(t.args[0])][0][-1:] == shape[-1:] != (1,) and \
                (t.op != "softmax" or t.attrs[0] == -1)  # a row op's rows are the region's, of the last axis
            compares = t.op == "logical_not" or {meta[id(a)][1] for a in t.args if a.op != "const"} == {torch.float32}
            return t.op in TEMPLATES and len(shape) > 0 and (dtype in floats or t.op in COMPARISONS and compares) \
                and rows and all(a.op == "const" or meta[id(a)][1] in (*floats, mask)  # a bool read as 1.0 or 0.0
                                 and span(meta[id(a)][0], shape) is not None
                                 and (len(meta[id(a)][0]) > 0 or meta[id(a)][1] == dtype) for a in t.args)
        row = lambda t: t.op in REDUCTIONS and t.attrs[0] == -1  # noqa: E731 - a root reducing rows
        order, inside = postorder(roots), set()
        uses = Counter(i for t in order for i in {id(a) for a in t.args}) + Counter(map(id, roots))  # users
        for t in reversed(order):  # users before their operands
            if id(t) in inside or meta[id(t)][1] is mask or not (fusible(t) or row(t)):  # a mask is computed inside
                continue
            ops, reached = [t], Counter()  # users walked of each operand
            for u in ops:  # grows while it is walked: each op after its users
                reached.update({id(a) for a in u.args})
                ops += [a for i, a in enumerate(u.args)  # x * x: one operand; a reduction under a root cast
                        if reached[id(a)] == uses[id(a)] and (fusible(a) or u is t and t.op == "cast" and row(a))
                        and all(a is not b for b in u.args[:i]) and not (a.op in STATS and any(
                            o.op in STATS for o in ops + list(u.args[:i])))]  # one softmax or norm
            if len(ops) < 2:
                continue
            inside.update(map(id, ops))
            made, outside = {}, {}  # the region's terms over inputs for the values it reads, those by name
            top = t.args[0] if row(t) else t  # its cast gives the kernel's dtype
            for u in reversed(ops):
                for a in u.args:
                    if id(a) not in made and a.op != "const":
                        made[id(a)] = Term.input(f"x{len(outside)}", meta[id(a)][0], dtype_name(meta[id(a)][1]))
                        outside[made[id(a)].attrs[0]] = a
                made[id(u)] = Term(u.op, tuple(made.get(id(a), a) for a in u.args), u.attrs)
                rounds = meta[id(u)][1] in floats and (meta[id(u)][1] != torch.float32 or u is top)  # a mask never
                if u.op not in ("cast", *REDUCTIONS) and rounds:
                    made[id(u)] = Term("cast", (made[id(u)],), (dtype_name(meta[id(u)][1]),))  # rounds as torch
            kernel = triton_kernels.generate_elementwise(made[id(t)])
            operands = [outside[name] for name in kernel.program.inputs]
            chosen, config = region_chosen(kernel, [meta[id(a)] for a in operands], self.device,
                                           getattr(self.estimate, "latency", None))
            if chosen:
                self.regions[id(t)] = kernel, [("t", id(a)) for a in operands], config
                self.inside.update(id(u) for u in ops[1:])

    def on(self, key, target: str):
        """The value at ``key`` in ``target``'s memory, through a conversion kernel if needed."""
        source = self.backend.get(key, "torch")
        if not copies(source, target) or not isinstance(self.value[key], fx.Node):
            return self.value[key]
        if (key, target) not in self.converted:
            self.converted[key, target] = self.graph.call_function(MOVES[source, target].impl, (self.value[key],))
        return self.converted[key, target]

    def read(self, name: str) -> fx.Node:
        """A node reading the owner's attribute ``name`` by a dotless name (fx warns; the module holds it)."""
        flat = name.replace(".", "_")
        while flat in self.reads and self.reads[flat] is not _held(self.owner, name):
            flat += "_"
        self.reads[flat] = _held(self.owner, name)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node", UserWarning)
            return self.graph.get_attr(flat)

    def arg(self, x):
        return self.on(("t", id(x)), "torch") if isinstance(x, Term) else \
            self.value[("o", x.name)] if isinstance(x, OpaqueRef) else x

    def term(self, item: Term) -> None:
        key = ("t", id(item))
        if key in self.value or id(item) in self.inside:
            return
        leaf = {"const": lambda: item.attrs[0], "param": lambda: self.read(item.attrs[0]),
                "opaque": lambda: self.value[("o", item.attrs[0])],
                "input": lambda: self.placeholders[item.attrs[0]]}.get(item.op)
        self.value[key] = leaf() if leaf else self._computed(item, key)

    def _computed(self, item: Term, key):
        """A scalar folded now, or a kernel: at a region's root, the region's generated kernel."""
        operands = [("t", id(a)) for a in item.args]
        if id(item) in self.regions:
            impl, operands, config = self.regions[id(item)]
            name, backend, attrs = "triton.generated", "triton", ()
        elif not any(isinstance(self.value[k], fx.Node) for k in operands):
            return evaluate([item], {}, kernels=TORCH)[0]
        else:
            n = self.facts.of(item)
            use = Use(op=n.op, attrs=n.attrs, shapes=n.shapes, dtypes=n.tensor_dtypes, device=self.device,
                      layouts=n.layouts)
            kernel = bind(use, tuple(self.backend.get(k, "torch") for k in operands), self.estimate)
            impl, name, backend, attrs = kernel.impl, kernel.name, kernel.backend, item.attrs
            accepts = frozenset(k.name for k in ready(use))
            if id(item) in self.own and name == f"torch.{n.op}" and n.op in PLAIN:
                impl = PLAIN[n.op]
            config = getattr(self.estimate, "config", lambda *_: None)(kernel, use)  # tuned: no tuning at a call
        self.backend[key] = backend
        node = self.graph.call_function(impl, tuple(self.on(k, backend) for k in operands) + tuple(attrs),
                                        {"config": config} if config else {})
        self.named[node] = name
        if name != "triton.generated":  # what a size family may bind here instead (``families.shared``)
            node.meta["kernel"] = name, accepts
        return node
