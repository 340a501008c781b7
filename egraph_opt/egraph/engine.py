"""The one module that talks to egglog, through its low-level bindings and program text generated from the op table.

Terms are loaded as small chunks of ``(union (Ref k) (Op (Ref i) ...))`` commands (one large program parses in
quadratic memory: docs/DESIGN.md), each term node once, so shared subexpressions stay shared and every node keeps an
anchor ``Ref k`` that names its e-class after saturation. The serialized e-graph (private API, wrapped here only) is
parsed into plain Python classes for our own extractor."""
from __future__ import annotations

import atexit
import functools
import gc
import json
import math
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field

from egglog import bindings

from . import range_rules
from ..lang.mesh import through_reshape
from ..lang.ops import OPS, BY_EGG_NAME, ATTR_SORTS
from ..lang.pattern import Node, literal
from ..lang.term import Term, postorder, topological

SORT, _CHUNK = "Tensor", 16
RELATIONS = ("positive", "nonneg", "nonzero")  # the snapshot's sign facts, which guards read
_UNBOUNDED = 1e300  # the range analysis' clamp: a bound at it says nothing, and is not loaded


def _ruleset(phase: str) -> str:
    """egglog's name of a phase's ruleset, apart from every variable name (a later rule may not bind ``r``)."""
    return f"phase-{phase}"


@functools.lru_cache(maxsize=None)
def _ops_of(rule) -> tuple[frozenset, frozenset]:
    """(ops a rule's left sides name, ops its right sides make)."""
    def ops(p) -> set[str]:
        return {q.op for q in topological([p], lambda q: q.args if isinstance(q, Node) else (), id)
                if isinstance(q, Node)}
    pairs = rule.pairs()
    return (frozenset().union(*(ops(lhs) for lhs, _ in pairs)), frozenset().union(*(ops(rhs) for _, rhs in pairs)))


@functools.lru_cache(maxsize=None)
def _range_rules() -> tuple[tuple[frozenset, str], ...]:
    """Each range rule with the ops its query names (its actions set bounds, facts): it waits for them too."""
    return tuple((frozenset(BY_EGG_NAME[n].name for n in re.findall(r"\((\w+)", text) if n in BY_EGG_NAME),
                  text) for text in range_rules.rules())


class InvariantError(RuntimeError):
    """A tripwire fired: the e-graph merged what no sound rule can merge."""


def declarations() -> str:
    """egglog text declaring the Tensor datatype, one constructor per op of the table."""
    ctors = [f"({op.egg_name} {' '.join([SORT] * op.arity + [sort for _, sort in op.attrs])})".replace(" )", ")")
             for op in OPS.values()]
    return f"(datatype {SORT}\n  " + "\n  ".join(ctors) + f")\n(constructor Ref (i64) {SORT})\n"


@dataclass(frozen=True)
class ENode:
    op: str
    children: tuple[str, ...]  # e-class ids of tensor operands
    attrs: tuple


@dataclass
class Snapshot:
    """The serialized e-graph as plain data: e-classes of Tensor e-nodes, and what analyses proved."""
    classes: dict[str, list[ENode]]
    class_of_ref: dict[int, str]
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # classes that are not float32
    #: the classes the analyses proved ``positive``, ``nonneg`` or ``nonzero``
    relations: dict[str, set[str]] = field(default_factory=lambda: {r: set() for r in RELATIONS})

    @property
    def num_enodes(self) -> int:
        return sum(len(v) for v in self.classes.values())


@dataclass
class Saturation:
    """How a phase of rules ran: iterations, why it stopped, matches per rule."""
    phase: str
    iterations: int = 0
    stop: str = "saturated"
    seconds: float = 0.0
    matches: dict[str, int] = field(default_factory=dict)
    enodes: int = 0


class _Owner:
    """The one thread that makes, uses and drops every egglog e-graph: egglog's EGraph is a PyO3 "unsendable"
    object; one touched on another thread panics, one dropped there prints a traceback and is never freed (a
    plan cache shared by threads would leak every e-graph). Callers hold a number; calls run here."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.live: dict[int, bindings.EGraph] = {}  # touched on the owner thread only
        self._made, self._crowd = 0, 4

    def call(self, fn, *args):
        """``fn(*args)`` on the owner thread; its result or exception here."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        with self._start:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="egraph-opt-egglog", daemon=True)
                self._thread.start()
        done, box = threading.Event(), []
        self._jobs.put((fn, args, done, box))
        done.wait()
        if box[0]:
            raise box[1]
        return box[1]

    def _serve(self) -> None:
        while True:
            fn, args, done, box = self._jobs.get()
            try:
                box += [False, fn(*args)]
            except BaseException as e:  # noqa: BLE001 - egglog panics too: raised in the caller
                box += [True, e]
            del fn, args  # nothing of the job outlives it here (a dropped e-graph's number)
            if done is not None:
                done.set()

    def make(self) -> int:
        """A new e-graph's number. Their memory is egglog's, which the cycle collector does not count: a dropped
        decorated function in a reference cycle keeps its e-graph, hundreds of MB, until a full collection that object
        counts may not call for long. So one runs whenever twice as many e-graphs live as after the last (4 or more)."""
        if len(self.live) >= self._crowd:
            gc.collect()
            self._crowd = max(4, 2 * self.call(len, self.live))  # after the drops it queued
        def made() -> int:
            self._made += 1
            self.live[self._made] = bindings.EGraph()
            return self._made
        return self.call(made)

    def drop(self, number: int) -> None:
        """Free e-graph ``number`` on the owner thread, from any thread (a finalizer too: no wait)."""
        if threading.current_thread() is self._thread:
            self.live.pop(number, None)
        elif self._thread is not None and self._thread.is_alive():
            self._jobs.put((self.live.pop, (number, None), None, []))

    def forget(self) -> None:
        """In a forked child the owner thread is gone: its e-graphs are never touched again."""
        _ORPHANS.append(self.live)
        self.live, self._thread, self._start, self._jobs = {}, None, threading.Lock(), queue.SimpleQueue()


_OWNER = _Owner()
_ORPHANS: list = []  # e-graphs of a parent process (after fork): kept, never dropped off their thread
os.register_at_fork(after_in_child=_OWNER.forget)
atexit.register(lambda: _OWNER.call(_OWNER.live.clear) if _OWNER.live else None)


class EGraph:
    """An egglog e-graph over Terms (held on ``_Owner``'s thread: any thread may use and drop it)."""

    def __init__(self, tripwires: bool | None = None):
        """``tripwires`` (default: $EGRAPH_OPT_TRIPWIRES; on in tests) checks each iteration for unsound merges."""
        self._number = _OWNER.make()
        self.tripwires = os.environ.get("EGRAPH_OPT_TRIPWIRES") == "1" if tripwires is None else tripwires
        self._run(declarations() + range_rules.DECLARATIONS)
        self._run("\n".join(range_rules.tripwires() if self.tripwires else []))
        self._refs, self._ref_of_term = {}, {}  # structure -> anchor number; term id -> anchor number
        self._loaded: list[Term] = []  # the terms keyed by id above, kept alive: no id is reused
        self._rulesets: set[str] = set()
        self._ops: set[str] = set()  # ops the e-graph can hold: loaded, or made by a loaded rule
        self._waiting: dict[str, list] = {}  # by ruleset: rules whose left side names an op it cannot
        self._ranges_waiting = list(_range_rules())  # (ops it names, text), declared as for rules
        self._axis_facts: list[str] = []  # range_rules.AXIS_FACTS of loaded terms, until a rule asks
        self._axes_asked = False
        self._declare_ranges()

    def _declare_ranges(self) -> None:
        if ready := [text for ops, text in self._ranges_waiting if ops <= self._ops]:
            self._ranges_waiting = [(ops, text) for ops, text in self._ranges_waiting if not ops <= self._ops]
            self._load(ready)

    def __del__(self):
        if (number := getattr(self, "_number", None)) is not None:
            _OWNER.drop(number)

    def _call(self, method: str, *args):
        """egglog's ``method`` of this e-graph, on the owner thread."""
        return _OWNER.call(lambda: getattr(_OWNER.live[self._number], method)(*args))

    def _run(self, text: str):
        try:
            return _OWNER.call(_program, self._number, text)
        except BaseException as e:  # egglog panics surface as BaseException subclasses
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if "tripwire:" in str(e):
                raise InvariantError(str(e)[str(e).index("tripwire:"):]) from None
            raise RuntimeError(f"egglog rejected: {text[:300]}\n{e}") from None

    def add(self, roots: list[Term], intervals: dict[int, tuple[float, float]] | None = None,
            meta: dict[int, tuple] | None = None) -> list[int]:
        """Load terms (intervals, (shape, dtype) by id where known): each root's anchor, one per structure."""
        lines = []
        for t in [t for t in postorder(roots) if id(t) not in self._ref_of_term]:
            key = (t.op, tuple(self._ref_of_term[id(a)] for a in t.args), t.attrs)
            if (ref := self._refs.get(key)) is None:
                ref = self._refs[key] = len(self._refs)
                parts = [OPS[t.op].egg_name, *(f"(Ref {r})" for r in key[1]), *map(literal, t.attrs)]
                lines.append(f"(union (Ref {ref}) ({' '.join(parts)}))")
                lo, hi = (intervals or {}).get(id(t), (-math.inf, math.inf))
                if t.args:  # computed in float64, rounded to nearest: widened outward, as the rules'
                    lo, hi = lo - abs(lo) * range_rules.OUTWARD, hi + abs(hi) * range_rules.OUTWARD
                lines += [f"(set ({end} (Ref {ref})) {literal(float(v))})"
                          for end, v, bounded in (("lo", lo, lo > -_UNBOUNDED), ("hi", hi, hi < _UNBOUNDED)) if bounded]
                if meta and id(t) in meta:
                    lines += _shape_facts(ref, t, *meta[id(t)])
                    self._axis_facts += _axis_facts(ref, key, t, meta)
            self._ref_of_term[id(t)] = ref
            self._loaded.append(t)
            self._ops.add(t.op)
        self._load(lines)
        if self._axes_asked:
            self._load_axis_facts()
        for phase in self._waiting:
            self.add_rules(phase, [])
        self._declare_ranges()
        return [self._ref_of_term[id(r)] for r in roots]

    def _load(self, lines: list[str]) -> None:
        for i in range(0, len(lines), _CHUNK):
            self._run("\n".join(lines[i:i + _CHUNK]))

    def _load_axis_facts(self) -> None:
        """Per-axis facts cost a third of loading a program: loaded once a rule asks for them."""
        self._axes_asked = True
        self._load(self._axis_facts)
        self._axis_facts = []

    def ref(self, term: Term) -> int:
        return self._ref_of_term[id(term)]

    def add_rules(self, phase: str, rules, wait: bool = True) -> None:
        """Declare rules into ruleset ``phase``. A rule whose left side names an op neither the loaded terms
        nor a declared rule's right side makes never matches: it waits for one (declaring ~250 rules costs
        egglog most of a small program's optimization). ``wait=False`` declares every rule now."""
        if phase not in self._rulesets:
            self._run(f"(ruleset {_ruleset(phase)})")
            self._rulesets.add(phase)
        waiting, ready = self._waiting.get(phase, []) + list(rules), []
        while any(now := [not wait or _ops_of(r)[0] <= self._ops for r in waiting]):
            ready += [r for r, ok in zip(waiting, now) if ok]
            self._ops.update(*(_ops_of(r)[1] for r, ok in zip(waiting, now) if ok))
            waiting = [r for r, ok in zip(waiting, now) if not ok]
        self._waiting[phase] = waiting
        if not self._axes_asked and any(range_rules.AXIS_FACTS & r.when.heads() for r in ready):
            self._load_axis_facts()
        self._load([r.egglog(_ruleset(phase)) for r in ready])  # in chunks: a long program costs superlinear time
        self._declare_ranges()

    def size(self) -> int:
        """Number of Tensor e-nodes (anchors included)."""
        out = self._run("(print-size)")
        sizes = out[-1].sizes if out and hasattr(out[-1], "sizes") else []
        return int(sum(n for name, n in sizes if name in BY_EGG_NAME or name == "Ref"))

    def saturate(self, phase: str, *, max_iterations: int, max_enodes: int, max_seconds: float) -> Saturation:
        """Run one ruleset iteration by iteration until it saturates or a limit is reached."""
        report, start = Saturation(phase), time.perf_counter()
        self._analyze()
        for _ in range(max_iterations):
            run_report = self._run(f"(run {_ruleset(phase)} 1)")[-1].report
            self._analyze()
            report.iterations += 1
            for name, n in run_report.num_matches_per_rule.items():
                report.matches[name] = report.matches.get(name, 0) + n
            if not run_report.updated:
                break
            report.enodes = self.size()
            if report.enodes > max_enodes:
                report.stop = f"e-node limit ({max_enodes})"
                break
            if time.perf_counter() - start > max_seconds:
                report.stop = f"time limit ({max_seconds:g} s)"
                break
        else:  # every iteration ran, none saturated
            report.stop = f"iteration limit ({max_iterations})"
        report.seconds, report.enodes = time.perf_counter() - start, self.size()
        return report

    def _analyze(self) -> None:
        """Bring ranges and facts up to date (conditions of the next iteration read them)."""
        self._run(f"(run-schedule (saturate (run {range_rules.RULESET})))")
        if self.tripwires:
            self._run(f"(run {range_rules.TRIPWIRES} 1)")

    def serialize_json(self) -> str:
        return self._call("serialize", []).to_json()

    def to_dot(self) -> str:
        return self._call("serialize", []).to_dot()

    def widget(self):
        """egglog's interactive visualizer of this e-graph: it draws in a live notebook with a browser."""
        from egglog.visualizer_widget import VisualizerWidget
        return VisualizerWidget(egraphs=[self.serialize_json()])

    def snapshot(self) -> Snapshot:
        """Parse the serialized e-graph into e-classes of ENodes (anchors set apart)."""
        nodes = json.loads(self.serialize_json())["nodes"]
        primitive = {n["eclass"]: n["op"] for n in nodes.values() if not n["children"]}
        classes, class_of_ref, bounds, dtypes = {}, {}, {}, {}
        relations = {r: set() for r in RELATIONS}
        for node in nodes.values():
            op, kids = node["op"], node["children"]
            if op in relations:
                relations[op].add(nodes[kids[0]]["eclass"])
            if op == "Ref":
                class_of_ref[int(nodes[kids[0]]["op"])] = node["eclass"]
            elif op == "dtype-of":
                dtypes[nodes[kids[0]]["eclass"]] = json.loads(primitive[node["eclass"]])
            elif op in ("lo", "hi"):
                pair = bounds.setdefault(nodes[kids[0]]["eclass"], [-math.inf, math.inf])
                pair[op == "hi"] = float(primitive[node["eclass"]])
            elif (spec := BY_EGG_NAME.get(op)) is not None and not node.get("subsumed"):
                children = tuple(nodes[c]["eclass"] for c in kids[:spec.arity])
                attrs = tuple(_primitive(nodes[c]["op"], sort) for c, (_, sort) in zip(kids[spec.arity:], spec.attrs))
                classes.setdefault(node["eclass"], []).append(ENode(spec.name, children, attrs))
        return Snapshot(classes=classes, class_of_ref=class_of_ref, dtypes=dtypes, relations=relations,
                        ranges={c: (lo, hi) for c, (lo, hi) in bounds.items()})


def _program(number: int, text: str):
    eg = _OWNER.live[number]
    return eg.run_program(*eg.parse_program(text))


def _axis_facts(ref: int, key: tuple, t: Term, meta: dict) -> list[str]:
    """Each axis's size, the rank, and for a reshape the axes it keeps whole (``lang/mesh.py``)."""
    shape = meta[id(t)][0]
    facts = [f"(set (axis-size (Ref {ref}) {i - len(shape)}) {d})" for i, d in enumerate(shape)]
    facts.append(f"(set (rank (Ref {ref})) {len(shape)})")
    if t.op == "reshape" and id(t.args[0]) in meta:
        of = f"(Ref {key[1][0]}) {literal(t.attrs[0])}"  # the operand, the target
        for a, (b, part) in through_reshape(meta[id(t.args[0])][0], shape).items():
            facts += [f"(set (reshape-axis {of} {a}) {b})", f"(set (reshape-part {of} {a}) {literal(part)})"]
    return facts


def _shape_facts(ref: int, t: Term, shape: tuple, dtype) -> list[str]:
    facts, name = [], str(dtype).removeprefix("torch.")
    if name != "float32":
        facts.append(f"(set (dtype-of (Ref {ref})) {literal(name)})")
    if shape:
        facts.append(f"(set (last-dim (Ref {ref})) {shape[-1]})")
    if not t.args:
        facts.append(f"(set (rank (Ref {ref})) {len(shape)})")
    if 0 not in shape:
        facts.append(f"(nonempty (Ref {ref}))")
    return facts


def _primitive(text: str, sort: str):
    return json.loads(text) if sort == "String" else text == "true" if sort == "bool" else \
        ATTR_SORTS[sort](float(text) if sort == "f64" else int(text))
