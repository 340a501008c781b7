"""The kernel registry: every kernel says what it computes (a reference pattern, ``(softmax ?x ?a)``, which the tests
evaluate in float64 against it), where it runs and what it accepts. Moving a value between backends (torch <-> numpy)
is a kernel too (``MOVES``, reference ``(move ?x0)``), measured like the others, so a plan pays what its conversions
take. Torch and Triton kernels share one memory: the move between them is the identity and costs nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import torch

from egraph_opt.lang.ops import OPS

from .torch_ops import TORCH, all_finite

FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
ALL_DTYPES = FLOATS | frozenset({"int32", "int64", "bool", "uint8", "int8", "int16"})
HOST, BOTH = frozenset({"cpu"}), frozenset({"cpu", "cuda"})


@dataclass(frozen=True, kw_only=True)
class Use:
    """What one node of a plan asks of a kernel."""
    op: str
    attrs: tuple
    shapes: tuple[tuple[int, ...], ...]  # operand shapes
    dtypes: tuple[str, ...]  # operand dtypes
    device: str  # "cpu" or "cuda"
    layouts: tuple = ()  # operand memory layouts (analysis/layouts.py); (): all contiguous


@dataclass(frozen=True, kw_only=True)
class Kernel:
    name: str
    reference: str  # pattern over the op table: what the kernel computes
    backend: str
    devices: frozenset[str]
    dtypes: frozenset[str]
    impl: Callable
    limits: Callable[[Use], str | None] = field(default=lambda use: None)  # reason to refuse
    takes: Callable | None = None  # a torch operand into this backend's memory (None: as it is)

    @property
    def op(self) -> str:
        return self.reference.strip("(").split()[0]

    @property
    def db_backend(self) -> str:
        """What the latency database keys this kernel's rows by: its backend for the op's own
        kernel there (``torch.softmax``), else its name, so each kernel is measured on its own."""
        return self.backend if self.name == f"{self.backend}.{self.op}" else self.name

    def refuses(self, use: Use) -> str | None:
        """Why this kernel cannot run ``use`` (None when it can)."""
        if use.device not in self.devices:
            return f"{self.name} runs on {sorted(self.devices)}, not {use.device}"
        bad = [d for d in use.dtypes if d not in self.dtypes]
        return f"{self.name} does not take {bad[0]}" if bad else self.limits(use)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    """Conversion kernel: a CPU tensor's memory as a numpy array (no copy when contiguous)."""
    return x.detach().numpy()


def from_numpy(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


# --- torch kernels that compute an op by another formula: the same function, fewer passes or cheaper primitives.
# Each is one declaration in ``REWRITTEN_KERNELS``, with database rows of its own: binding chooses it only where it
# is measured faster than the op's own kernel. tests/test_kernels.py checks each against its reference term.

#: tanh-gelu's constants: 0.5 x (1 + tanh(c (x + k x^3))) = x sigmoid(2c x (1 + k x^2))
_TWO_C, _K = 2.0 * math.sqrt(2.0 / math.pi), 0.044715


def _gelu_tanh_into(y):
    """tanh-gelu of ``y`` as y * sigmoid(y (2c + 2ck y^2)), in one fresh buffer and three passes besides the sigmoid:
    sigmoid costs a third of tanh on CPU, and 1 + tanh(z) = 2 sigmoid(2z) has no cancellation where tanh(z) nears -1.
    The sign of y survives (-0, and y * +0 where the sigmoid underflows); y = -inf gives NaN, as the definition does.
    Where autograd records, the passes are out of place (it keeps the sigmoid's output for the backward)."""
    u = torch.addcmul(torch.full((), _TWO_C, dtype=y.dtype, device=y.device), y, y, value=_TWO_C * _K)
    return y * torch.sigmoid(u * y) if torch.is_grad_enabled() and y.requires_grad else u.mul_(y).sigmoid_().mul_(y)


def linear_gelu_tanh_epilogue(x, weight, bias, activation):
    """A cuBLASLt GEMM adding bias and tanh-gelu (``use_gelu``; erf on CPU). Not relu: a max may turn NaN into 0."""
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def linear_onednn(x, weight, bias):
    """x W^T + b by oneDNN, the bias in its epilogue: addmm first copies it into every output row (a tenth of a
    (512, 1024) GEMM on 2 cores), where oneDNN's call costs ~10 us more: the database says where it pays. No backward:
    where autograd records, or the sum is not finite (summation order), ``linear``."""
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad)):
        if all_finite(out := torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")):
            return out
    return TORCH["linear"](x, weight, bias)


def _onednn(use: Use) -> str | None:
    x, weight, bias = use.shapes
    return None if torch.backends.mkldnn.is_available() and len(weight) == 2 and weight[1] and bias == weight[:1] \
        and set(use.dtypes) == {"float32"} else "oneDNN's linear takes float32, a 2-D weight of K > 0 and its bias"


def _epilogue(use: Use) -> str | None:
    _, weight, bias = use.shapes if len(use.shapes) == 3 else ((), (), None)
    return _only("activation", "gelu_tanh")(use) or (None if len(weight) == 2 and bias == weight[:1] else
                                                      "the epilogue takes a 2-D weight and a bias per output")


def _only(attr: str, value: str) -> Callable:
    """limits: refuse a node whose single string attribute is not ``value``."""
    return lambda use: None if use.attrs[-1] == value else f"only {attr}={value!r}, not {use.attrs[-1]!r}"


class Declared(NamedTuple):
    name: str
    reference: str  # the op's term it computes (a pattern over the op table)
    impl: Callable
    limits: Callable
    dtypes: frozenset = frozenset({"float32", "float64"})  # narrower: each pass would round
    devices: frozenset = BOTH


REWRITTEN_KERNELS = [
    Declared("torch.gelu_tanh_sigmoid", "(gelu ?x0 ?approximate)", lambda x, approximate: _gelu_tanh_into(x),
             _only("approximate", "tanh")),
    Declared("torch.linear_gelu_tanh_sigmoid", "(linear_act ?x0 ?x1 ?x2 ?activation)",
             lambda x, w, b, activation: _gelu_tanh_into(TORCH["linear"](x, w, b)), _only("activation", "gelu_tanh")),
    Declared("torch.linear_gelu_tanh_epilogue", "(linear_act ?x0 ?x1 ?x2 ?activation)",
             linear_gelu_tanh_epilogue, _epilogue, FLOATS, frozenset({"cuda"})),
    Declared("torch.linear_onednn", "(linear ?x0 ?x1 ?x2)", linear_onednn, _onednn, frozenset({"float32"}), HOST)]


def _numpy_unary(fn: Callable) -> Callable:
    """numpy's function, float32 through float64 rounded once: numpy's own float32 loops are less accurate than
    torch's (exp on AVX2: up to 2.4 ulps, 61% correctly rounded, against 0.55 and 99%), which a plan must not trade
    for latency. NaN and inf come as silently as from torch's kernel (numpy warns of sqrt(-1), log(0), overflow)."""
    @np.errstate(all="ignore")
    def run(x: np.ndarray) -> np.ndarray:
        return fn(x.astype(np.float64)).astype(np.float32) if x.dtype == np.float32 else fn(x)
    return run


#: ops that declare a numpy function (``Op.numpy``)
_NUMPY_UNARY = {name: _numpy_unary(getattr(np, op.numpy)) for name, op in OPS.items() if op.numpy}


def _triton_kernels() -> list[Kernel]:
    """On CUDA; on CPU only interpreted, under the test switch (``binding.usable``)."""
    from .triton import TRITON_KERNELS
    half_single = frozenset({"float16", "bfloat16", "float32"})
    return [Kernel(name=f"triton.{op}", reference=OPS[op].reference, backend="triton", devices=BOTH,
                   dtypes=half_single | set(dtypes), impl=impl, limits=limits or (lambda use: None))
            for op, (impl, limits, dtypes) in TRITON_KERNELS.items()]


#: each op's own torch kernel, the torch kernels computing one by another formula, numpy's, Triton's
REGISTRY: dict[str, Kernel] = {k.name: k for k in [
    *(Kernel(name=f"torch.{op}", reference=spec.reference, backend="torch", devices=BOTH,
             dtypes=ALL_DTYPES, impl=TORCH.get(op, spec.impl)) for op, spec in OPS.items() if not spec.is_leaf),
    *(Kernel(backend="torch", **k._asdict()) for k in REWRITTEN_KERNELS),
    *(Kernel(name=f"numpy.{op}", reference=OPS[op].reference, backend="numpy", devices=HOST,
             dtypes=frozenset({"float32", "float64"}), impl=fn, takes=to_numpy) for op, fn in _NUMPY_UNARY.items()),
    *_triton_kernels()]}
MEMORY = {"torch": "torch", "triton": "torch", "numpy": "numpy"}  #: backend -> the memory its kernels read and write


def same(x):
    """The move between backends of one memory: the value itself."""
    return x


def copies(source: str, target: str) -> bool:
    """Whether a value of ``source``'s kernels must be copied for ``target``'s."""
    return MEMORY[source] != MEMORY[target]


def _move(source: str, target: str) -> Kernel:
    fn = to_numpy if MEMORY[target] == "numpy" else from_numpy if MEMORY[source] == "numpy" else same
    return Kernel(name=f"move.{source}->{target}", reference="(move ?x0)", backend=f"{source}->{target}",
                  devices=HOST if "numpy" in (MEMORY[source], MEMORY[target]) else BOTH,
                  dtypes=ALL_DTYPES - {"bfloat16"} if fn is not same else ALL_DTYPES, impl=fn,
                  takes=to_numpy if MEMORY[source] == "numpy" else None)


#: (source, target) backend -> the kernel moving a value between them (rows of its own), every pair
MOVES = {(source, target): _move(source, target) for source in MEMORY for target in MEMORY if source != target}

#: op -> the names of its kernels in REGISTRY (asked per e-node: no scan of REGISTRY each time)
_NAMES = {op: [name for name, k in REGISTRY.items() if k.op == op] for op in OPS}


def kernels_for(op: str) -> list[Kernel]:
    """The kernels of ``op``, in the registry's order, read by name (a kernel replaced under it is returned)."""
    return [REGISTRY[name] for name in _NAMES.get(op, ())]
