"""The capacity wall: how many bytes a model needs for weights, KV cache and activations.

Used by notebook 01_memory_wall (footprints, decode ceilings, the calculator). Units: bytes, bytes/s,
FLOP, tokens/s; GB = 1e9 bytes.
"""

from __future__ import annotations

import math

from .roofline import decode_ceiling, weight_bytes
from .._checks import check_number, check_positive, check_positive_int, check_type, fail, is_number
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


def _spec(spec) -> ModelSpec:
    """A ModelSpec; a preset's name instead of one is refused with the call that makes the spec."""
    if isinstance(spec, str):
        fail("spec", spec, f"a labkit.specs.ModelSpec, not a name: labkit.specs.model({spec!r}) makes one",
             TypeError)
    return check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")


def _sizes(batch, context, context_name: str = "context") -> tuple[int, int]:
    batch = check_positive_int("batch", batch, unit="sequences")
    return batch, check_positive_int(context_name, context, unit="tokens")


def bits_of(precision: str | float) -> float:
    """Bits per weight of a precision name from PRECISIONS, or a number of bits in (0, 32] as it is.
    A name that is not in PRECISIONS or a number outside (0, 32] is a ValueError; anything else a TypeError."""
    expected = f"one of {list(PRECISIONS)} or a number of bits in (0, 32]"
    if isinstance(precision, str):
        if precision not in PRECISIONS:
            fail("precision", precision, expected)
        return PRECISIONS[precision]
    if not is_number(precision):
        fail("precision", precision, expected, TypeError)
    if not (math.isfinite(precision) and 0 < precision <= 32):
        fail("precision", precision, expected)
    return float(precision)


def activation_bytes(spec: ModelSpec, batch: int, seq_len: int, bytes_per_element: float = 2) -> int:
    """Peak bytes of the temporary tensors of one prefill forward pass (inference, no gradients).

    Layers run one after another and free their temporaries, so the peak is that of one layer, reached in
    the MLP: the residual stream and its normalized copy (2 x d_model per token) plus, for SwiGLU, three
    d_ff-wide tensors (gate, silu(gate), up; their product replaces one of them), for GELU two. Attention is
    assumed to run in a fused kernel that never stores the seq_len x seq_len score matrix.
    An estimate: TinyLM's own forward pass peaks within 25% of it (tests/memory_wall/test_footprint.py follows
    its live tensors); rotary and grouped-query temporaries in attention make up the difference."""
    spec = _spec(spec)
    batch, seq_len = _sizes(batch, seq_len, "seq_len")
    element = check_positive("bytes_per_element", bytes_per_element, unit="bytes")
    wide = 3 if spec.mlp == "swiglu" else 2
    per_token = 2 * spec.d_model + wide * spec.d_ff
    return math.ceil(batch * seq_len * per_token * element)


def footprint(spec: ModelSpec, precision: str | float = "bf16", batch: int = 1, context: int = 2048,
              kv_bytes_per_element: float = 2, act_bytes_per_element: float = 2) -> dict[str, float]:
    """Bytes to serve `batch` sequences of `context` tokens: {"weights", "kv_cache", "activations", "total"}.

    Weights at `precision` (a PRECISIONS name or bits per weight); the KV cache for every token of every
    sequence; the prefill activations of the whole batch at once (an upper bound: servers prefill in chunks).
    """
    spec, bits = _spec(spec), bits_of(precision)
    batch, context = _sizes(batch, context)
    kv = check_positive("kv_bytes_per_element", kv_bytes_per_element, unit="bytes")
    act = check_positive("act_bytes_per_element", act_bytes_per_element, unit="bytes")
    out = {
        "weights": weight_bytes(spec.n_params, bits),
        "kv_cache": float(batch * context * spec.kv_bytes_per_token(kv)),
        "activations": float(activation_bytes(spec, batch, context, act)),
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
    spec, batch = _spec(spec), check_positive_int("batch", batch, unit="sequences")
    idle_share = (1 - spec.experts_per_token / spec.n_experts) ** batch
    experts_read = spec.n_experts * (1 - idle_share)
    expert = spec.counts()["expert_mlp"]
    rows_unread = spec.positions - min(batch, spec.positions)
    if not spec.tied_embeddings:
        rows_unread += spec.vocab_size - min(batch, spec.vocab_size)
    return spec.n_params - spec.moe_layers * (spec.n_experts - experts_read) * expert - rows_unread * spec.d_model


def decode_flops_per_step(spec: ModelSpec, batch: int = 1, context: int = 2048) -> float:
    """FLOP of one decode step: 2 per weight a token multiplies (its active matrices; looking up an embedding
    row and normalizing are not counted, biases are counted as weights) plus attention over `context` cached
    tokens, 4 x layers x context x n_heads x head_dim per token (scores q.k and the weighted sum of values)."""
    spec = _spec(spec)
    batch, context = _sizes(batch, context)
    lookups = spec.positions + (0 if spec.tied_embeddings else spec.vocab_size)
    matmul = 2 * (spec.active_params - lookups * spec.d_model - spec.counts()["norm"])
    attention = 4 * spec.n_layers * context * spec.n_heads * spec.head_dim
    return batch * (matmul + attention)


def decode_bytes_per_step(spec: ModelSpec, precision: str | float = "bf16", batch: int = 1, context: int = 2048,
                          kv_bytes_per_element: float = 2) -> float:
    """Bytes one decode step reads: the weights it uses (once, shared by the batch) plus the KV cache of
    `context` tokens of every sequence."""
    spec, bits = _spec(spec), bits_of(precision)
    batch, context = _sizes(batch, context)
    kv = check_positive("kv_bytes_per_element", kv_bytes_per_element, unit="bytes")
    return weight_bytes(params_read(spec, batch), bits) + batch * context * spec.kv_bytes_per_token(kv)


def decode_tokens_per_s(spec: ModelSpec, precision: str | float, batch: int, context: int, bandwidth: float,
                        kv_bytes_per_element: float = 2, peak_flops: float | None = None) -> float:
    """Ceiling on decoding throughput in tokens/s (all sequences together). Every step makes one token per
    sequence and takes at least decode_bytes_per_step / bandwidth seconds, and, when `peak_flops` (FLOP/s)
    is given, at least decode_flops_per_step / peak_flops: large batches reach the compute roof."""
    peak = None if peak_flops is None else check_positive("peak_flops", peak_flops, unit="FLOP/s")
    seconds = decode_ceiling(decode_bytes_per_step(spec, precision, batch, context, kv_bytes_per_element),
                             bandwidth) ** -1
    if peak is not None:
        seconds = max(seconds, decode_flops_per_step(spec, batch, context) / peak)
    return batch / seconds


def devices_needed(spec: ModelSpec, precision: str | float, batch: int, context: int, memory_bytes: int,
                   kv_bytes_per_element: float = 2) -> int:
    """How many devices of `memory_bytes` bytes hold the weights at `precision` plus the KV cache of `batch`
    sequences of `context` tokens (notebook 01's tables and plots, and the calculator). Activations are left
    out: they are transient, and servers prefill long prompts in chunks to keep them small."""
    memory = check_number("memory_bytes", memory_bytes, low=1, unit="bytes")
    f = footprint(spec, precision, batch, context, kv_bytes_per_element)
    return max(1, math.ceil((f["weights"] + f["kv_cache"]) / memory))  # memory >= 1 byte: a finite count


def fits(spec: ModelSpec, precision: str | float, batch: int, context: int, memory_bytes: int,
         kv_bytes_per_element: float = 2) -> bool:
    """Whether weights and KV cache fit on one device of `memory_bytes` bytes (see devices_needed)."""
    return devices_needed(spec, precision, batch, context, memory_bytes, kv_bytes_per_element) == 1
