"""``generate_elementwise``: compile a term to a Triton kernel, once per structure and process.

``@triton.jit`` reads its function's source from a file: the generated text is written to the cache directory under
its hash (atomically: processes may race), and what runs is that text itself, compiled under the file's name and given
to linecache, which Triton reads: never the file as found, nor bytecode an importer would take from ``__pycache__`` (a
planted .pyc with the .py's timestamp and size). The cache directory is used only where it is the user's alone."""
from __future__ import annotations

import functools
import linecache
import os
import stat
import sys
import tempfile
import types
from pathlib import Path

import torch
import triton

from egraph_opt.lang.term import Term, evaluate

from ..torch_ops import TORCH
from .codegen import REDUCTIONS, KernelSource, lower, span
from .layout import ROW_CONFIGS, row_block
from .runtime import tuned

CACHE_ENV, DTYPES = "EGRAPH_OPT_CACHE", (torch.float16, torch.bfloat16, torch.float32, torch.bool)  # a mask: 1.0, 0.0

_kernels: dict[Path, object] = {}  # generated file -> its @triton.jit kernel
_checked: set[Path] = set()  # cache directories found private in this process


def _private(directory: Path) -> None:
    """Create the directory for this user only; refuse one where another user could plant code: it and all in it
    (``__pycache__`` included) must be the user's, writable by nobody else. Checked once per process and directory."""
    if directory in _checked:
        return
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    inside = [Path(folder, n) for folder, names, files in os.walk(directory) for n in names + files]
    for path, info in [(directory, directory.stat()), *((p, p.lstat()) for p in inside)]:
        why = ("owned by another user" if info.st_uid != os.getuid() else None if stat.S_ISLNK(info.st_mode) else
               "world-writable" if info.st_mode & stat.S_IWOTH else
               "group-writable" if info.st_mode & stat.S_IWGRP else None)
        if why:
            where = "" if path == directory else f" (its {path.relative_to(directory)})"
            raise PermissionError(f"kernel cache {directory}{where} is {why}, so generated kernels are "
                                  f"not loaded from it: set {CACHE_ENV} to a directory of your own")
    _checked.add(directory)


def _load(program: KernelSource) -> object:
    """``program``'s kernel: its text written under its hash, then run as that file's module;
    linecache holds the text (an entry without mtime is never reloaded) for ``@triton.jit``."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "egraph_opt"
    directory = Path(os.environ.get(CACHE_ENV) or home) / "triton"
    path, source = directory / f"k_{program.digest}.py", program.source
    if path not in _kernels:
        _private(directory)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, suffix=".tmp", delete=False) as f:
            f.write(source)
        os.replace(f.name, path)
        module = types.ModuleType(f"egraph_opt_generated_{program.digest}")
        module.__file__ = str(path)
        sys.modules[module.__name__] = module
        linecache.cache[str(path)] = (len(source), None, source.splitlines(keepends=True), str(path))
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
        _kernels[path] = module.kernel
    return _kernels[path]


class GeneratedKernel:
    """A Triton kernel computing ``term`` (codegen's regions); ValueError names any op it cannot generate. ``kernel`` is
    shared by every structurally equal term. Where autograd records, the ops' torch kernels run (``separate``: a
    generated kernel has no backward). ``configs``: as a hand kernel's (``runtime.implements``)."""

    configs = [c.all_kwargs() for c in ROW_CONFIGS]

    def __init__(self, term: Term):
        self.term, self.program = term, lower(term)
        self.kernel = _load(self.program)
        self.__name__ = self.__qualname__ = f"generated_{self.program.digest[:12]}"  # a plan's node

    def __call__(self, *tensors: torch.Tensor, config: dict | None = None, **inputs: torch.Tensor) -> torch.Tensor:
        """Inputs by name, or their values in ``program.inputs``' order; ``config``: of ``configs`` (None: first)."""
        names, reduction = self.program.inputs, self.program.reduction
        inputs = dict(zip(names, tensors)) if tensors else inputs
        if set(inputs) != set(names):
            raise TypeError(f"expected inputs {sorted(names)}, got {sorted(inputs)}")
        tensors = [inputs[name].contiguous() for name in names]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.separate(*tensors)
        whole = [t.shape for i, t in enumerate(tensors) if i not in self.program.broadcast]
        shape = whole[0] if whole else torch.broadcast_shapes(*(t.shape for t in tensors))
        spans = {i: span(tensors[i].shape, shape) for i in self.program.broadcast}
        if None in spans.values() or any(t.dtype not in DTYPES or i not in spans and t.shape != shape
                                         for i, t in enumerate(tensors)):
            raise ValueError(f"inputs {[f'{t.dtype} {tuple(t.shape)}' for t in tensors]}: each of a dtype "
                             f"of {DTYPES} and broadcasting to {tuple(shape)} as the term's inputs do")
        if reduction and not shape:
            raise ValueError(f"{reduction} over axis -1 needs an input of rank >= 1")
        dtypes = [getattr(torch, self.program.dtype)] if self.program.dtype else [t.dtype for t in tensors]
        n = shape[-1] if reduction else shape.numel()  # a row's length, or every element
        launch = tuned(config, ROW_CONFIGS, row_block, BLOCK=n)
        grid = shape[:-1].numel() if reduction else triton.cdiv(n, launch["BLOCK"])  # a program per row, or block
        shape = shape[:-1] + ((1,) if self.program.keepdim else ()) if reduction in REDUCTIONS else shape
        out = torch.empty(shape, dtype=functools.reduce(torch.promote_types, dtypes), device=tensors[0].device)
        if out.numel():
            divmods = [x for i in self.program.broadcast for x in spans[i]]  # after the scalars, as lower puts them
            self.kernel[(grid,)](out, *tensors, *self.program.consts, *divmods, n, **launch)
        return out

    def separate(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The term on the ops' torch kernels, the inputs in ``program.inputs``' order."""
        return evaluate([self.term], dict(zip(self.program.inputs, tensors)), kernels=TORCH)[0]


generate_elementwise = GeneratedKernel  #: compile a term to a Triton kernel, once per structure
