"""Reading the release on paper (notebook 07, section 1): the footprint with lab 01's tools, the parallel
degrees the decoder allows, and lab 04's planner on a 2-device "cluster" and on the same architecture scaled
up to spec-sheet GPUs. Units: parameters, bytes (MB = 1e6), tokens.

    footprint(cfg, ...)            one TP rank's bytes (decoder slice, its KV cache, its activations) and the
                                   encoder side's (vision tower + projector, the encoder cache, the encoder's
                                   activations: they run beside the engine, not on the ranks)
    image_budget(cfg, ...)         the worst case of image tokens, reserved the way vLLM's profiler does
    check_parallel / parallel_options   which tensor-parallel degrees split the decoder evenly
    plan_cluster / scaled_up / plan_scaled   lab 04's planner on the decoder (labkit.parallel.plan)

What lab 01's ModelSpec does not know about this model, counted here beside it: QK-norm's two weights of
head_dim per layer, and the vision tower, which is written as a ModelSpec of its own (a ViT block is a GELU
MLP with LayerNorms and biases; its patch embedding [hidden, patch_dim] stands where a tied vocabulary of
patch_dim rows would, plus its bias; the learned positions are `positions`).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from .._checks import check_choice, check_int, check_positive, check_positive_int, check_type, fail
from ..memory_wall import footprint as lab01
from ..parallel import USABLE, Hardware, Plan, Workload, tensor
from ..parallel import plan as plan_layouts
from ..specs import ModelSpec, device, device_names
from .config import TinyVLMConfig


def _cfg(cfg) -> TinyVLMConfig:
    return check_type("cfg", cfg, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")


def text_spec(cfg: TinyVLMConfig) -> ModelSpec:
    """The decoder as labs 01 and 04 see a model (labkit.specs.ModelSpec: Llama-style, SwiGLU, RMSNorm)."""
    t = _cfg(cfg).text_config
    return ModelSpec("tinyvlm-text", t.n_layers, t.d_model, t.n_heads, t.n_kv_heads, t.d_ff, t.vocab_size,
                     t.max_seq_len, tied_embeddings=t.tie_embeddings, source="labkit.day0 config.json text_config")


def vision_spec(cfg: TinyVLMConfig) -> ModelSpec:
    """The ViT as a ModelSpec (see the module docstring): counts() then matches the vision tower but for the
    patch embedding's bias (hidden_size), which param_counts adds."""
    v = _cfg(cfg).vision_config
    return ModelSpec("tinyvlm-vision", v.num_layers, v.hidden_size, v.num_heads, v.num_heads, v.intermediate_size,
                     v.patch_dim, v.num_patches, mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
                     positions=v.num_patches, source="labkit.day0 config.json vision_config")


def param_counts(cfg: TinyVLMConfig) -> dict[str, int]:
    """Parameters as stored: decoder (lab 01's count + QK-norm), vision_tower, projector, and total."""
    t, v = _cfg(cfg).text_config, cfg.vision_config
    qk = 2 * t.head_dim * t.n_layers if t.qk_norm else 0
    out = {"decoder": text_spec(cfg).n_params + qk, "vision_tower": vision_spec(cfg).n_params + v.hidden_size,
           "projector": v.hidden_size * t.d_model + t.d_model + t.d_model * t.d_model + t.d_model}
    out["total"] = sum(out.values())
    return out


def _decoder_rank_params(cfg: TinyVLMConfig, tp: int) -> int:
    """One rank's decoder parameters: every matrix split tp ways, norms (QK-norm's too) on every rank."""
    spec = text_spec(cfg)
    norms = spec.counts()["norm"] + param_counts(cfg)["decoder"] - spec.n_params
    return (spec.n_params - spec.counts()["norm"]) // tp + norms


def image_budget(cfg: TinyVLMConfig, max_num_seqs: int = 4, max_num_batched_tokens: int | None = None) -> dict:
    """Image tokens to reserve for, in tokens (and images), as vLLM's V1 profiler does.

    vLLM (vllm/v1/worker/gpu_model_runner.py, GPUModelRunner.profile_run, "Profile with multimodal encoder &
    encoder cache"; budgets from vllm/v1/core/encoder_cache_manager.py, compute_encoder_budget) takes the
    modality with the most tokens per item, an encoder budget of min(max_num_encoder_input_tokens,
    encoder_cache_size), each at least one item's tokens and by default max_num_batched_tokens, runs the
    encoder on min(cdiv(budget, tokens per item), items allowed per prompt x max_num_seqs) dummy items of the
    largest size, keeps their outputs in the encoder cache, then runs the decoder on max_num_batched_tokens
    dummy tokens; the memory left after that peak is what the KV cache gets.

    Returns tokens_per_image, per_request (max_images_per_prompt x tokens_per_image: the worst prompt),
    encoder_cache_tokens (the budget) and profiled_images (the dummy images encoded at once)."""
    t = _cfg(cfg).text_config
    seqs = check_positive_int("max_num_seqs", max_num_seqs, unit="sequences")
    batched = t.max_seq_len if max_num_batched_tokens is None else \
        check_positive_int("max_num_batched_tokens", max_num_batched_tokens, unit="tokens")
    per_image = cfg.tokens_per_image
    budget = max(batched, per_image)
    images = min(math.ceil(budget / per_image), cfg.max_images_per_prompt * seqs)
    return {"tokens_per_image": per_image, "per_request": cfg.max_images_per_prompt * per_image,
            "encoder_cache_tokens": budget, "profiled_images": images}


def footprint(cfg: TinyVLMConfig, dtype_bytes: float = 2, max_num_seqs: int = 4, max_seq_len: int | None = None,
              max_num_batched_tokens: int | None = None, kv_dtype_bytes: float | None = None, tp: int = 1
              ) -> dict[str, int]:
    """Bytes to serve `max_num_seqs` sequences of up to `max_seq_len` tokens (default: the context) with the
    weights at `dtype_bytes` per parameter (2: BF16), the KV cache at `kv_dtype_bytes` (default dtype_bytes)
    and activations at dtype_bytes per element, on `tp` tensor-parallel ranks.

    Per rank:     decoder_weights (matrices / tp + replicated norms), kv_cache (its KV heads, n_kv_heads / tp),
                  activations (lab 01's prefill peak over max_num_batched_tokens, default max_seq_len, with one
                  rank's d_ff / tp, plus max_num_seqs rows of FP32 logits), rank_total.
    Encoder side: encoder_weights (vision tower + projector, not split), encoder_cache (the profiled images'
                  features, d_model each, image_budget), encoder_activations (lab 01's peak for the ViT over
                  those images), encoder_total.
    total:        tp x rank_total + encoder_total (one machine holding it all, as the laptop does).
    Image tokens take context positions like text (image_budget's per_request of them): the KV cache of
    max_seq_len tokens already holds them; what images add is the encoder side.
    A rank's arena (labkit.day0.arena.plan_arena) takes its slices' sizes from the release headers
    (labkit.day0.loading.placed_sizes; they sum to decoder_weights), kv_cache and activations from here."""
    t = _cfg(cfg).text_config
    element = check_positive("dtype_bytes", dtype_bytes, unit="bytes")
    kv_element = element if kv_dtype_bytes is None else check_positive("kv_dtype_bytes", kv_dtype_bytes, unit="bytes")
    context = t.max_seq_len if max_seq_len is None else check_int("max_seq_len", max_seq_len, 1, t.max_seq_len)
    tp = check_parallel(cfg, tp)
    batched = context if max_num_batched_tokens is None else max_num_batched_tokens
    budget = image_budget(cfg, max_num_seqs, batched)
    spec, counts = text_spec(cfg), param_counts(cfg)
    rank_spec = replace(spec, d_ff=t.d_ff // tp)  # one rank's MLP is d_ff / tp wide
    out = {"decoder_weights": math.ceil(_decoder_rank_params(cfg, tp) * element),
           "kv_cache": max_num_seqs * context * spec.kv_bytes_per_token(kv_element) // tp,
           "activations": lab01.activation_bytes(rank_spec, 1, batched, element) + max_num_seqs * t.vocab_size * 4}
    out["rank_total"] = sum(out.values())
    images = budget["profiled_images"]
    out["encoder_weights"] = math.ceil((counts["vision_tower"] + counts["projector"]) * element)
    out["encoder_cache"] = math.ceil(images * budget["tokens_per_image"] * t.d_model * element)
    out["encoder_activations"] = lab01.activation_bytes(vision_spec(cfg), images, cfg.vision_config.num_patches,
                                                        element)
    out["encoder_total"] = out["encoder_weights"] + out["encoder_cache"] + out["encoder_activations"]
    out["total"] = tp * out["rank_total"] + out["encoder_total"]
    return out


SPLIT_FIELDS = ("n_heads", "n_kv_heads", "d_ff", "vocab_size")
"""The decoder fields tp must divide: labkit.parallel.tensor.check_split's rule (the one rule; named here as
text_config.<field>)."""


def check_parallel(cfg: TinyVLMConfig, tp: int) -> int:
    """`tp` if the decoder splits evenly over tp ranks: labkit.parallel.tensor.check_split on text_config, which
    requires tp to divide n_heads (query heads per rank), n_kv_heads (the course does not replicate KV heads),
    d_ff (column/row split of the MLP) and vocab_size (the embedding's rows). The encoder is not split (it runs
    beside the engine). ValueError naming the first field that does not divide, as text_config.<field>."""
    problem = _split_problem(_cfg(cfg), check_positive_int("tp", tp, unit="ranks"))
    if problem:
        fail("tp", tp, problem)
    return tp


def _split_problem(cfg: TinyVLMConfig, tp: int) -> str:
    """What tp must be for the first field it does not divide ("" when it divides them all): check_split's own
    expectation, its field named text_config.<field>. (Whether this machine can start that many ranks is
    another question, lab 04's check_world: the answer here is the same on every machine.)"""
    try:
        tensor.check_split(cfg.text_config, tp)
    except ValueError as e:
        expected = e.refusal.expected  # labkit._checks.Refusal: the expectation as data
        return re.sub(rf"\b({'|'.join(SPLIT_FIELDS)})=", r"text_config.\1=", expected)
    return ""


def parallel_options(cfg: TinyVLMConfig, max_tp: int = 8) -> list[dict]:
    """One row per degree 1 .. max_tp: {"tp", "works", "why"}: what each rank holds, or the field that does
    not divide."""
    t = _cfg(cfg).text_config
    rows = []
    for tp in range(1, check_positive_int("max_tp", max_tp) + 1):
        problem = _split_problem(cfg, tp)
        why = problem.replace("a divisor of", "must divide", 1)
        rows.append({"tp": tp, "works": not problem, "why": why or
                     f"per rank: {t.n_heads // tp} heads, {t.n_kv_heads // tp} KV heads, d_ff {t.d_ff // tp}, "
                     f"{t.vocab_size // tp} vocabulary rows"})
    return rows


def _runnable(cfg: TinyVLMConfig, plans: list[Plan], memory_bytes: int | None, usable: float) -> list[Plan]:
    """The planner's plans, with those the course cannot run (check_parallel: the planner itself allows KV heads
    replicated past n_kv_heads and ignores d_ff and the vocabulary) or that exceed `memory_bytes` rejected,
    saying why; kept plans first, in the planner's order."""
    out = []
    for p in plans:
        problem = _split_problem(cfg, p.tp)
        reason = p.reason or (f"the course's runtime: TP={p.tp} must be {problem}" if problem else "")
        if not reason and memory_bytes is not None and sum(p.memory.values()) > usable * memory_bytes:
            reason = (f"needs {sum(p.memory.values()) / 1e6:.3g} MB per device, more than {usable:.0%} of "
                      f"{memory_bytes / 1e6:.3g} MB")
        out.append(p if reason == p.reason else replace(p, reason=reason))
    return [p for p in out if p.fits] + [p for p in out if not p.fits]


def plan_cluster(cfg: TinyVLMConfig, devices: int = 2, device_name: str = "rtx-4090", memory_bytes: int | None = None,
                 max_num_seqs: int = 4, max_seq_len: int | None = None, dtype_bytes: float = 2,
                 link: str = "pcie4-x16", objective: str = "throughput", usable: float = USABLE) -> list[Plan]:
    """Lab 04's planner on the decoder over `devices` devices of one node (this laptop's cores as ranks: a
    spec-sheet device, `device_name`, whose memory is cut to `memory_bytes` per device when given), batch
    max_num_seqs, context max_seq_len (default the model's). Every TP x PP x DP layout, best first; layouts
    the course's runtime cannot run, or whose memory (the planner's estimate for the decoder: weights, KV
    cache, activations) does not fit memory_bytes, are rejected with the reason."""
    cfg = _cfg(cfg)
    devices = check_positive_int("devices", devices)
    if memory_bytes is not None:
        memory_bytes = check_positive_int("memory_bytes", memory_bytes, unit="bytes")
    if not device(check_type("device_name", device_name, str)).peak_flops:
        fail("device_name", device_name, f"a device that computes (one of {device_names('gpu') + device_names('soc')})")
    t = cfg.text_config
    context = t.max_seq_len if max_seq_len is None else check_int("max_seq_len", max_seq_len, 1, t.max_seq_len)
    work = Workload(batch=max_num_seqs, context=context, weight_bytes=dtype_bytes, kv_bytes=dtype_bytes,
                    act_bytes=dtype_bytes)
    cluster = Hardware(1, per_node=devices, device=device_name, intra=link, inter=link)
    return _runnable(cfg, plan_layouts(text_spec(cfg), cluster, work, objective, usable), memory_bytes, usable)


def scaled_up(cfg: TinyVLMConfig, d_model: int = 8192, n_layers: int = 80, head_dim: int = 128,
              n_kv_heads: int | None = None, n_experts: int = 1, experts_per_token: int = 1, context: int = 8192,
              vocab_size: int | None = None) -> ModelSpec:
    """TinyVLM's decoder at a real-hardware size: the same shape (SwiGLU, RMSNorm, grouped-query attention with
    the same query:KV head ratio unless `n_kv_heads`, the same d_ff / d_model rounded to a multiple of 256,
    tied embeddings, the same vocabulary unless `vocab_size`) at width d_model, n_layers deep, heads of
    head_dim; a mixture of n_experts experts (experts_per_token each) when n_experts > 1. Hypothetical: for
    planning only (QK-norm's weights, 2 x head_dim per layer, are left out as ModelSpec has no field)."""
    t = _cfg(cfg).text_config
    for name, v in (("d_model", d_model), ("n_layers", n_layers), ("head_dim", head_dim), ("context", context)):
        check_positive_int(name, v)
    if d_model % head_dim:
        fail("head_dim", head_dim, f"a divisor of d_model={d_model}")
    heads = d_model // head_dim
    if n_kv_heads is None and heads * t.n_kv_heads % t.n_heads:
        fail("d_model", d_model, f"a width whose {heads} heads keep the {t.n_heads}:{t.n_kv_heads} query:KV ratio")
    kv_heads = heads * t.n_kv_heads // t.n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
    d_ff = max(256, round(d_model * t.d_ff / t.d_model / 256) * 256)
    return ModelSpec(f"tinyvlm-{d_model}x{n_layers}" + (f"-{n_experts}e" if n_experts > 1 else ""), n_layers,
                     d_model, heads, kv_heads, d_ff,
                     t.vocab_size if vocab_size is None else vocab_size, context, tied_embeddings=t.tie_embeddings,
                     n_experts=n_experts, experts_per_token=experts_per_token,
                     source=f"hypothetical: TinyVLM's decoder scaled to d_model={d_model}, {n_layers} layers")


def plan_scaled(spec: ModelSpec, nodes: int = 1, device_name: str = "h100-sxm", batch: int = 64,
                context: int | None = None, dtype_bytes: float = 2, objective: str = "throughput") -> list[Plan]:
    """Lab 04's planner for a scaled-up spec on `nodes` nodes of 8 spec-sheet GPUs (NVLink 4 inside a node,
    InfiniBand NDR between nodes), batch sequences of `context` tokens (default the spec's)."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec (scaled_up makes one)")
    check_choice("device_name", device_name, device_names("gpu"))
    work = Workload(batch=batch, context=spec.context if context is None else context, weight_bytes=dtype_bytes,
                    kv_bytes=dtype_bytes, act_bytes=dtype_bytes)
    return plan_layouts(spec, Hardware(nodes, device=device_name), work, objective)
