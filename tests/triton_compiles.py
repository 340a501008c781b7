"""Run as a script (no TRITON_INTERPRET): calls every Triton kernel of the registry (each of its tuned
configurations too, with its warps and stages), and generated
kernels of every codegen template, on CPU tensors in each dtype, with every launch compiled for an
NVIDIA Hopper GPU (sm_90) instead of run, and prints one line per failure. The interpreter accepts
what the compiler refuses (a global that is no constexpr, a dot's precision for half operands):
only compiling shows it, and no GPU is needed. With TRITON_COMPILES_SHARD=i/n it makes every launch but compiles
only every n-th, from the i-th on (each process makes them in the same order), so that n processes
compile the whole set side by side."""
import math
import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
         torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
compiled, failures = set(), []
SHARD, SHARDS = map(int, os.environ.get("TRITON_COMPILES_SHARD", "0/1").split("/"))
here = []  # the launches this shard compiled


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    return "fp32"


def compile_instead(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run``: the launch's signature and constexprs, compiled for sm_90, once each."""
    values = dict(zip([p.name for p in self.params], args)) | kwargs
    signature, constexprs = {}, {}
    for p in self.params:
        value = values.get(p.name, p.default)
        if p.is_constexpr or value is None:
            signature[p.name], constexprs[p.name] = "constexpr", value
        else:
            signature[p.name] = _type(value)
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "num_ctas") if k in kwargs}
    key = (self.fn.__module__, self.fn.__qualname__, tuple(signature.items()),  # generated: a module each
           tuple(map(str, constexprs.items())), tuple(options.items()))
    if key not in compiled:
        compiled.add(key)
        if len(compiled) % SHARDS != SHARD:  # every shard makes the launches in one order: round robin
            return
        here.append(key)
        try:
            triton.compile(ASTSource(self, signature, constexprs), target=GPUTarget("cuda", 90, 32), options=options)
        except Exception as e:  # noqa: BLE001 - reported, one line each
            failures.append(f"{self.fn.__qualname__} {signature} {constexprs} {options}: "
                            f"{type(e).__name__}: {' '.join(str(e).split())[-300:]}")


def main() -> None:
    JITFunction.run = compile_instead
    from egraph_opt.kernels.registry import REGISTRY
    from egraph_opt.lang.ops import OPS

    R = torch.randn
    examples = {  # operands (float ones cast to each dtype) and attributes, variants of constexprs
        "softmax": [([R(3, 37)], (-1,)), ([R(2, 1500)], (-1,))],
        "log_softmax": [([R(3, 37)], (-1,)), ([R(2, 1500)], (-1,))],
        "logsumexp": [([R(4, 21)], (-1, True))],
        "layer_norm": [([R(3, 24), R(24), R(24)], (1e-5,)), ([R(3, 24), None, None], (1e-5,))],
        "sdpa": [([R(2, 9, 64), R(2, 7, 64), R(2, 7, 64)], (0.125, c)) for c in (False, True)]
        + [([R(2, 9, 128), R(2, 7, 128), R(2, 7, 128)], (0.1, True))],
        "sdpa_masked": [([R(2, 9, 64), R(2, 7, 64), R(2, 7, 64),
                          R(9, 7).masked_fill(R(9, 7) > 1, -math.inf)], (0.125,))],
        "sdpa_filled": [([R(2, 9, 64), R(2, 7, 64), R(2, 7, 64),
                          torch.ones(9, 7, dtype=torch.bool).tril()], (0.125, -3.4e38))],
        "linear_act": [([R(5, 32), R(48, 32), R(48)], (a,)) for a in ("relu", "gelu", "gelu_tanh")],
        "cross_entropy": [([R(6, 1100), torch.tensor([0, 1099, -100, 5, 700, 3])], ("mean", -100))],
    }
    kernels = [k for k in REGISTRY.values() if k.backend == "triton"]
    missing = [k.op for k in kernels if k.op not in examples]
    if missing:
        sys.exit(f"no example operands for the Triton kernels of {missing}")
    for kernel in kernels:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for operands, attrs in examples[kernel.op]:
                cast = [x.to(dtype) if x is not None and x.is_floating_point() and x.dim() > 1
                        or kernel.op == "layer_norm" and x is not None else x for x in operands]
                try:
                    kernel.impl(*cast, *attrs)
                except Exception as e:  # noqa: BLE001 - the wrapper, not the kernel: its output
                    if "compile" in str(e).lower():  # is empty, its checks after a launch may fail
                        failures.append(f"{kernel.name}: {e}")
        operands, attrs = examples[kernel.op][0]  # each tuned configuration, once: in float16
        for config in kernel.impl.configs[1:]:
            cast = [x.half() if x is not None and x.is_floating_point() else x for x in operands]
            try:
                kernel.impl(*cast, *attrs, config=config)
            except Exception as e:  # noqa: BLE001 - as above
                if "compile" in str(e).lower():
                    failures.append(f"{kernel.name} {config}: {e}")
    _generated(R)
    assert OPS  # the op table imported: the kernels' ops exist
    print(f"{len(compiled)} launches compiled for sm_90 ({len(here)} in shard {SHARD}/{SHARDS})")
    for line in failures:
        print("FAILED", line)


def _generated(R) -> None:
    """The generated kernels a plan binds for its regions: every elementwise template of codegen in one
    chain over an input and a broadcast (37,) one (and a bool one, where's condition), alone, under each root reduction, and into each row
    op (softmax, layer and rms norm), alone; each row op after a short chain, with an op after it and under a mean
    (those and the reductions in one dtype each, in turn: the chain and the row ops meet every dtype alone); each
    configuration of a row op with an op after it (the cache in a directory of its own)."""
    import os
    import tempfile
    from egraph_opt.kernels.triton import codegen, generate_elementwise
    from egraph_opt.lang.ops import OPS
    from egraph_opt.lang.term import Term
    os.environ["EGRAPH_OPT_CACHE"] = tempfile.mkdtemp()
    x, y = Term.input("x", (3, 37)), Term.input("y", (37,))
    chain = x
    attrs_of = {"gelu": [("none",), ("tanh",)], "cast": [("float16",), ("bfloat16",)], "swish": [(1.702,)]}
    for op, attrs in [(op, attrs) for op in codegen.TEMPLATES if op not in codegen.STATS
                      for attrs in attrs_of.get(op, [()])]:
        operands = (Term.input("m", (3, 37), "bool"), chain, y) if op == "where" else (chain, y)[:OPS[op].arity]
        chain = Term("add", (chain, Term(op, operands, attrs)))  # a mask (1.0 or 0.0) added too
    rows = [Term(r, (chain,), (-1, keep)) for r in codegen.REDUCTIONS for keep in (False, True)]
    def row_ops(v):
        return [Term("softmax", (v,), (-1,)), Term("layer_norm", (v, y, y), (1e-5,)), Term("rms_norm", (v, y), (1e-6,)),
                Term("layer_norm", (v, Term.const(1.0), Term.const(0.0)), (1e-5,))]
    norms, fed = row_ops(chain), row_ops(Term("mul", (x, y)))  # what follows a row op: after a short chain
    after = [Term("mul", (Term("add", (n, x)), y)) for n in fed] + [Term("mean", (n,), (-1, True)) for n in fed]
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for i, root in enumerate([chain, *norms, *after] + rows):  # every template and row op in each dtype; what
        # they feed (an op after, a mean, a reduction) in one dtype each, in turn; configurations after each norm
        each = dtypes if i <= len(norms) else dtypes[i % 3:i % 3 + 1]
        for dtype, config in [(d, None) for d in each] + [
                (torch.float16, c) for c in generate_elementwise(root).configs[1:] if root in after[:len(norms)]]:
            try:
                given = {"x": R(3, 37).to(dtype), "y": R(37).to(dtype), "m": R(3, 37) > 0}  # a bool where's condition
                generate_elementwise(root)(**{n: given[n] for n in generate_elementwise(root).program.inputs}, config=config)
            except Exception as e:  # noqa: BLE001 - the kernel failed to generate, not to compile
                failures.append(f"generated {root.op} {config}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
