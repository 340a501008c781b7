"""Triton kernels, each checked against its reference term.

A kernel module declares the op it implements, and its limits, with :func:`runtime.implements`; importing the package
imports every module, so a new kernel is one file the registry finds in :data:`TRITON_KERNELS`. A wrapper takes the
arguments of the op's implementation in ``egraph_opt.lang.ops``, so a plan can bind a node to it. Without Triton the
package still imports (CPU CI): it declares no kernels, and its names are stubs that raise RuntimeError when called."""
import importlib
import pkgutil

from .runtime import HAVE_TRITON, TRITON_KERNELS, available, on_cpu, unavailable  # noqa: F401 - exported

if HAVE_TRITON:
    for _module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{_module.name}")
    from .generated import generate_elementwise  # noqa: F401

    globals().update({wrapper.__name__: wrapper for wrapper, *_ in TRITON_KERNELS.values()})
else:
    def __getattr__(name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return unavailable(name)
