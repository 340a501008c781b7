"""``generate_elementwise``: compile a term to a Triton kernel, once per structure.

``@triton.jit`` reads its function's source from a real file, so the generated text is written
to the cache directory under its hash (atomically: processes may race). Kernels are kept per
process by that hash; the file also lets Triton's own on-disk cache skip recompiling in the next
process. What runs is the generated text itself, compiled under the file's name (and given to
linecache, which Triton reads): never the file as found, nor bytecode an importer would take from
``__pycache__`` (a planted .pyc with the .py's timestamp and size). And the cache directory is used
only where it and everything in it are the user's and writable by nobody else, group included.
"""
from __future__ import annotations

import linecache
import os
import stat
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from egraph_opt.lang.term import Term, evaluate

from ..torch_ops import TORCH
from .codegen import KernelSource, lower
from .layout import row_block

CACHE_ENV = "EGRAPH_OPT_CACHE"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_kernels: dict[Path, object] = {}  # generated file -> its @triton.jit kernel
_checked: set[Path] = set()  # cache directories found private in this process


def cache_dir() -> Path:
    """``$EGRAPH_OPT_CACHE/triton``, else ``egraph_opt/triton`` under the user's cache dir."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "egraph_opt"
    return Path(root) / "triton"


def _private(directory: Path) -> None:
    """Create the directory for this user only; refuse one where another user could plant code:
    it, and everything in it (``__pycache__`` included), must be the user's and writable by nobody
    else. Checked once per process and directory."""
    if directory in _checked:
        return
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = [(directory, directory.stat())]
    for folder, names, files in os.walk(directory):
        found += [(Path(folder, n), os.lstat(os.path.join(folder, n))) for n in names + files]
    for path, info in found:
        why = ("owned by another user" if info.st_uid != os.getuid() else
               None if stat.S_ISLNK(info.st_mode) else
               "world-writable" if info.st_mode & stat.S_IWOTH else
               "group-writable" if info.st_mode & stat.S_IWGRP else None)
        if why:
            where = "" if path == directory else f" (its {path.relative_to(directory)})"
            raise PermissionError(f"kernel cache {directory}{where} is {why}, so generated kernels are "
                                  f"not loaded from it: set {CACHE_ENV} to a directory of your own")
    _checked.add(directory)


def _holds(path: Path, source: str) -> bool:
    """Whether the file holds exactly ``source`` (the text its name is the hash of)."""
    expected = source.encode()
    try:
        with open(path, "rb") as f:
            return f.read(len(expected) + 1) == expected
    except OSError:
        return False


def _load(program: KernelSource) -> object:
    directory = cache_dir()
    path = directory / f"k_{program.digest}.py"
    if path not in _kernels:
        _private(directory)
        if not _holds(path, program.source):
            with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, suffix=".tmp",
                                             delete=False) as f:
                f.write(program.source)
            os.replace(f.name, path)
        _kernels[path] = _run(program.source, path, f"egraph_opt_generated_{program.digest}").kernel
    return _kernels[path]


def _run(source: str, path: Path, name: str) -> types.ModuleType:
    """Run ``source`` as the module of file ``path``: the text checked, not what an importer would
    find there. linecache holds the same text (an entry without mtime is never reloaded), so the
    source ``@triton.jit`` reads for the kernel is the source that ran."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    linecache.cache[str(path)] = (len(source), None, source.splitlines(keepends=True), str(path))
    exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    return module


@dataclass(frozen=True)
class GeneratedKernel:
    """A generated kernel bound to one term's inputs and constants; call it with the inputs by
    name. ``kernel`` is shared by every structurally equal term."""

    program: KernelSource
    kernel: object

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        names = set(self.program.inputs)
        if set(inputs) != names:
            raise TypeError(f"expected inputs {sorted(names)}, got {sorted(inputs)}")
        tensors = [inputs[name].contiguous() for name in self.program.inputs]
        first = tensors[0]
        for name, t in zip(self.program.inputs, tensors):
            if t.shape != first.shape or t.dtype != first.dtype or t.dtype not in DTYPES:
                raise ValueError(f"input {name!r} is {t.dtype} {tuple(t.shape)}; all inputs must "
                                 f"share one shape and one dtype of {DTYPES}")
        args = (*tensors, *self.program.consts)
        if self.program.reduction is None:
            out = torch.empty_like(first)
            n = first.numel()
            block = row_block(n)
            if n:
                self.kernel[(triton.cdiv(n, block),)](out, *args, n, BLOCK=block)
            return out
        if first.dim() == 0:
            raise ValueError(f"{self.program.reduction} over axis -1 needs an input of rank >= 1")
        n_cols = first.shape[-1]
        kept = (1,) if self.program.keepdim else ()
        out = torch.empty(first.shape[:-1] + kept, dtype=first.dtype, device=first.device)
        if out.numel():
            self.kernel[(out.numel(),)](out, *args, n_cols, BLOCK=row_block(n_cols))
        return out


def generate_elementwise(term: Term) -> GeneratedKernel:
    """A Triton kernel computing ``term`` (elementwise ops over same-shape inputs, optionally
    under one root sum/max/mean over axis -1). Raises ValueError naming any op it cannot
    generate. Structurally equal terms reuse one compiled kernel."""
    program = lower(term)
    return GeneratedKernel(program, _load(program))


class RegionKernel:
    """The generated kernel of a region of a plan's elementwise ops, ``term`` over inputs ``x0``,
    ``x1``..., called with their values in order. Where autograd records, the ops' torch kernels
    run instead (a generated kernel has no backward): the separate kernels it is priced against."""

    def __init__(self, term: Term):
        self.term, self.generated = term, generate_elementwise(term)
        self.__name__ = self.__qualname__ = f"generated_{self.generated.program.digest[:12]}"

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.separate(*tensors)
        return self.generated(**{f"x{i}": t for i, t in enumerate(tensors)})

    def separate(self, *tensors: torch.Tensor) -> torch.Tensor:
        return evaluate([self.term], {f"x{i}": t for i, t in enumerate(tensors)}, kernels=TORCH)[0]
