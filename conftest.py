"""Environment of every test, doctests in the packages included."""
import gc
import os
import sys
import tempfile

# The clone's root comes after what is installed: ``python -m pytest`` puts it first on sys.path, where its
# ``kernels`` folder (installed as ``egraph_opt.kernels``) hid Hugging Face's ``kernels`` package, which
# transformers 5.25 imports (every model import failed). Its ``tests`` and ``bench`` stay importable
ROOT = os.path.dirname(os.path.abspath(__file__))
_root = [p for p in sys.path if os.path.abspath(p or os.curdir) == ROOT]
sys.path[:] = [p for p in sys.path if p not in _root] + [ROOT] * bool(_root)

os.environ.setdefault("EGRAPH_OPT_TRIPWIRES", "1")  # invariant tripwires on in every test
os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU here: Triton kernels run interpreted
# static estimates unless a test asks for timing: the same plans on every machine and run
os.environ.setdefault("EGRAPH_OPT_PROFILE_BUDGET", "0")
# never the user's latency database: one per test session, empty (roofline defaults)
os.environ.setdefault("EGRAPH_OPT_PROFILE_DB",
                      os.path.join(tempfile.mkdtemp(prefix="egraph-opt-tests-"), "profile.sqlite"))
# xdist's workers share the cores: each takes its share for torch's intra-op threads (this process's
# and the subprocesses' it starts). Two workers of two threads on two cores wait at every parallel
# op's barrier for a core the other holds: a 10 us conv2d took 16 ms, the suite several times longer
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_configure(config):
    """A test that asks for timing gets it whatever the machine's load (a busy machine times
    nothing: ``profiler.machine_busy``; a row timed at thousands of times its roofline is left
    out: ``latency.IMPLAUSIBLE``), so it asserts the same on every run; those paths have tests of
    their own."""
    from egraph_opt.profiling import latency

    latency.machine_busy = lambda: None
    latency.IMPLAUSIBLE = float("inf")  # nor is a row timed under load left out (its own test sets it)


def pytest_collection_finish(session):
    """What is alive once the suite is collected (torch, the test modules and what they import) lives
    to the end: it is frozen out of the cycle collector, whose full passes over it cost a worker about
    half of their time (test_fusion.py: 3.7 s of 40 in 12 passes, 1.9 s frozen). Later objects are
    collected as ever."""
    gc.collect()
    gc.freeze()
