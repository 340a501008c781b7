"""Hugging Face models through the torch decorator: programs our rules were not written around.

Each architecture is a tiny random-weight config built in code (no downloads), in eval mode; its
forward on input ids (pixel values, audio features) is optimized by ``saturate_and_extract`` and
one row is printed: ops before -> after, the fused ops that appeared, the fallback reason if any,
the largest difference from eager, the optimize seconds and a rough speedup (interleaved medians;
the machine is shared, figures are indicative). ``build(name, t)`` gives ``(module, args)``, the
module returning the model's last hidden state; ``tests/test_hf_models.py`` checks them.
Without a kernel of its own, an architecture's attention runs eager (Gemma2, BLOOM).

    python bench/hf_models.py [--only NAME ...] [--length T] [--repeats N] [--attn sdpa|eager]
                              [--padded] [--width C] [--layers N] [--dtype bfloat16|float16]
    python bench/hf_models.py --users [--compile] [--new TOKENS] [--only NAME ...]

``--users`` runs each model as its users do, eager against decorated (and torch.compile): the model
as instantiated called with default arguments; ``generate()`` of 64 greedy tokens through a
decorated forward (causal LMs); one training step with ``labels=ids`` (causal LMs).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch
import transformers as tf
from torch import nn

from egraph_opt import saturate_and_extract

tf.logging.set_verbosity_error()  # the tiny configs' token ids and the like

V, HEADS, KV = 1000, 4, 2
#: ops that are a fusion of something the model spells out (what the row lists as fused)
FUSED = ("sdpa", "layer_norm", "rms_norm", "gelu", "rotary", "geglu", "linear_act", "softmax",
         "silu", "swish")
DECODERS = ("llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "phi")  # LlamaConfig-like


def configs(c: int, layers: int) -> dict[str, tuple[str, str, dict, str]]:
    """name -> (config class, model class, config arguments, input kind) at width ``c``."""
    ff, kinds = 2 * c, {}
    for name, cls in zip(DECODERS, ("Llama", "Mistral", "Qwen2", "Gemma", "Gemma2", "Phi3", "Phi")):
        kinds[name] = (f"{cls}Config", f"{cls}Model", dict(
            hidden_size=c, num_hidden_layers=layers, num_attention_heads=HEADS,
            num_key_value_heads=KV, intermediate_size=ff, vocab_size=V,
            **({"head_dim": c // HEADS} if cls.startswith("Gemma") else {})), "ids")
    common = dict(hidden_size=c, num_hidden_layers=layers, num_attention_heads=HEADS,
                  intermediate_size=ff, vocab_size=V)
    return kinds | {
        "gpt2": ("GPT2Config", "GPT2Model", dict(n_layer=layers, n_embd=c, n_head=HEADS, vocab_size=V,
                                                  n_positions=256), "ids"),
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", common, "ids"),
        "opt": ("OPTConfig", "OPTModel", dict(hidden_size=c, num_hidden_layers=layers, ffn_dim=ff,
                                              num_attention_heads=HEADS, vocab_size=V,
                                              word_embed_proj_dim=c), "ids"),
        "bloom": ("BloomConfig", "BloomModel", dict(hidden_size=c, n_layer=layers, n_head=HEADS,
                                                    vocab_size=V), "ids"),
        "falcon": ("FalconConfig", "FalconModel", dict(hidden_size=c, num_hidden_layers=layers,
                                                       num_attention_heads=HEADS, vocab_size=V), "ids"),
        "bert": ("BertConfig", "BertModel", common, "ids"),
        "roberta": ("RobertaConfig", "RobertaModel", common, "ids"),
        "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=c, n_layers=layers, n_heads=HEADS,
                                                                   hidden_dim=ff, vocab_size=V), "ids"),
        "t5_encoder": ("T5Config", "T5EncoderModel", dict(d_model=c, d_kv=c // HEADS, d_ff=ff,
                                                          num_layers=layers, num_heads=HEADS,
                                                          vocab_size=V), "ids"),
        "clip_text": ("CLIPTextConfig", "CLIPTextModel", common, "ids"),
        "vit": ("ViTConfig", "ViTModel", common | dict(image_size=32, patch_size=8), "pixels"),
        "whisper_encoder": ("WhisperConfig", "WhisperEncoder", dict(
            d_model=c, encoder_layers=layers, encoder_attention_heads=HEADS, encoder_ffn_dim=ff,
            decoder_layers=1, decoder_attention_heads=HEADS, num_mel_bins=16,
            max_source_positions=64, vocab_size=V), "audio"),
    }


MODELS = list(configs(8, 1))
CACHED = ("gpt2", "gpt_neox", "opt", "bloom", "falcon", *DECODERS)  # forward takes use_cache


class LastHidden(nn.Module):
    """The model's last hidden state: one tensor out, whatever output class the model returns."""

    def __init__(self, model: nn.Module, **kwargs):
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, x, mask=None):
        extra = {} if mask is None else {"attention_mask": mask}
        return self.model(x, return_dict=False, **self.kwargs, **extra)[0]


def instantiate(name: str, attn: str = "sdpa", c: int = 128, layers: int = 2,
          dtype: torch.dtype = torch.float32) -> nn.Module:
    """Architecture ``name`` as users instantiate it (its class for ``from_pretrained``), random
    weights, eval mode. (Not named ``model``: the decorator's watch of Python state follows a
    global named as ``self.model`` is, into transformers' lazily filled module.)"""
    torch.manual_seed(0)
    config_cls, model_cls, args, _ = configs(c, layers)[name]
    tokens = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)  # within the tiny vocabulary
    model_cls = getattr(tf, model_cls, None) or getattr(tf.models.whisper.modeling_whisper, model_cls)
    try:
        made = model_cls(getattr(tf, config_cls)(**args, **tokens, attn_implementation=attn))
    except ValueError:  # Gemma2, BLOOM: no sdpa path, their own (eager) attention
        made = model_cls(getattr(tf, config_cls)(**args, **tokens, attn_implementation="eager"))
    return made.eval().to(dtype)


def inputs(name: str, config, t: int = 32, padded: bool = False, dtype: torch.dtype = torch.float32) -> tuple:
    """Example inputs of ``name``: ids (and an attention mask where ``padded``, the second sequence
    left-padded by a quarter), pixel values or audio features."""
    kind = configs(8, 1)[name][3]
    if kind == "ids":
        x = torch.randint(0, V, (2, t))
    elif kind == "pixels":
        x = torch.randn(2, 3, 32, 32)
    else:  # whisper's encoder: its convolutions halve 2 * max_source_positions frames
        x = torch.randn(2, 16, 2 * config.max_source_positions)
    x = x.to(dtype) if x.is_floating_point() else x
    if not padded or kind != "ids":  # an image or audio encoder takes no attention mask
        return (x,)
    mask = torch.ones(x.shape[:2], dtype=torch.int64)
    mask[1, :t // 4] = 0
    return x, mask


def build(name: str, t: int = 32, attn: str = "sdpa", padded: bool = False, c: int = 128,
          layers: int = 2, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, tuple]:
    """``(module, args)`` for architecture ``name`` at sequence length ``t``, width ``c`` (random
    weights), the module returning the model's last hidden state."""
    made = instantiate(name, attn, c, layers, dtype)
    module = LastHidden(made, **({"use_cache": False} if name in CACHED else {})).eval()
    return module, inputs(name, made.config, t, padded, dtype)


def interleaved(fns: dict, args: tuple, repeats: int) -> dict[str, list[float]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fusion import interleaved as side_by_side
    return side_by_side(fns, args, repeats)


def row(name: str, a: argparse.Namespace) -> None:
    module, args = build(name, a.length, a.attn, a.padded, a.width, a.layers, getattr(torch, a.dtype))
    optimized = saturate_and_extract(module)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = module(*args)
        start = time.perf_counter()
        try:
            out = optimized(*args)
        except Exception as e:  # noqa: BLE001 - a crash is this row's finding
            print(f"{name:<16} CRASH {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            return
        seconds = time.perf_counter() - start
        report = optimized.report
        err = (out.float() - ref.float()).abs().max().item()
        before, after = (sum(d.values()) for d in (report.ops_before, report.ops_after))
        fused = sorted(op for op in report.ops_after if any(op.startswith(f) for f in FUSED))
        speed = ""
        if a.repeats:
            times = interleaved({"orig": module, "opt": optimized}, args, a.repeats)
            speed = f"{statistics.median(times['orig']) / statistics.median(times['opt']):5.2f}x"
    status = "FALLBACK " + report.fallback[:100] if report.fallback else "ok"
    print(f"{name:<16} {before:>5} -> {after:<5} {err:9.2e} {seconds:7.1f} {speed:>6}  "
          f"{','.join(fused) or '-':<40} {status}", flush=True)
    if report.opaque:
        print(f"{'':<16} opaque: {'; '.join(report.opaque)[:200]}")


def causal_lm(name: str, c: int, layers: int) -> nn.Module | None:
    """``name``'s causal LM head model as users instantiate it (None: an encoder), random weights,
    no dropout (a program that draws runs untouched), eval mode."""
    base = instantiate(name, c=c, layers=layers)
    head = next((getattr(tf, type(base).__name__.replace("Model", suffix)) for suffix in ("ForCausalLM", "LMHeadModel")
                 if hasattr(tf, type(base).__name__.replace("Model", suffix))), None)
    if name not in CACHED or head is None:
        return None
    config = base.config
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout",
                "resid_dropout", "embed_dropout", "dropout", "attention_probs_dropout_prob"):
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    return head(config).eval()


def _ratios(times: dict) -> str:
    eager = statistics.median(times["eager"])
    return "  ".join(f"{k} {statistics.median(v) * 1e3:8.2f} ms ({eager / statistics.median(v):4.2f}x)"
                     for k, v in times.items())


def _generations(name: str, row: str, lm: nn.Module, forwards: dict, a: argparse.Namespace, length,
                 **options) -> None:
    """``generate()`` of ``a.new`` greedy tokens through each forward, interleaved; the i-th generation of each
    variant on a prompt of ``length(i)`` tokens (the first pays for optimizing, compiling: timed apart)."""
    tokens, runs, first = {}, {}, {}
    for label, forward in forwards.items():
        def generate(forward=forward, count=iter(range(1 << 30))):
            lm.forward, ids = forward, torch.randint(1, V, (1, length(next(count))), generator=torch.Generator().manual_seed(0))
            out = lm.generate(ids, max_new_tokens=a.new, do_sample=False, min_new_tokens=a.new, **options)
            lm.forward = forwards["eager"]
            return out
        runs[label] = generate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, run in runs.items():
            start = time.perf_counter()
            tokens[label] = run()
            first[label] = time.perf_counter() - start
        times = interleaved(runs, (), max(a.repeats // 10, 2))
    same = all(torch.equal(t, tokens["eager"]) for t in tokens.values())
    rates = "  ".join(f"{k} {a.new / statistics.median(v):7.1f} tok/s" for k, v in times.items())
    print(f"{name:<16} {row:<9} {rates}  tokens {'= eager' if same else 'DIFFER'}  first: "
          + "  ".join(f"{k} {v:.2f} s" for k, v in first.items()), flush=True)


def user_paths(name: str, a: argparse.Namespace) -> None:
    """The three ways users run a model, each eager / decorated / torch.compile (--compile),
    interleaved: the model as instantiated called with default arguments; ``generate()`` of
    ``--new`` greedy tokens with a decorated forward (tokens per second), on one prompt, on a
    prompt of a new length each generation (``chat``) and with a static cache; one training step
    (``model(ids, labels=ids).loss.backward()`` and an SGD step)."""
    made = instantiate(name, c=a.width, layers=a.layers)
    args = inputs(name, made.config, a.length)
    variants = {"eager": made, "ours": saturate_and_extract(made)}
    if a.compile:
        variants["compile"] = torch.compile(made)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = interleaved(variants, args, a.repeats)
    fell = variants["ours"].report.fallback
    print(f"{name:<16} call      {_ratios(times)}  {'FALLBACK ' + fell[:80] if fell else ''}", flush=True)
    lm = causal_lm(name, a.width, a.layers)
    if lm is None:
        return
    forwards = {"eager": lm.forward, "ours": saturate_and_extract(lm.forward)}
    if a.compile:
        forwards["compile"] = torch.compile(lm.forward)
    _generations(name, "generate", lm, forwards, a, lambda i: 8)
    # as a chat runs it: each generation's prompt of a length none before had (its first decode step's cache too)
    _generations(name, "chat", lm, forwards, a, lambda i: 9 + i)
    # with a StaticCache (torch.compile's way: one shape for every step, its buffers written in place)
    _generations(name, "static", lm, forwards, a, lambda i: 8, cache_implementation="static")
    train = lm.train()
    steps = {"eager": train, "ours": saturate_and_extract(train)}
    if a.compile:
        steps["compile"] = torch.compile(train)
    sgd = torch.optim.SGD(train.parameters(), lr=0.0)  # lr 0: every variant steps the same weights
    long_ids = torch.randint(1, V, (2, a.length))

    def step(run):
        run(long_ids, labels=long_ids).loss.backward()
        sgd.step()
        sgd.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = interleaved({k: (lambda r=r: step(r)) for k, r in steps.items()}, (), a.repeats)
    print(f"{name:<16} train     {_ratios(times)}", flush=True)
    lm.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(MODELS))
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20, help="0: no timing")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--padded", action="store_true", help="an attention mask, one row left-padded")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--users", action="store_true",
                   help="the model as users run it: a direct call, generate() and a training step")
    p.add_argument("--compile", action="store_true", help="torch.compile beside (--users)")
    p.add_argument("--new", type=int, default=64, help="tokens generate() makes (--users)")
    a = p.parse_args()
    print(f"T={a.length} C={a.width} layers={a.layers} attn={a.attn} padded={a.padded} {a.dtype} "
          f"threads={torch.get_num_threads()}")
    if not a.users:
        print(f"{'model':<16} {'ops':>5}    {'after':<5} {'max err':>9} {'opt s':>7} {'speed':>6}  "
              f"{'fused ops':<40} status")
    for name in a.only or MODELS:
        if a.users:
            user_paths(name, a)
        else:
            row(name, a)


if __name__ == "__main__":
    main()
