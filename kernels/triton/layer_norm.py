"""Layer norm over the last dim, with optional affine weight and bias (``F.layer_norm``): the generated kernel of the
op alone, so a region's layer norm and this one are one code (codegen's ``STATS``, steps in ``mathlib``): per row, the
mean, then the variance as the mean of squared deviations (E[x^2] - E[x]^2 cancels), then the output, in float32; a
row past 2^32 in magnitude scaled by a power of two (its squares could overflow float32)."""
from __future__ import annotations

import functools

import torch

from egraph_opt.lang.term import Term, dtype_name

from .generated import generate_elementwise
from .layout import ROW_CONFIGS
from .runtime import implements


@functools.cache
def _kernel(dtype: str, eps: float, weight: bool, bias: bool):
    """The kernel for x of ``dtype`` (its result's too), a (C,) weight and bias where given, else 1 and 0."""
    affine = [Term.input(name, (2,), dtype) if given else Term.const(none)
              for name, given, none in (("w", weight, 1.0), ("b", bias, 0.0))]
    return generate_elementwise(Term("cast", (Term("layer_norm", (Term.input("x", (2, 2), dtype), *affine),
                                                   (eps,)),), (dtype,)))


@implements("layer_norm", limits=lambda use: None if len(use.shapes) == 3 and all(use.shapes)
            else "affine parameters must be tensors", configs=ROW_CONFIGS)
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, *, config: dict | None = None) -> torch.Tensor:
    kernel = _kernel(dtype_name(x.dtype), float(eps), weight is not None, bias is not None)
    return kernel(*(t for t in (x, weight, bias) if t is not None), config=config)
