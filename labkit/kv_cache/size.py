"""How big the KV cache is (notebook 05, section 1): bytes per token for multi-head (MHA), grouped-query (GQA),
multi-query (MQA) and multi-head latent attention (MLA), from labkit.specs, and how it grows with context and
batch. Units: bytes (GiB = 2**30 bytes).

    MHA / GQA / MQA   2 (K and V) x n_layers x n_kv_heads x head_dim x bytes per element
    MLA               (kv_lora_rank + qk_rope_head_dim) x n_layers x bytes per element
                      (one compressed latent per token and layer, plus the shared rotary key)

No preset is MQA, so `mqa_example` is Llama-2-7B's shape with one KV head: this lab's own arithmetic, not a
released model (PaLM and Falcon-7B use multi-query attention).
"""

from __future__ import annotations

from dataclasses import replace

from .._checks import check_positive, check_positive_int, check_type
from ..specs import ModelSpec, model

KV_MODELS = ("opt-13b", "llama-2-7b", "llama-3-8b", "llama-3-70b", "deepseek-v3")


def mqa_example() -> ModelSpec:
    """Llama-2-7B with a single key/value head shared by its 32 query heads (hypothetical)."""
    return replace(model("llama-2-7b"), name="llama-2-7b-mqa", n_kv_heads=1, published_params=None,
                   source="hypothetical: llama-2-7b with one KV head (multi-query attention), notebook 05")


def attention_kind(spec: ModelSpec) -> str:
    """"MLA", "MHA" (a KV head per query head), "MQA" (one KV head) or "GQA" (groups)."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    if spec.is_mla:
        return "MLA"
    return "MHA" if spec.n_kv_heads == spec.n_heads else "MQA" if spec.n_kv_heads == 1 else "GQA"


def kv_bytes(spec: ModelSpec, context: int, batch: int = 1, bytes_per_element: float = 2) -> int:
    """Bytes of KV cache for `batch` sequences of `context` tokens each."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    check_positive_int("context", context)
    check_positive_int("batch", batch)
    check_positive("bytes_per_element", bytes_per_element)
    return spec.kv_bytes_per_token(bytes_per_element) * context * batch


def kv_size_table(specs: list[ModelSpec] | None = None, context: int = 4096, batch: int = 32,
                  bytes_per_element: float = 2) -> list[dict]:
    """One row per model: attention kind, KV heads (or latent width), bytes per token, and GiB for `batch`
    sequences of `context` tokens, at `bytes_per_element` (2: FP16/BF16)."""
    specs = [model(n) for n in KV_MODELS] + [mqa_example()] if specs is None else specs
    rows = []
    for s in specs:
        per_token = s.kv_bytes_per_token(bytes_per_element)
        heads = f"latent {s.kv_lora_rank}+{s.qk_rope_head_dim}" if s.is_mla else f"{s.n_kv_heads} x {s.head_dim}"
        rows.append({"model": s.name, "attention": attention_kind(s), "layers": s.n_layers, "KV per layer": heads,
                     "bytes/token": per_token,
                     f"GiB ({batch} x {context})": kv_bytes(s, context, batch, bytes_per_element) / 2**30})
    return rows
