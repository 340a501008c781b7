"""Threads (issue 37): optimizing never rewinds another thread's random numbers, e-graphs are made
and dropped on one thread (egglog's are "unsendable": dropped elsewhere, they print a traceback
and leak), and concurrent first calls of one program optimize once."""
from __future__ import annotations

import gc
import threading

import torch

from egraph_opt import saturate_and_extract
from egraph_opt.drivers import api
from egraph_opt.egraph import engine


def _softplus(x):
    return torch.log(1 + torch.exp(x))


def _live() -> int:
    """E-graphs held now (drops posted from other threads done first)."""
    gc.collect()
    return engine._OWNER.call(lambda: len(engine._OWNER.live))


def _together(work, n: int) -> None:
    start = threading.Barrier(n)

    def run(i):
        start.wait()
        work(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)


def test_first_calls_leave_another_threads_random_stream_alone():
    """A thread drawing from the process's generator while two others optimize gets the numbers
    a seeded generator gives, none repeated (fork_rng rewound 123 of 279 draws)."""
    torch.manual_seed(7)
    drawn, done = [], threading.Event()

    def draw():
        while not done.is_set() or len(drawn) < 50:
            drawn.append(torch.rand(1))

    drawer = threading.Thread(target=draw)
    drawer.start()
    try:
        fs = [saturate_and_extract(_softplus, profile_budget=0.2) for _ in range(2)]
        _together(lambda i: fs[i](torch.randn(8 + i, 16, generator=torch.Generator().manual_seed(i))), 2)
    finally:
        done.set()
        drawer.join()
    expected = torch.rand(len(drawn), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(torch.cat(drawn), expected)
    assert all(f.report.optimized for f in fs)


def test_concurrent_first_calls_optimize_once_print_nothing_and_hold_one_egraph(capfd):
    before = _live()
    g = saturate_and_extract(_softplus, profile_budget=0)
    x = torch.randn(4, 8)
    outs = [None] * 4

    def call(i):
        outs[i] = g(x)
    _together(call, 4)
    assert len(g.plans) == 1 and g.report.optimized
    for out in outs:
        torch.testing.assert_close(out, _softplus(x))
    assert _live() - before <= 1
    assert capfd.readouterr().err == ""


def test_plans_made_on_alternating_threads_drop_their_egraphs_quietly(monkeypatch, capfd):
    """Each new plan drops the last one's e-graph, made on the other thread: nothing printed, and
    the e-graphs held stay one, not one per shape (1.7-2.0 GB against 0.86 GB in the issue);
    evicted plans too."""
    monkeypatch.setattr(api, "MAX_PLANS", 3)
    before = _live()
    g = saturate_and_extract(_softplus, profile_budget=0)
    for n in range(2, 8):
        t = threading.Thread(target=g, args=(torch.randn(n, 4),))
        t.start()
        t.join()
    assert len(g.plans) == 3 and _live() - before <= 1
    del g
    assert _live() <= before
    assert capfd.readouterr().err == ""


def test_e_graphs_dropped_in_reference_cycles_are_freed_as_new_ones_crowd_in():
    """egglog holds an e-graph's memory where the cycle collector does not count it (a decorated
    forward of a model is a cycle): with no collection due by object counts, making e-graphs
    still frees the unreachable ones (the suite's workers grew to 14 GB without it): at most twice as many live as
    are reachable, however many were made (enough that earlier tests' threshold is passed)."""
    before, kept = _live(), engine.EGraph()
    gc.disable()
    try:
        for _ in range(engine._OWNER._crowd + 4 * (before + 4)):
            e = engine.EGraph()
            e.me = e  # unreachable after the next line but for a collection
            del e
        live = engine._OWNER.call(lambda: len(engine._OWNER.live))
    finally:
        gc.enable()
    assert live <= max(4, 2 * (before + 1)), live
    assert kept._number in engine._OWNER.live  # what is referenced stays


class _Gelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) + 1


def test_captures_on_two_threads_leave_module_calls_working():
    """fx patches ``nn.Module.__call__`` for the whole process while it traces: two traces at once
    left every later module call going to a stale tracer ("module is not installed as a
    submodule"), and each plan of a module made after fell back (5 tests of a CI run)."""
    from egraph_opt.frontends.capture import capture
    programs = [[], []]

    def work(i):
        module = _Gelu()
        for _ in range(30):
            programs[i].append(capture(module, (torch.randn(2, 4),))[0])
    _together(work, 2)
    assert [len(p) for p in programs] == [30, 30]
    module, x = _Gelu(), torch.randn(3, 4)
    torch.testing.assert_close(module(x), torch.nn.functional.gelu(x @ module.linear.weight.T + module.linear.bias) + 1)


def test_a_decorated_function_called_in_anothers_trace_is_inlined_quietly(recwarn):
    """The trace sees through it (it fell back, with a warning, on its Proxy argument); called for
    real (the outer's validation runs the original), it optimizes as usual."""
    inner = saturate_and_extract(_softplus, profile_budget=0)
    outer = saturate_and_extract(lambda x: inner(x) * 2, profile_budget=0)
    x = torch.randn(4, 8)
    torch.testing.assert_close(outer(x), _softplus(x) * 2)
    assert outer.report.optimized and "softplus" in str(outer.report)
    assert all(plan.run is not None for plan in inner.plans.values())  # none for a Proxy argument
    assert not [w for w in recwarn if "egraph-opt" in str(w.message)]
