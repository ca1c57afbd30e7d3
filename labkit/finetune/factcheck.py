"""The fine-tuning claims, checked with the calculator (notebook 09, section 6): "offline fine-tuning on
laptops", "train ultra-large models on personal devices" and QLoRA's "65B on a single 48 GB GPU".

Tokens/s ceilings from lab 01's roofline: a training step on a batch of thousands of tokens is compute-bound,
so tokens/s <= peak FLOP/s / FLOP per token, with 6 N FLOP per token for full fine-tuning (forward 2N,
backward 4N: gradients of activations and of weights) and 4 N for LoRA/QLoRA (no weight gradients for the
frozen base; the adapters' FLOP are negligible). N: active parameters per token.
"""

from __future__ import annotations

from .._checks import check_positive, check_positive_int
from ..specs import ModelSpec, device
from .memory import METHODS, training_memory

LAPTOPS_GB = (24, 64, 128)
LAPTOP_FLOPS = device("m2-ultra").peak_flops["fp32"]
"""The compute assumed for a unified-memory machine: the M2 Ultra's GPU, 27.2 TFLOP/s FP32, the course's own count
from its cores and clock (data/hardware.json; Apple publishes no figure). A desktop chip; laptops with a discrete
GPU exceed it."""

LLAMA_65B = ModelSpec(name="llama-65b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=64, d_ff=22016,
                      vocab_size=32000, context=2048, mlp="swiglu", norm="rmsnorm", bias=False,
                      tied_embeddings=False, positions=0, n_experts=1, experts_per_token=1,
                      published_params=65_200_000_000,
                      source="Touvron et al. 2023, LLaMA (arXiv:2302.13971), the 65B model QLoRA fine-tuned")


def tokens_per_s(spec: ModelSpec, method: str, flops: float = LAPTOP_FLOPS) -> float:
    """The compute ceiling on training tokens/s (module docstring)."""
    check_positive("flops", flops, unit="FLOP/s")
    per_token = (6 if method == "full" else 4) * spec.active_params
    return flops / per_token


def laptop_rows(models: tuple[str, ...] = ("llama-2-7b", "llama-3-70b", "deepseek-v3", "moe-3t"),
                tokens: int = 2048, rank: int = 16, checkpointing: bool = True) -> list[dict]:
    """For each model and method: total GB (1e9 bytes) to fine-tune on a batch of `tokens` tokens, which of the
    LAPTOPS_GB capacities it fits, and the tokens/s ceiling."""
    from ..specs import model as model_spec
    check_positive_int("tokens", tokens)
    rows = []
    for name in models:
        spec = model_spec(name)
        for method in METHODS:
            total = training_memory(spec, method, tokens, rank, checkpointing)["total"]
            fits = [gb for gb in LAPTOPS_GB if total <= gb * 1e9]
            rows.append({"model": name, "method": method, "GB": total / 1e9,
                         "fits in": f"{fits[0]} GB+" if fits else "none",
                         "tokens/s ceiling": tokens_per_s(spec, method)})
    return rows


def qlora_65b(tokens: int = 512, rank: int = 64) -> dict[str, float]:
    """QLoRA's setting on LLaMA-65B (NF4 base, adapters of rank 64 on every linear, gradient checkpointing):
    bytes by part, GB."""
    return {k: v / 1e9 for k, v in training_memory(LLAMA_65B, "qlora", tokens, rank, checkpointing=True).items()}
