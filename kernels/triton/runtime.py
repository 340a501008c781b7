"""Whether Triton can run here, and the stub each kernel becomes where it cannot (the package docstring says why)."""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable

_log = logging.getLogger(__name__)

try:
    import triton  # noqa: F401  (the import is the test)

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

#: the test switch: Triton kernels take CPU tensors, interpreted (``TRITON_INTERPRET=1``), and binding prefers them
#: wherever one accepts a node, so CI runs every plan path with Triton kernels (interpreter timings mean nothing)
ON_CPU = "EGRAPH_OPT_TRITON_ON_CPU"


def on_cpu() -> bool:
    """Whether the test switch is on (and Triton interpreted, so it can take CPU tensors)."""
    return HAVE_TRITON and os.environ.get(ON_CPU) == "1" and os.environ.get("TRITON_INTERPRET") == "1"


def available(device: str = "cuda") -> bool:
    """Whether Triton kernels can run on ``device``: natively on CUDA (``triton`` importable and a
    device present), on CPU only under the test switch.

    >>> isinstance(available(), bool)
    True
    """
    return on_cpu() if device == "cpu" else _native()


@functools.cache
def _native() -> bool:
    if not HAVE_TRITON:
        _log.warning("triton is not installed: the Triton kernels are unavailable (pip install 'egraph-opt[triton]')")
        return False
    import torch
    return torch.cuda.is_available()


def unavailable(name: str):
    """A stand-in for kernel ``name`` that explains, when called, why it cannot run."""
    def stub(*args, **kwargs):
        raise RuntimeError(f"Triton kernel {name!r} needs the triton package, which is not "
                           "installed (pip install 'egraph-opt[triton]')")
    stub.__name__ = name
    return stub


#: op -> (wrapper, limits, dtypes): the Triton kernels this package's modules declare, for the registry. ``limits(use)``
#: is a reason to refuse a ``registry.Use``, or None; ``dtypes``, operand dtypes besides half and single floats.
TRITON_KERNELS: dict[str, tuple[Callable, Callable | None, tuple[str, ...]]] = {}


def implements(op: str, limits: Callable | None = None, dtypes: tuple[str, ...] = (), configs: list = ()):
    """Declares the decorated wrapper as the Triton kernel for ``op`` (the op's implementation's signature, and a
    keyword ``config``), within ``limits``, taking ``dtypes`` too; ``configs`` (``triton.Config``, the default first)
    are what the profiler times it in, as ``wrapper.configs`` (the dicts the database records)."""
    def declare(wrapper):
        TRITON_KERNELS[op] = (wrapper, limits, dtypes)
        wrapper.configs = [c.all_kwargs() for c in configs]
        return wrapper
    return declare


def tuned(config: dict | None, configs: list, fit: Callable, **dims: int) -> dict:
    """The launch options of ``config`` (None: the first of ``configs``), each tile ``fit(dim, tile)``."""
    chosen = config or configs[0].all_kwargs()
    return chosen | {name: fit(n, chosen[name]) for name, n in dims.items()}
