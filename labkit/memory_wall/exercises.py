"""Notebook 01's exercises, defined once (reference, fixed cases, random cases, tolerance): the check cell
after each exercise calls `check.exercise(my_fn, exercises.NAME)`, and tests/memory_wall/test_exercises.py
proves that each reference passes its own check and that a wrong answer fails it.

    KV_BYTES_PER_TOKEN     exercise 1: bytes the KV cache grows by per token (labkit.specs), an int
                           rounded up: a float, or a total rounded down or to the nearest, fails
    ATTAINABLE_FLOPS       exercise 2: the roofline at one intensity (roofline.attainable_flops)
    DENSE_DECODE_CEILING   exercise 3: tokens/s of a dense model's decode step, from bytes and bandwidth,
                           for the whole batch (a fixed case of 8 sequences catches a per-sequence answer)

Each fixed case is chosen to tell one wrong answer from the right one (the comment beside it says which);
the random cases cover the rest.

Units: bytes, bytes/s, FLOP/s, tokens/s.
"""

from __future__ import annotations

from typing import Any

from .roofline import attainable_flops, decode_ceiling, weight_bytes
from .._checks import check_positive, check_positive_int, is_int
from ..course import Exercise
from ..rng import Rng
from ..specs import kv_bytes_per_token, model

# the presets exercise 3 draws its random cases from, and the bandwidths (bytes/s) it reads them at:
# an M2 Ultra, an H100 SXM, an H200
CEILING_MODELS = ("llama-2-7b", "llama-2-70b", "llama-3-8b", "opt-13b", "gpt3-175b")
CEILING_BANDWIDTHS = (800e9, 3.35e12, 4.8e12)


def dense_decode_ceiling(n_params: float, bits: float, kv_per_token: int, batch: int, context: int,
                         bandwidth: float) -> float:
    """Exercise 3's reference: tokens/s of a dense model (all sequences together) when each decode step reads
    `n_params` weights at `bits` bits plus the KV cache of `batch` sequences of `context` tokens at
    `kv_per_token` bytes per token, from memory of `bandwidth` bytes/s, and makes one token per sequence."""
    kv = check_positive_int("kv_per_token", kv_per_token, unit="bytes")
    batch = check_positive_int("batch", batch, unit="sequences")
    context = check_positive_int("context", context, unit="tokens")
    step = weight_bytes(n_params, bits) + batch * context * kv
    return batch * decode_ceiling(step, check_positive("bandwidth", bandwidth, unit="bytes/s"))


def whole_bytes(got: Any, expected: int) -> bool:
    """Exercise 1's comparison: an int (not a float such as 32768.0, not a bool) equal to the expected one."""
    return is_int(got) and got == expected


def random_kv_case(rng: Rng) -> tuple:
    """(n_layers, n_kv_heads, head_dim, bytes_per_element): up to 128 layers and 64 KV heads, heads of 16 to
    256 elements, elements of INT4 to FP32."""
    return (1 + rng.below(128), 1 + rng.below(64), 16 * (1 + rng.below(16)), rng.choice([0.5, 1, 2, 4]))


def random_roofline_case(rng: Rng) -> tuple:
    """(intensity, peak_flops, bandwidth): 0.01 to 1,000 FLOP/byte, 1 GFLOP/s to 1 PFLOP/s, 1 GB/s to 10 TB/s."""
    return (0.01 * (1 + rng.below(100000)), 1e9 * (1 + rng.below(10**6)), 1e9 * (1 + rng.below(10**4)))


def random_ceiling_case(rng: Rng) -> tuple:
    """A real model's (n_params, bits, KV bytes per token at FP16), a batch of 1 to 64 sequences of 128 to
    8,192 tokens, and a real device's bandwidth."""
    m = model(rng.choice(CEILING_MODELS))
    return (m.n_params, rng.choice([4, 4.5, 8, 16]), m.kv_bytes_per_token(2), 1 + rng.below(64),
            128 * (1 + rng.below(64)), rng.choice(CEILING_BANDWIDTHS))


KV_BYTES_PER_TOKEN = Exercise(
    "kv_bytes_per_token", kv_bytes_per_token,
    cases=[(40, 40, 128, 2),     # OPT-13B: 819,200 bytes, the vLLM paper's figure
           (80, 8, 128, 2),      # Llama-2-70B: 8 KV heads of 64 query heads
           (32, 8, 128, 0.5),    # Llama-3-8B at INT4: 32768 bytes; a float 32768.0 fails
           (1, 1, 1, 0.75),      # one layer of 6-bit elements: 1.5 bytes, rounded up to 2 (int() gives 1)
           (3, 1, 1, 0.375)],    # three layers of 3-bit elements: 2.25 bytes -> 3 (round() gives 2)
    random_case=random_kv_case, compare=whole_bytes)

ATTAINABLE_FLOPS = Exercise(
    "attainable_flops", attainable_flops,
    cases=[(1.0, 989.4e12, 3.35e12), (1000.0, 989.4e12, 3.35e12), (0.5, 67e12, 3.35e12)],  # H100: BF16, FP32
    random_case=random_roofline_case)

DENSE_DECODE_CEILING = Exercise(
    "dense_decode_ceiling", dense_decode_ceiling,
    cases=[(6_738_415_616, 16, 2**19, 1, 4096, 3.35e12),   # Llama-2-7B in FP16 on an H100, 4k context
           # Llama-2-70B at Q4_0's 4.5 bits, 8 sequences of 4k on an H200: tokens/s of the whole batch, and
           # 8 KV caches (a per-sequence answer, or one KV cache for the batch, fails here)
           (68_976_648_192, 4.5, 327_680, 8, 4096, 4.8e12)],
    random_case=random_ceiling_case)

EXERCISES = [KV_BYTES_PER_TOKEN, ATTAINABLE_FLOPS, DENSE_DECODE_CEILING]
