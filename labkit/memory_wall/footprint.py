"""The capacity wall: how many bytes a model needs for weights, KV cache and activations.

Used by notebook 01_memory_wall (the footprint calculator). Units: bytes; GB = 1e9 bytes.
"""

from __future__ import annotations

import math
import numbers

from .roofline import _positive, decode_ceiling, weight_bytes
from ..specs import ModelSpec

# Bits per weight as stored, scales and zero points included (one fp16 scale, and for asymmetric formats
# one fp16 minimum or zero point, per group of weights along the input dimension).
PRECISIONS: dict[str, float] = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "int8": 8,
    "int8-g32 (Q8_0)": 8 + 16 / 32,         # llama.cpp Q8_0: 32 int8 codes + an fp16 scale = 34 bytes
    "int4": 4,                              # the codes alone: the "8:1" in the claims
    "int4-g32 sym (Q4_0)": 4 + 16 / 32,     # llama.cpp Q4_0: 16 bytes of nibbles + an fp16 scale = 18 bytes
    "int4-g32 asym (Q4_1)": 4 + 32 / 32,    # llama.cpp Q4_1: + an fp16 minimum = 20 bytes per 32 weights
    "int4-g128 asym": 4 + 32 / 128,         # GPTQ/AWQ-style: fp16 scale and zero per 128 weights
}


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def bits_of(precision: str | float) -> float:
    """Bits per weight of a precision name from PRECISIONS, or a number of bits in (0, 32] as it is."""
    if isinstance(precision, str):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)} or a number of bits, got {precision!r}")
        return PRECISIONS[precision]
    try:
        weight_bytes(1, precision)  # a real number in (0, 32]
    except (TypeError, ValueError):
        raise ValueError(f"precision must be one of {list(PRECISIONS)} or a number of bits in (0, 32], "
                         f"got {precision!r}") from None
    return float(precision)


def activation_bytes(spec: ModelSpec, batch: int, seq_len: int, bytes_per_element: float = 2) -> int:
    """Peak bytes of the temporary tensors of one prefill forward pass (inference, no gradients).

    Layers run one after another and free their temporaries, so the peak is that of one layer, reached in
    the MLP: the residual stream and its normalized copy (2 x d_model per token) plus, for SwiGLU, three
    d_ff-wide tensors (gate, silu(gate), up; their product replaces one of them), for GELU two. Attention is
    assumed to run in a fused kernel that never stores the seq_len x seq_len score matrix.
    An estimate: TinyLM's own forward pass peaks within 25% of it (tests/test_footprint.py follows its live
    tensors); rotary and grouped-query temporaries in attention make up the difference."""
    batch, seq_len = _count("batch", batch), _count("seq_len", seq_len)
    element = _positive("bytes_per_element", bytes_per_element)
    wide = 3 if spec.mlp == "swiglu" else 2
    per_token = 2 * spec.d_model + wide * spec.d_ff
    return math.ceil(batch * seq_len * per_token * element)


def footprint(spec: ModelSpec, precision: str | float = "bf16", batch: int = 1, context: int = 2048,
              kv_bytes_per_element: float = 2, act_bytes_per_element: float = 2) -> dict[str, float]:
    """Bytes to serve `batch` sequences of `context` tokens: {"weights", "kv_cache", "activations", "total"}.

    Weights at `precision` (a PRECISIONS name or bits per weight); the KV cache for every token of every
    sequence; the prefill activations of the whole batch at once (an upper bound: servers prefill in chunks).
    """
    batch, context = _count("batch", batch), _count("context", context)
    out = {
        "weights": weight_bytes(spec.n_params, bits_of(precision)),
        "kv_cache": float(batch * context * spec.kv_bytes_per_token(kv_bytes_per_element)),
        "activations": float(activation_bytes(spec, batch, context, act_bytes_per_element)),
    }
    out["total"] = sum(out.values())
    return out


def params_read(spec: ModelSpec, batch: int = 1) -> float:
    """Parameters read from memory in one decode step of `batch` sequences (one new token each).

    A dense model reads every weight matrix once per step, whatever the batch; of an input embedding table
    that is not tied to the output layer (and of learned position embeddings) it reads only the rows of the
    batch's tokens. A mixture of experts reads only the experts its tokens were routed to: if each token
    picks its k = experts_per_token experts uniformly and independently of the other tokens, one layer
    touches on average n_experts * (1 - (1 - k / n_experts) ** batch) distinct experts, so the saving fades
    as the batch grows."""
    batch = _count("batch", batch)
    idle_share = (1 - spec.experts_per_token / spec.n_experts) ** batch
    experts_read = spec.n_experts * (1 - idle_share)
    expert = spec.counts()["expert_mlp"]
    rows_unread = spec.positions - min(batch, spec.positions)
    if not spec.tied_embeddings:
        rows_unread += spec.vocab_size - min(batch, spec.vocab_size)
    return spec.n_params - spec.n_layers * (spec.n_experts - experts_read) * expert - rows_unread * spec.d_model


def decode_flops_per_step(spec: ModelSpec, batch: int = 1, context: int = 2048) -> float:
    """FLOP of one decode step: 2 per weight a token multiplies (its active matrices; looking up an embedding
    row and normalizing are not counted, biases are counted as weights) plus attention over `context` cached
    tokens, 4 x layers x context x n_heads x head_dim per token (scores q.k and the weighted sum of values)."""
    batch, context = _count("batch", batch), _count("context", context)
    lookups = spec.positions + (0 if spec.tied_embeddings else spec.vocab_size)
    matmul = 2 * (spec.active_params - lookups * spec.d_model - spec.counts()["norm"])
    attention = 4 * spec.n_layers * context * spec.n_heads * spec.head_dim
    return batch * (matmul + attention)


def decode_bytes_per_step(spec: ModelSpec, precision: str | float = "bf16", batch: int = 1, context: int = 2048,
                          kv_bytes_per_element: float = 2) -> float:
    """Bytes one decode step reads: the weights it uses (once, shared by the batch) plus the KV cache of
    `context` tokens of every sequence."""
    batch, context = _count("batch", batch), _count("context", context)
    return (weight_bytes(params_read(spec, batch), bits_of(precision))
            + batch * context * spec.kv_bytes_per_token(kv_bytes_per_element))


def decode_tokens_per_s(spec: ModelSpec, precision: str | float, batch: int, context: int, bandwidth: float,
                        kv_bytes_per_element: float = 2, peak_flops: float | None = None) -> float:
    """Ceiling on decoding throughput in tokens/s (all sequences together). Every step makes one token per
    sequence and takes at least decode_bytes_per_step / bandwidth seconds, and, when `peak_flops` (FLOP/s)
    is given, at least decode_flops_per_step / peak_flops: large batches reach the compute roof."""
    seconds = decode_ceiling(decode_bytes_per_step(spec, precision, batch, context, kv_bytes_per_element),
                             bandwidth) ** -1
    if peak_flops is not None:
        seconds = max(seconds, decode_flops_per_step(spec, batch, context) / _positive("peak_flops", peak_flops))
    return batch / seconds
