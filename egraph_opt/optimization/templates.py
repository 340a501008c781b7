"""Repeated blocks (seed 004): the N identical blocks of a transformer are optimized once.

Hash-consing does not merge chained blocks (their inputs differ): the terms of each instance of a repeated block get a
signature with incoming values as numbered arguments and parameters named relative to the block. Equal signatures
share one template, optimized once over the hull of every instance's argument intervals (its conditions hold for all).

Instances are the items of a module container (``h.0``, ``h.1``...) where the capture recorded them, and otherwise are
found by structure: a plain function looping over lists of weights, an unrolled loop or an exported graph repeats a
run of ops whose operands sit at the same distances back (parameters abstracted to their shapes)."""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from ..lang.program import Program
from ..lang.term import Term, postorder

PREFIX = "tmpl:"
#: smaller instances (a lone Linear or ReLU) are saturated in place: a template would save little
#: and would cut rewrites that cross its boundary (a float32 chain across layers)
MIN_OPS = 8
MAX_REGIONS = 4  #: repeated regions found by structure per program (an encoder and a decoder stack: two)


@dataclass
class Instance:
    scope: str
    terms: list[Term]  # in postorder
    args: list[Term] = field(default_factory=list)  # values from outside, by first use
    params: dict[str, Term] = field(default_factory=dict)  # relative name -> param term
    outputs: list[Term] = field(default_factory=list)  # its terms read outside it
    signature: tuple = ()


def _signature(inst: Instance, parents: dict[int, list[Term]], roots: set[int]) -> None:
    inside = {id(t): i for i, t in enumerate(inst.terms)}
    args, own, keys = {}, {}, []  # own: param id -> its name relative to the instance
    for t in inst.terms:
        operands = []
        for a in t.args:
            if id(a) in inside:
                operands.append(("term", inside[id(a)]))
            elif a.op == "const":
                operands.append(("const", a.attrs[0]))
            elif a.op == "param" and (a.attrs[0].startswith(inst.scope + ".")
                                      or all(id(p) in inside for p in parents[id(a)])):
                # its own: named in its scope, or (a plain function's weights) read only by it
                rel = own.setdefault(id(a), a.attrs[0][len(inst.scope) + 1:]
                                     if a.attrs[0].startswith(inst.scope + ".") else f"param{len(own)}")
                inst.params[rel] = a
                operands.append(("param", rel, a.attrs[1], a.attrs[2]))
            else:
                if id(a) not in args:
                    args[id(a)] = len(inst.args)
                    inst.args.append(a)
                operands.append(("arg", args[id(a)]))
        keys.append((t.op, t.attrs, tuple(operands)))
    inst.outputs = [t for t in inst.terms if id(t) in roots or any(id(p) not in inside for p in parents[id(t)])]
    inst.signature = (tuple(keys), tuple(inside[id(t)] for t in inst.outputs))


def shared(program: Program) -> Program:
    """The program with structurally equal terms one object, as the e-graph holds them: two copies of a value in two
    templates (or in one and the rest) would be optimized apart and round apart (E[t^2] - E[t]^2 beside var: an exact
    0 lost). A term keeps the scope all its copies share."""
    one, new, scopes = {}, {}, defaultdict(set)
    for t in postorder([*program.roots(), *program.own]):
        args = tuple(new[id(a)] for a in t.args)  # attrs as text: -0.0 is not 0.0
        new[id(t)] = one.setdefault((t.op, str(t.attrs), tuple(map(id, args))), t if all(
            x is y for x, y in zip(args, t.args)) else Term.trusted(t.op, args, t.attrs))
        scopes[id(new[id(t)])].add(program.scopes.get(id(t)))
    return replace(program.with_roots({id(t): new[id(t)] for t in program.roots()}), own=tuple(
        new[id(t)] for t in program.own), scopes={i: s.pop() for i, s in scopes.items() if len(s) == 1 and None not in s})


def find(program: Program) -> list[list[Instance]]:
    """Groups of two or more instances of at least ``MIN_OPS`` ops with equal signatures, in
    program order: module items first, then runs found by structure among the other terms."""
    roots = program.roots()
    order = postorder(roots)
    parents: dict[int, list[Term]] = defaultdict(list)
    for t in order:
        for a in t.args:
            parents[id(a)].append(t)
    root_ids = {id(r) for r in roots}
    def grouped(scopes: dict[int, str]) -> list[list[Instance]]:
        instances: dict[str, Instance] = {}
        for t in order:
            if id(t) in scopes:
                instances.setdefault(scopes[id(t)], Instance(scopes[id(t)], [])).terms.append(t)
        groups: dict[tuple, list[Instance]] = defaultdict(list)
        for inst in instances.values():
            _signature(inst, parents, root_ids)
            groups[inst.signature].append(inst)
        return [g for g in groups.values() if len(g) > 1 and g[0].outputs
                and sum(bool(t.args) for t in g[0].terms) >= MIN_OPS]
    found = grouped(program.scopes)
    taken, ops = {id(t) for g in found for inst in g for t in inst.terms}, [t for t in order if t.args]
    at, marks = {id(t): i for i, t in enumerate(ops)}, [i for i, t in enumerate(ops) if id(t) in taken]
    def apart(inst: Instance) -> bool:  # a block found among the other ops straddling a module's: a cycle through it
        return bisect.bisect(marks, at[id(inst.terms[0])]) == bisect.bisect(marks, at[id(inst.terms[-1])])
    return found + [g for g in grouped(_periodic_scopes([t for t in ops if id(t) not in taken])) if all(map(apart, g))]


def _periodic_scopes(ops: list[Term]) -> dict[int, str]:
    """Blocks of the longest periodic runs of ``ops``: op k of a run of period P is in block k // P. Two ops match with
    the same op and attributes and operands the same constants, leaves of one shape, or ops the same distance back."""
    at = {id(t): i for i, t in enumerate(ops)}
    keys: list = []
    for i, t in enumerate(ops):
        operands = tuple(("op", i - at[id(a)]) if id(a) in at
                         else ("const", a.attrs) if a.op == "const"
                         else (a.op, a.attrs[1:]) if a.op in ("param", "input") else ("outside",)
                         for a in t.args)
        keys.append((t.op, t.attrs, operands))
    scopes: dict[int, str] = {}
    for region in range(MAX_REGIONS):
        if (best := _longest_periodic_run(keys)) is None:
            break
        start, period, blocks = _with_first_block(ops, at, keys, *best)
        if blocks < 2:
            break
        for i in range(start, start + period * blocks):
            scopes[id(ops[i])] = f"repeat{region}.{(i - start) // period}"
            keys[i] = ("taken", i)  # matches nothing: the next region is found elsewhere
    return scopes


def _with_first_block(ops: list[Term], at: dict, keys: list, start: int, period: int,
                      blocks: int) -> tuple[int, int, int]:
    """The run moved back a block if one fits (the first block reads the input, not a previous one: its first ops break
    the match); else as far as blocks stay equal: a block begins where the first one's outside reads do (a norm)."""
    def seen_from(first: int, i: int) -> tuple:
        t = ops[i]
        operands = tuple(("outside",) if (id(a) in at and at[id(a)] < first) or a.op == "input"
                         else ("op", i - at[id(a)]) if id(a) in at else keys[i][2][n]
                         for n, a in enumerate(t.args))
        return t.op, t.attrs, operands
    def equal(first: int, count: int) -> bool:
        return first + period * count <= len(ops) and all(
            isinstance(keys[i], tuple) and keys[i][0] != "taken" for i in range(first, first + period * count)) \
            and all(seen_from(first + k * period, first + k * period + i) == seen_from(first, first + i)
                    for k in range(1, count) for i in range(period))
    end = start + period * blocks
    for first in range(start - 1, max(start - period - 1, -1), -1):
        if equal(first, blocks + 1) and all(keys[i][0] != "taken" for i in range(first, end)):
            start, blocks = first, blocks + 1
            break
    return next((first for first in range(max(start - period + 1, 0), start) if equal(first, blocks)),
                start), period, blocks


def _longest_periodic_run(keys: list) -> tuple[int, int, int] | None:
    """(start, period, blocks) of the periodic run matching most ops (the shorter period on a tie): ops that equal the
    op ``period`` later, at least ``MIN_OPS`` in a row (a run shorter than its period is one block short of two: the
    first block's reads from outside). Candidate periods are the commonest gaps between repeats of one key."""
    last, gaps = {}, Counter()
    for i, key in enumerate(keys):
        if key in last and i - last[key] >= MIN_OPS:
            gaps[i - last[key]] += 1
        last[key] = i
    best, most = None, (0, 0)
    for period, _ in gaps.most_common(8):
        run = 0
        for i in range(len(keys) - period - 1, -1, -1):  # run: matches from i on
            run = run + 1 if keys[i] == keys[i + period] else 0
            if run >= MIN_OPS and (run, -period) > most:
                best, most = (i, period, run // period + 1), (run, -period)
    return best


def substitute(roots: list[Term], mapping: dict[int, Term], made: dict | None = None) -> list[Term]:
    """The terms with each term whose id is in ``mapping`` replaced, sharing kept; ``made``: terms earlier
    calls built (by op, attributes, operand ids), so what only shared values feed is built once."""
    new: dict[int, Term] = {}
    for t in postorder(roots):
        args = tuple(new[id(a)] for a in t.args)
        key = (t.op, t.attrs, tuple(map(id, args)))
        if id(t) in mapping:
            new[id(t)] = mapping[id(t)]
        elif all(x is y for x, y in zip(args, t.args)):
            new[id(t)] = t
        elif made is None or key not in made:
            new[id(t)] = Term(t.op, args, t.attrs)
            if made is not None:
                made[key] = new[id(t)]
        else:
            new[id(t)] = made[key]
    return [new[id(r)] for r in roots]


def template_program(first: Instance, meta: dict, params: dict, own: tuple = ()) -> tuple[Program, list[Term]]:
    """The first instance over abstract leaves: ``arg{i}`` inputs and relative-name params, valued as the first's
    (``params``: the program's, by name) where an estimate samples the template's error; the ``own`` calls in it."""
    arg_leaves = [Term.input(f"arg{i}", meta[id(a)][0], str(meta[id(a)][1]).removeprefix("torch."))
                  for i, a in enumerate(first.args)]
    mapping = {id(a): leaf for a, leaf in zip(first.args, arg_leaves)}
    mapping.update({id(p): Term("param", (), (rel, *p.attrs[1:])) for rel, p in first.params.items()})
    values = {rel: params[p.attrs[0]] for rel, p in first.params.items() if p.attrs[0] in params}
    inside = {id(t) for t in first.terms}
    return Program(tuple(arg_leaves), tuple(substitute(first.outputs, mapping)), params=values,
                   own=tuple(substitute([t for t in own if id(t) in inside], mapping))), arg_leaves


def instantiate(template_roots: list[Term], inst: Instance, args: list[Term], made: dict) -> list[Term]:
    """A template's optimized outputs over one instance's actual arguments and parameters, built
    once where earlier instances built the same (``made``, as ``substitute`` takes it)."""
    by_name = {f"arg{i}": a for i, a in enumerate(args)}
    leaves = {id(t): by_name.get(t.attrs[0]) if t.op == "input" else inst.params.get(t.attrs[0])
              for t in postorder(template_roots) if t.op in ("input", "param")}
    return substitute(template_roots, {i: t for i, t in leaves.items() if t is not None}, made)


def outer_program(program: Program, groups: list[list[Instance]], meta: dict) -> Program:
    """The program with every instance's outputs as leaves and its arguments as extra outputs (still computed)."""
    mapping, leaf_meta = {}, {}
    for group in groups:
        for inst in group:
            for k, out in enumerate(inst.outputs):
                name = f"{PREFIX}{inst.scope}:{k}"
                mapping[id(out)] = Term("opaque", (), (name,))
                leaf_meta[name] = meta[id(out)]
    args = substitute([a for group in groups for inst in group for a in inst.args], mapping)
    swapped = _rewrite(program, lambda terms: substitute(terms, mapping))
    return replace(swapped, outputs=(swapped.outputs, tuple(args)), scopes={},
                   leaf_shapes={**program.leaf_shapes, **leaf_meta})


def _rewrite(program: Program, rewrite) -> Program:
    """The program with all its terms (outputs, opaque operands) rewritten in one pass."""
    found = program.roots()
    return program.with_roots({id(old): t for old, t in zip(found, rewrite(found))})


def resolve(outer: Program, groups: list[list[Instance]], templates: list[list[Term]], owns: list[tuple]) -> Program:
    """Instantiate every instance (and its template's ``owns``) into the optimized outer program (its second outputs:
    the instances' arguments), earlier ones first (a later one's arguments may be their outputs)."""
    env: dict[str, Term] = {}
    own: list[Term] = []
    def fill(terms: list[Term]) -> list[Term]:
        return substitute(terms, {id(t): env[t.attrs[0]] for t in postorder(terms)  # built once for all calls
                                  if t.op == "opaque" and t.attrs[0] in env}, made)
    made: dict = {}
    arg_iter = iter(outer.outputs[1])
    pending = [(inst, tmpl, [next(arg_iter) for _ in inst.args], mine)
               for group, tmpl, mine in zip(groups, templates, owns) for inst in group]
    while pending:  # an instance is ready when the instances its arguments read are done
        ready = [p for p in pending if all(t.attrs[0] in env for t in postorder(p[2])
                                           if t.op == "opaque" and t.attrs[0].startswith(PREFIX))]
        if not ready:
            raise RuntimeError("templates depend on each other in a cycle")
        for inst, tmpl, args, mine in ready:
            own += (made_here := instantiate([*tmpl, *mine], inst, fill(args), made))[len(tmpl):]
            env.update((f"{PREFIX}{inst.scope}:{k}", out) for k, out in enumerate(made_here[:len(tmpl)]))
        done = {id(p[0]) for p in ready}
        pending = [p for p in pending if id(p[0]) not in done]
    return replace(_rewrite(replace(outer, outputs=outer.outputs[0]), fill), own=(*fill(list(outer.own)), *own))
