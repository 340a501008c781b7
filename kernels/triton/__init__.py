"""Triton kernels for the fused ops; each is checked against its reference term.

A kernel module declares the op it implements, and its limits, with :func:`runtime.implements`;
importing the package imports every module, so the registry finds them in :data:`KERNELS` and a
new kernel is one file. Each wrapper takes torch tensors with the signature of the op's
implementation in ``egraph_opt.lang.ops``, so a plan can bind a node to it. Without Triton
installed the package still imports: it declares no kernels, its names are stubs raising
RuntimeError, and :func:`available` is False.
"""
import importlib
import pkgutil

from .runtime import HAVE_TRITON, KERNELS, available, on_cpu, unavailable  # noqa: F401 - exported

if HAVE_TRITON:
    for _module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{_module.name}")
    from .generated import generate_elementwise  # noqa: F401

    globals().update({wrapper.__name__: wrapper for wrapper, *_ in KERNELS.values()})
else:
    def __getattr__(name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return unavailable(name)
