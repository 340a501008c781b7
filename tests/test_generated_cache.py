"""Generated Triton kernels run from the cache only when it is safe: a directory of the user's that
no one else can write (group included), everything in it too, and what runs is the generated
text, never a file or bytecode found there. Kernels run under TRITON_INTERPRET=1
(tests/conftest.py) on CPU tensors."""
import importlib.util
import marshal
import os

import pytest
import torch

pytest.importorskip("triton")

from egraph_opt.kernels.triton import codegen, generate_elementwise  # noqa: E402
from egraph_opt.lang.term import Term  # noqa: E402


def _term(value: float) -> Term:
    """A kernel no other test generates (its constant is in the source), so no process cache."""
    x = Term.input("x", (3, 5))
    return Term("mul", (Term("exp", (x,)), Term.const(value)))


def _planted(folder, term, marker) -> str:
    """Put code that leaves a marker file where the kernel of ``term`` is cached."""
    path = folder / f"k_{codegen.lower(term).digest}.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()\nkernel = None\n")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EGRAPH_OPT_CACHE", str(tmp_path))
    return tmp_path / "triton"


def test_a_tampered_cached_kernel_is_rewritten_not_run(cache, tmp_path):
    cache.mkdir(mode=0o700)
    term, marker = _term(1.25), tmp_path / "ran"
    path = _planted(cache, term, marker)
    x = torch.randn(3, 5)
    torch.testing.assert_close(generate_elementwise(term)(x=x), torch.exp(x) * 1.25)
    assert not marker.exists()
    assert path.read_text() == codegen.lower(term).source


def _pycache(d, mode):
    (d / "__pycache__").mkdir()
    os.chmod(d / "__pycache__", mode)


@pytest.mark.parametrize("unsafe, why", [
    (lambda d: os.chmod(d, 0o777), "is world-writable"),
    (lambda d: os.chmod(d, 0o770), "is group-writable"),
    (lambda d: _pycache(d, 0o770), r"\(its __pycache__\) is group-writable"),
    (lambda d: _pycache(d, 0o757), r"\(its __pycache__\) is world-writable"),
    pytest.param(lambda d: os.chown(d, os.getuid() + 1, -1), "is owned by another user",
                 marks=pytest.mark.skipif(os.getuid() != 0, reason="root gives files away")),
])
def test_a_cache_directory_others_can_write_is_refused(cache, tmp_path, unsafe, why):
    cache.mkdir()
    term, marker = _term(2.5), tmp_path / "ran"
    _planted(cache, term, marker)
    unsafe(cache)
    with pytest.raises(PermissionError, match=f"kernel cache .*{why}.*EGRAPH_OPT_CACHE"):
        generate_elementwise(term)
    assert not marker.exists()


def test_the_cache_directory_is_created_private(cache):
    generate_elementwise(_term(3.75))
    assert cache.stat().st_mode & 0o777 == 0o700


def test_planted_bytecode_never_runs(cache, tmp_path):
    """A .pyc in __pycache__ stamped with the cached source's mtime and size: Python's importer
    would run it in place of the (correct) source."""
    cache.mkdir(mode=0o700)
    term, marker = _term(4.5), tmp_path / "ran"
    source = cache / f"k_{codegen.lower(term).digest}.py"
    source.write_text(codegen.lower(term).source)
    info = source.stat()
    pyc = importlib.util.cache_from_source(str(source))
    os.makedirs(os.path.dirname(pyc), mode=0o700)
    planted = compile(f"open({str(marker)!r}, 'w').close()\nkernel = None\n", str(source), "exec")
    with open(pyc, "wb") as f:
        f.write(importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") +
                (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") +
                (info.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(planted))
    x = torch.randn(3, 5)
    torch.testing.assert_close(generate_elementwise(term)(x=x), torch.exp(x) * 4.5)
    assert not marker.exists()
