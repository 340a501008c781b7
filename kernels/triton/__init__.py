"""Triton kernels for the fused ops; each is checked against its reference term.

Each wrapper takes torch tensors with the signature of the matching op's implementation in
``egraph_opt.lang.ops`` (``cross_entropy`` and ``linear_act`` have none yet: see their docstrings), so
a plan can bind a node to it. Without Triton installed the package still imports: the names are
then stubs raising RuntimeError, and :func:`available` is False.
"""
from .runtime import HAVE_TRITON, available, unavailable

NEEDS_TRITON = ("softmax", "log_softmax", "logsumexp", "cross_entropy", "layer_norm", "sdpa",
                "linear_act", "generate_elementwise")

if HAVE_TRITON:
    from .attention import sdpa
    from .cross_entropy import cross_entropy
    from .generated import generate_elementwise
    from .layer_norm import layer_norm
    from .linear import linear_act
    from .softmax import log_softmax, logsumexp, softmax
else:
    globals().update({name: unavailable(name) for name in NEEDS_TRITON})

__all__ = [*NEEDS_TRITON, "available"]
