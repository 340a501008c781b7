"""Hugging Face models with random weights (bench/hf_models.py), decorated as a user would: the
optimized forward equals eager and holds the fused ops the model spells out (attention as sdpa,
its norms, gelu / SwiGLU / GeGLU / quick gelu, rotary embedding); called with default arguments,
it returns what the model returns (its ModelOutput, the KV cache included). Tiny configs (width 32,
one or two layers, T=8 or 16), priced by static estimates and never timed: whether a fusion pays is
bench/hf_models.py's question."""
import copy
import functools
import sys
import warnings
from pathlib import Path

import pytest
import torch

from egraph_opt import saturate_and_extract

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from hf_models import MODELS, build, inputs, instantiate  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

_LLAMA = {"rms_norm", "rotary", "sdpa_masked", "silu"}
_ENCODER = {"layer_norm", "linear_act", "sdpa_masked"}
#: architecture -> the fused ops its optimized program must hold
FUSES = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "phi3": _LLAMA,
    "gemma": {"geglu", "rms_norm", "rotary", "sdpa_masked"},
    "gemma2": {"geglu", "rms_norm", "rotary"},  # tanh soft-capped scores: softmax, no sdpa
    "phi": {"layer_norm", "linear_act", "rotary", "sdpa_masked"},
    "gpt2": {"gelu", "layer_norm", "sdpa_masked"},
    "gpt_neox": {"layer_norm", "linear_act", "rotary", "sdpa_masked"},
    "opt": _ENCODER, "bert": _ENCODER, "roberta": _ENCODER, "distilbert": _ENCODER, "vit": _ENCODER,
    "bloom": {"layer_norm", "linear_act", "sdpa_masked"},  # baddbmm onto ALiBi over flattened heads, viewed back
    "falcon": {"gelu", "layer_norm", "rotary", "sdpa_masked"},
    "t5_encoder": {"rms_norm", "sdpa_masked"},
    "clip_text": {"layer_norm", "sdpa_masked", "swish"},
    "whisper_encoder": {"layer_norm", "linear_act", "sdpa"},
}


def optimized_equals_eager(module, args, tol=1e-4):
    f = saturate_and_extract(module, profile_db=False, profile_budget=0)  # no timing: no speed fallback
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, ref = f(*args), module(*args)
    assert f.report.optimized, f.report.fallback
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    return f.report


@pytest.mark.parametrize("name", [n for n in FUSES if n not in ("mistral", "qwen2")])  # LLaMA's graph
def test_model_optimizes_to_eager_with_its_fusions(name):
    report = optimized_equals_eager(*build(name, 16, c=32, layers=1))
    assert FUSES[name] <= set(report.ops_after), sorted(report.ops_after)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_eager_attention_fuses_as_sdpa_does(name):
    """transformers' own attention (matmul, scale, mask, softmax in float32, GQA's repeat_kv)."""
    report = optimized_equals_eager(*build(name, 16, attn="eager", c=32, layers=1))
    assert FUSES[name] <= set(report.ops_after), sorted(report.ops_after)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_left_padded_batch_validates(name):
    """A padded query sees no key: torch's attention gives 0 there, and so must the plan."""
    report = optimized_equals_eager(*build(name, 16, padded=True, c=32, layers=1))
    assert "sdpa_masked" in report.ops_after


@pytest.mark.parametrize("name,attn", [("llama", "sdpa"), ("bert", "sdpa"), ("llama", "eager")])
def test_bfloat16_model_keeps_its_dtype_and_values(name, attn):
    """A boolean mask's 0 / -inf are float32 consts: the fully-masked-row guard must not promote
    the attention's output (a float32 activation met a bfloat16 weight in the next matmul). The
    eager attention's masked softmax in float32 fuses as sdpa of float32 copies."""
    module, args = build(name, 16, attn, padded=name != "bert", c=32, layers=1, dtype=torch.bfloat16)
    report = optimized_equals_eager(module, args, tol=5e-2)  # bfloat16's 2^-8, rounded per op
    assert FUSES[name] - {"linear_act"} <= set(report.ops_after), sorted(report.ops_after)


def _same_as_eager(f, m, args, kwargs):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, ref = f(*args, **kwargs), m(*args, **kwargs)
    assert f.report.optimized, f.report.fallback
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    cache = getattr(ref, "past_key_values", None)
    assert type(getattr(out, "past_key_values", None)) is type(cache)
    for a, b in zip(tree_leaves(out), tree_leaves(ref), strict=True):  # the cache's tensors included
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_a_model_called_with_default_arguments_returns_its_model_output_optimized(name):
    """No wrapper: the model as instantiated, called by keyword with an attention mask (left-padded)
    where it takes ids, positionally where it takes pixels or audio; the decoders' default
    ``use_cache=True`` and ``return_dict=True`` hold."""
    m = instantiate(name, c=32, layers=2)
    args = inputs(name, m.config, 8, padded=True)
    f = saturate_and_extract(m, profile_db=False, profile_budget=0)
    if len(args) == 2:
        _same_as_eager(f, m, (), {"input_ids": args[0], "attention_mask": args[1]})
    else:
        _same_as_eager(f, m, args, {})


@pytest.mark.parametrize("head", ["GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_a_causal_lm_called_positionally_returns_its_logits_and_cache_optimized(head):
    import transformers as tf
    config = {"GPT2LMHeadModel": tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32),
              "LlamaForCausalLM": tf.LlamaConfig(**_DECODER), "Qwen2ForCausalLM": tf.Qwen2Config(**_DECODER)}[head]
    torch.manual_seed(0)
    m = getattr(tf, head)(config).eval()
    f = saturate_and_extract(m, profile_db=False, profile_budget=0)
    out = _same_as_eager(f, m, (torch.randint(0, 100, (2, 8)),), {})
    assert len(out.past_key_values.layers) == 2
    # a decode step given the cache by its former name, which **kwargs takes: an argument of its own, not a dict
    step, cache = out.logits[:, -1:].argmax(-1), out.past_key_values
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, got = m(step, past_key_values=copy.deepcopy(cache)), f(step, past_key_values=cache)
    assert f.report.optimized, f.report.fallback
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)


_DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, vocab_size=100)


def _generating(new: int, head: str = "Llama", **options):
    """A tiny causal LM, its prompt, and its generation of ``new`` tokens, greedy or sampled from a seeded stream."""
    import transformers as tf
    torch.manual_seed(0)
    m = getattr(tf, f"{head}ForCausalLM")(getattr(tf, f"{head}Config")(**_DECODER)).eval()
    ids = torch.randint(1, 100, (1, 6))

    def generate(sampled: bool):
        torch.manual_seed(1)
        drawn = dict(do_sample=True, top_k=0) if sampled else dict(do_sample=False)
        return m.generate(ids, max_new_tokens=new, **drawn, **options)
    return m, ids, generate


def test_generate_through_a_decorated_forward_gives_eagers_tokens_from_optimized_plans():
    """``model.forward = saturate_and_extract(model.forward)``: the KV cache is an input and an
    output of the prefill's and each decode step's plans; the caller's cache is updated and
    returned as itself, as eager does; sampling draws from the caller's seeded stream."""
    import transformers as tf
    m, ids, generate = _generating(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [generate(sampled) for sampled in (False, True)]
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        for sampled, ref in enumerate(refs):
            torch.testing.assert_close(generate(sampled), ref)
    plans = list(m.forward.plans.values())
    assert len(plans) == 2 and all(p.report.optimized and p.returned == ("cache",) for p in plans)
    cache = tf.DynamicCache(config=m.config)
    with torch.no_grad():
        out = m.forward(input_ids=ids, cache=cache, use_cache=True)
    assert out["cache"] is cache and cache.layers[0].keys.shape[-2] == 6


@pytest.mark.parametrize("head,budget", [("Llama", 0), ("Llama", 2.0), ("Qwen2", 0)])  # 2 s: each plan timed beside
def test_a_static_cache_is_written_in_place_by_optimized_plans(head, budget):  # the original, on copies of the cache
    """``StaticCache`` updates its preallocated tensors in place (``index_copy_``, its length ``add_``): the plans write
    back into the caller's own tensors (their addresses stay, as compiled code needs), after all else they compute;
    the never-slower check times both on copies, put back before each run (an original timed on the caller's would
    have run past the cache's end). Greedy and sampled generations give eager's tokens; Qwen2's masks come as a dict."""
    import transformers as tf
    m, ids, generate = _generating(4, head, cache_implementation="static")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [generate(sampled) for sampled in (False, True)]
        f = saturate_and_extract(m, profile_db=False, profile_budget=budget)
        mine, theirs = (tf.StaticCache(config=m.config, max_cache_len=12) for _ in range(2))
        with torch.no_grad():
            got, ref = f(ids, past_key_values=mine), m(ids, past_key_values=theirs)
            held = [layer.keys for layer in mine.layers]
            for n in range(4):
                step = ref.logits[:, -1:].argmax(-1)
                got, ref = (g(step, past_key_values=c, position_ids=torch.tensor([[6 + n]]))
                            for g, c in ((f, mine), (m, theirs)))
                torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
        assert got.past_key_values is mine and [layer.keys for layer in mine.layers] == held
        torch.testing.assert_close(tree_leaves(mine), tree_leaves(theirs), rtol=1e-4, atol=1e-4)
        assert all(p.report.optimized or budget and "measured slower" in p.report.fallback  # not an IndexError
                   for p in f.plans.values()), [p.report.fallback for p in f.plans.values()]
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=budget)
        for sampled, ref in enumerate(refs):
            torch.testing.assert_close(generate(sampled), ref)
    assert budget or all(p.report.optimized for p in m.forward.plans.values()), m.forward.report.fallback


def _generates_as_eager(m, ids, new: int) -> None:
    """``m.forward`` decorated (static estimates): a greedy generation gives eager's tokens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = m.generate(ids, max_new_tokens=new, do_sample=False)
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        torch.testing.assert_close(m.generate(ids, max_new_tokens=new, do_sample=False), ref)


@pytest.mark.parametrize("head", ["Gemma2ForCausalLM", "MistralForCausalLM"])
def test_a_sliding_window_cache_is_optimized_until_its_window_fills_then_runs_the_original(head):
    """A sliding window layer counts the tokens it has seen (``cumulative_length``) beyond the keys it keeps; its
    pytree carries the keys alone, so a cache rebuilt from them counts their length: a plan traced on one computed its
    masks from it, and past the window Gemma 2's logits were 4e-2 off eager's, its tokens others. While the count is
    the keys' length (before and after the call), plans run; from the step that fills the window, the original, its
    refusal named (one plan for a size family's steps). Tokens, logits and the cache as eager's, prompts shorter and
    longer than the window."""
    import transformers as tf
    torch.manual_seed(0)
    config = getattr(tf, head.replace("ForCausalLM", "Config"))(**_DECODER, sliding_window=9, head_dim=8)
    m = getattr(tf, head)(config).eval()
    ids = torch.randint(1, 100, (2, 5))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    calls = ((ids, mask), (ids, None), (ids, None), (torch.randint(1, 100, (1, 11)), None))  # again: plans run
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = dict(max_new_tokens=10, do_sample=False, output_logits=True, return_dict_in_generate=True)
        refs = [m.generate(i, attention_mask=k, **kw) for i, k in calls]
        m.forward = f = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        for (i, k), ref in zip(calls, refs):
            out = m.generate(i, attention_mask=k, **kw)
            torch.testing.assert_close((out.sequences, out.logits), (ref.sequences, ref.logits))
            # the cache left as eager leaves it: its count of tokens seen (a plan's cache counted its keys)
            assert out.past_key_values.get_seq_length() == ref.past_key_values.get_seq_length()
    reports = {p.report.signature: p.report for p in f.plans.values()}
    decoded = [r for s, r in reports.items() if "input_ids: int64[2, 1]" in s]
    assert sum(not r.fallback for r in decoded) >= 4, [r.fallback for r in decoded]  # cache lengths 5 to 7 and more
    after = [r.fallback for r in decoded if r.fallback]
    assert any("DynamicSlidingWindowLayer.cumulative_length = 9" in w and "after the call" in w for w in after), after
    assert any("cumulative_length = 10, which its pytree carries not (rebuilt from its tensors: 8)" in w for w in after)
    # a decode step's plan (run again: a size's first call runs the original, checking the count after it) writes its
    # tensors and the count into the caller's layers: no cache rebuilt a call (90 us)
    wheres = [w for p in f.plans.values() if p.into and not p.report.fallback and "cache_0" in p.report.signature
              for w in p.into.paths.values()]
    assert wheres and all(w and any(path[-1] == "cumulative_length" for path in w[1]) for w in wheres), wheres
    assert len(f.plans) < 24, len(f.plans)


def test_a_repeated_piece_reading_constants_is_estimated_with_their_values():
    """GPT-J (no architecture of the suite): each layer's masking repeats, reading lifted constants (its causal
    mask, index tables) that are the template's parameters; the template's error estimate samples them with the
    first instance's values (it read them from an environment without them: every plan fell back on a KeyError)."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                         rotary_dim=4)).eval()
    _generates_as_eager(m, torch.randint(1, 100, (1, 6)), 2)
    reports = [p.report for p in m.forward.plans.values()]
    assert len(reports) == 2 and all(r.optimized and not r.fallback for r in reports), [r.fallback for r in reports]


def test_a_model_building_its_tables_by_slice_writes_is_optimized():
    """BEiT (no architecture of the suite) builds its relative position index on every call by writes into slices of
    tensors it made (``relative_coords[:, :, 0] += ...``); traced in torch.export's functional form, it is pure, and
    its attention fuses (it ran untouched: "mutates 'contiguous', read again after add_")."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.BeitModel(tf.BeitConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   image_size=16, patch_size=4, use_relative_position_bias=True)).eval()
    report = optimized_equals_eager(m, (torch.randn(2, 3, 16, 16),))
    assert "sdpa_masked" in report.ops_after, report.ops_after


def test_an_encoder_decoder_called_directly_and_generating_runs_optimized_plans():
    """T5 returns an ``EncoderDecoderCache`` (no pytree transformers registers: torch.export refused the output) and
    ``generate()`` passes ``encoder_outputs``, a ModelOutput (refused as no tensor): both ran untouched. The cache is
    a tree of its two caches, a ModelOutput argument one of its tensors."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.T5ForConditionalGeneration(tf.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=100,
                                                  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    ids = torch.randint(2, 100, (1, 8))
    out = _same_as_eager(saturate_and_extract(m, profile_db=False, profile_budget=0), m, (ids,),
                         {"decoder_input_ids": ids[:, :3]})
    assert type(out.past_key_values).__name__ == "EncoderDecoderCache"
    _generates_as_eager(m, ids, 3)
    plans = list(m.forward.plans.values())
    assert len(plans) >= 2 and all(p.report.optimized for p in plans), [p.report.fallback for p in plans]


@pytest.mark.parametrize("name", ["bart", "mixtral"])
def test_a_model_whose_functional_export_loses_its_constants_is_optimized(name):
    """BART's forward makes its decoder inputs by writes into a tensor it made (and a ``torch.tensor(2)``), Mixtral's
    router divides in place: both are traced in export's functional form, whose retrace lost the constants a submodule
    made (SpecViolationError: "lifted_tensor_0 is not in the constants dictionary"), and both ran untouched. Their
    export is functionalized below autograd instead: linear layers as ``addmm`` of ``t``, attention as the CPU
    kernel's op; each lowers as before (a ``t`` was a gather of every weight per call)."""
    import transformers as tf
    torch.manual_seed(0)
    m = (tf.BartForConditionalGeneration(tf.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)) if name == "bart" else
         tf.MixtralForCausalLM(tf.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                                num_experts_per_tok=2))).eval()
    ids = torch.randint(3, 100, (1, 8))
    f = saturate_and_extract(m, profile_db=False, profile_budget=0)
    _same_as_eager(f, m, (ids,), {})
    assert "index_select" not in f.report.ops_after or f.report.ops_after["index_select"] <= 4, f.report.ops_after
    assert any(op.startswith("sdpa") for op in f.report.ops_after), f.report.ops_after
    _generates_as_eager(m, ids, 3)
    plans = list(m.forward.plans.values())
    assert plans and all(p.report.optimized for p in plans), [p.report.fallback for p in plans]


def test_a_form_for_accuracy_measured_slower_gives_way_to_the_fastest_form_not_to_eager(monkeypatch):
    """Mixtral's routing weights over their sum: the default extraction takes the compensated sum (accuracy, for time)
    with the norms, rotary and attention fused; timed slower with no gain the sample shows, the whole plan fell back
    (a Mixtral call ran at 1.0x, its fusions lost: 0.94x measured). Now the fastest form found is made, validated and
    timed in its place. The timings are given (the machine's noise must not decide): the first slower, then faster."""
    import egraph_opt.drivers.api as api
    import transformers as tf
    torch.manual_seed(0)
    timings = iter([(1e-3, 1.2e-3), (1e-3, 0.9e-3)])
    monkeypatch.setattr(api, "time_side_by_side", lambda *a, **k: next(timings))
    m = tf.MixtralForCausalLM(tf.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                               num_experts_per_tok=2)).eval()
    f = saturate_and_extract(m, profile_db=False, profile_budget=30)
    _same_as_eager(f, m, (torch.randint(3, 100, (2, 8)),), {})
    assert f.report.optimized and "the fastest form instead" in str(f.report), f.report
    assert "compensated_sum" not in f.report.ops_after and "rms_norm" in f.report.ops_after, f.report.ops_after
    assert f.report.measured == (1e-3, 0.9e-3)


def test_a_model_refusing_resampled_ids_is_validated_on_the_callers_own():
    """LLaVA raises unless its ids hold one image token per image feature: validation's ids, drawn among the caller's,
    held another count, the original raised, and the call ran untouched ("Image features and image tokens do not
    match"). Validated on fresh pixels beside the caller's ids, it is optimized."""
    import transformers as tf
    torch.manual_seed(0)
    vision = tf.CLIPVisionConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=64)
    text = tf.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                          num_key_value_heads=2)
    m = tf.LlavaForConditionalGeneration(tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=99,
                                                        vision_feature_layer=-1)).eval()
    ids = torch.randint(1, 99, (1, 12))
    ids[0, 2:6] = 99  # one per patch: (16 / 8) ** 2
    _same_as_eager(saturate_and_extract(m, profile_db=False, profile_budget=0), m, (),
                   {"input_ids": ids, "pixel_values": torch.randn(1, 3, 16, 16)})


def test_repeated_runs_found_between_a_models_repeated_layers_never_straddle_them():
    """MobileNetV1's even layers are repeated modules; its odd ones repeat as a run of ops found among the rest, and
    a block of that run took ops from both sides of a module's: each fed the other ("templates depend on each other in
    a cycle", the program ran untouched; XLM called with a mask too). Such a run is not a template."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.MobileNetV1Model(tf.MobileNetV1Config(image_size=32, depth_multiplier=0.25)).eval()
    report = optimized_equals_eager(m, (torch.randn(2, 3, 32, 32),))
    assert any("template of" in line for line in report.saturation), report.saturation


@pytest.mark.parametrize("head", ["LlamaForCausalLM", "GPT2LMHeadModel"])
def test_a_generation_is_traced_three_times_and_its_other_decode_steps_made_from_their_size_family(head, monkeypatch):
    """The prefill and two decode steps are traced, optimized and built; the later decode steps run
    one module made from the two (its cache length on their line, the mask made from it read per
    call), validated at the first of them, whose plan serves them all (torch.export takes the cache
    length as a symbol), and give eager's tokens. GPT-2 splits one projection into keys and values:
    its first decode step's cache is laid out as the later ones' (a plan of their family)."""
    import transformers as tf
    import egraph_opt.drivers.api as api
    traced, capture, built, build = [], api.capture, [], api.build_module
    monkeypatch.setattr(api, "capture", lambda fn, args, *f: traced.append(1) or capture(fn, args, *f))
    monkeypatch.setattr(api, "build_module", lambda *a, **k: built.append(1) or build(*a, **k))
    torch.manual_seed(0)
    config = tf.LlamaConfig(**_DECODER) if head.startswith("Llama") else \
        tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100)
    m = getattr(tf, head)(config).eval()
    ids = torch.randint(1, 100, (1, 6))
    _generates_as_eager(m, ids, 10)
    made = [p.report for p in m.forward.plans.values() if p.report.sizes]
    assert len(traced) == 3 and len(made) == 1 and all(r.optimized for r in made), made
    assert "it serves them all" in made[0].sizes and made[0].validation.passed, made
    assert len(built) == 3 and not any("built for this size" in r.sizes for r in made), made
    assert "cache_0.shape[2]" in made[-1].sizes
    # a decode step writes its new tensors into the caller's cache layers, as eager's update does,
    # rebuilding no cache (its constructor copies every layer)
    step = next(p for p in m.forward.plans.values() if p.report.sizes)
    layers = step.into.paths[next(iter(step.into.paths))][0]
    assert layers and all(path[0] == "layers" and path[-1] in ("keys", "values") for path in layers)
    cache = tf.DynamicCache(config=m.config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.forward(input_ids=ids, cache=cache, use_cache=True)
        held = list(cache.layers)
        for n in range(7, 10):  # sizes whose plans exist: each writes in place
            out = m.forward(input_ids=ids[:, :1], cache=cache, use_cache=True)
            assert out["cache"] is cache and cache.layers == held and cache.layers[1].keys.shape[-2] == n


def test_a_generation_over_a_new_prompt_length_makes_no_plan_once_its_families_have_serving_plans():
    """As a chat runs it: each generate() with a prompt of another length. Once the prefill's and the decode step's size
    families each have a plan serving their sizes, a new prompt's prefill and first decode step (found by the slow
    path: the call before was laid out otherwise) run those plans, with eager's tokens; they were made and validated
    anew, two plans a generation (0.58x eager's time for 32 tokens)."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER)).eval()
    prompts = [torch.randint(1, 100, (1, t)) for t in (4, 6, 8, 11, 13, 7)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [m.generate(ids, max_new_tokens=6, do_sample=False) for ids in prompts]
        m.forward = f = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        plans = []
        for ids, ref in zip(prompts, refs):
            torch.testing.assert_close(m.generate(ids, max_new_tokens=6, do_sample=False), ref)
            plans.append({id(p) for p in f.plans.values()})
    assert plans[-1] == plans[2] and len(plans[2]) <= 6, [len(p) for p in plans]
    assert all(p.report.validation is None or p.report.validation.passed for p in f.plans.values())


def test_a_generation_whose_plans_fell_back_binds_only_calls_laid_out_anew(monkeypatch):
    """Each decode step passes its cache and keywords laid out as the step before: the plan its
    tensors' key finds runs (the original, where the plans fell back) without binding. The prefill
    and the first decode step bind once (their caches differ in structure from the call before);
    in the next generation each tries the plan of the call that followed that call last, and
    binds no more. A step of a new cache length binds none either: the plan its size family made at the third length
    checks every length (two traced samples and that one: 4 plans however long the generation)."""
    import transformers as tf

    import egraph_opt.drivers.api as api
    from egraph_opt.frontends.capture import CaptureError

    def fails(fn, args, *functional):
        raise CaptureError("made to fail")
    monkeypatch.setattr(api, "capture", fails)
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER)).eval()
    ids = torch.randint(1, 100, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = {n: m.generate(ids, max_new_tokens=n, do_sample=False) for n in (4, 6)}
        m.forward = f = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        torch.testing.assert_close(m.generate(ids, max_new_tokens=4, do_sample=False), refs[4])
        bind, binds = f._bind, []
        f._bind = lambda args, kwargs: binds.append(kwargs) or bind(args, kwargs)
        for n in (4, 6):
            torch.testing.assert_close(m.generate(ids, max_new_tokens=n, do_sample=False), refs[n])
            assert len(binds) == 2 and len(f.plans) == 4, (n, len(binds), len(f.plans))
    assert all(p.run is None for p in f.plans.values())


@pytest.mark.parametrize("head", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_training_a_decorated_causal_lm_gives_eagers_losses_from_an_optimized_plan(head):
    """Train mode, ``model(ids, labels=ids).loss.backward()`` and optimizer steps, as the Hugging
    Face docs train a causal LM (dropout 0: a program that draws runs untouched): 20 steps give
    eager's losses and gradients, and the steps run the optimized plan (its fused ops have
    backwards). SGD: Adam's first steps divide gradients by their own size, which makes rounding
    differences of gradients near 0 differences of the weights."""
    import copy

    import transformers as tf
    config = {"GPT2LMHeadModel": tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
              "LlamaForCausalLM": tf.LlamaConfig(**_DECODER)}[head]
    torch.manual_seed(0)
    eager = getattr(tf, head)(config).train()
    model = copy.deepcopy(eager)
    f = saturate_and_extract(model, profile_db=False, profile_budget=0)
    steps = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, model)]
    ids = torch.randint(0, 100, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(20):
            losses = [run(ids, labels=ids).loss for run in (eager, f)]
            for loss, opt in zip(losses, steps):
                loss.backward()
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
            for (name, a), b in zip(eager.named_parameters(), model.parameters()):  # within rounding
                off = ((b.grad - a.grad).abs().max() / a.grad.abs().max().clamp_min(1e-30)).item()
                assert off <= 1e-4, f"step {step}: {name}'s gradient is off by {off:.2e} of its scale"
            for opt in steps:
                opt.step()
                opt.zero_grad()
    assert f.report.optimized and not f.report.fallback, f.report.fallback
    assert len(f.plans) == 1


def test_the_never_slower_check_times_a_decode_step_on_a_kept_cache_as_generate_calls_it(monkeypatch):
    """A decode step's original is timed on a cache kept between calls (its tensors put back before
    each), as generate() passes it, not on one rebuilt from its leaves per call (a cache's constructor
    copies every layer: an original slower than a user's); the plan writes into that cache too, once
    its first call decided where (timing's warm-up call)."""
    import transformers as tf
    import egraph_opt.drivers.api as api
    timed = []
    monkeypatch.setattr(api, "time_side_by_side", lambda fns, args, *rest: timed.append((fns, args)))
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER)).eval()
    ids = torch.randint(1, 100, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=30.0)
        m.generate(ids, max_new_tokens=3, do_sample=False)
    steps = [(fns, args) for fns, args in timed if len(args) > 2]  # the cache's leaves among the tensors
    with torch.no_grad():
        for (_, plan), args in steps:  # the first call decides where it writes, as timing's warm-up
            plan(*args)
    made, init = [], tf.DynamicCache.__init__
    monkeypatch.setattr(tf.DynamicCache, "__init__", lambda self, *a, **k: made.append(1) or init(self, *a, **k))
    assert steps
    with torch.no_grad():
        for (original, plan), args in steps:
            first, again, planned = original(*args), original(*args), plan(*args)
            assert not made and first["cache"] is again["cache"] is planned["cache"]
            cached = next(a for a in args if a.dim() == 4).shape[-2]
            assert first["cache"].layers[0].keys.shape[-2] == cached + 1  # one step appended, once
            torch.testing.assert_close(first["logits"], again["logits"])
            torch.testing.assert_close(planned["logits"], first["logits"])


def test_a_step_that_falls_back_after_timing_finds_the_callers_cache_as_eager_left_it(monkeypatch):
    """Timing runs a plan on private copies of the caller's cache; where the plan writes its tensors
    is decided on the caller's own. A prefill's plan once decided on a copy the original had
    initialized, so it wrote into the caller's uninitialized layers; the original, run when the
    next step fell back, took that cache for empty and the tokens differed from eager's."""
    import transformers as tf
    import egraph_opt.drivers.api as api
    slower = iter([False, True])  # the prefill's plan is kept, the first decode step's falls back
    monkeypatch.setattr(api, "slower_for_nothing", lambda *a: next(slower, False))
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER)).eval()
    ids = torch.randint(1, 100, (1, 6))
    generate = functools.partial(m.generate, ids, max_new_tokens=4, do_sample=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = generate()
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=1)
        torch.testing.assert_close(generate(), ref)
        cache = tf.DynamicCache(config=m.config)
        with torch.no_grad():
            m.forward(input_ids=ids, cache=cache, use_cache=True)
    assert cache.get_seq_length() == 6 and cache.layers[0].keys.shape[-2] == 6
