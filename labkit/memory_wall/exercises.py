"""Notebook 01's exercises, defined once (reference, fixed cases, random cases, tolerance): the check cell
after each exercise calls `check.exercise(my_fn, exercises.NAME)`, and tests/memory_wall/test_exercises.py
proves that each reference passes its own check and that a wrong answer fails it.

    KV_BYTES_PER_TOKEN       exercise 1: bytes the KV cache grows by per token, read from a Hugging Face
                             config.json (a dict with LlamaConfig's keys), an int rounded up. The decisions
                             the notebook leaves to the learner: which keys count (the KV heads, not the
                             query heads), what a missing key means (transformers' LlamaConfig defaults), and
                             that an explicit head_dim wins over hidden_size / num_attention_heads
    MATMUL_ATTAINABLE_FLOPS  exercise 2: the roofline's FLOP/s for a product x[m, k] @ w[k, n] whose three
                             matrices each cross memory once: the learner decides the FLOP and the bytes (the
                             output written counts; where it dominates, forgetting it flips the verdict)
    DENSE_DECODE_CEILING     exercise 3: tokens/s of a dense model's decode step, from bytes and bandwidth,
                             for the whole batch (a fixed case of 8 sequences catches a per-sequence answer)

Each fixed case is chosen to tell one wrong answer from the right one (the comment beside it says which);
the random cases cover the rest.

Units: bytes, bytes/s, FLOP/s, tokens/s.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .roofline import attainable_flops, decode_ceiling, matmul_intensity, weight_bytes
from .._checks import check_positive, check_positive_int, check_type, fail, is_int
from ..course import Exercise
from ..paths import TINYLM_CHECKPOINT
from ..rng import Rng
from ..specs import ModelSpec, device, kv_bytes_per_token as kv_bytes, model

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


def kv_bytes_from_config(config: Mapping[str, Any], bytes_per_element: float = 2) -> int:
    """Exercise 1's reference: bytes the KV cache of a Llama-family model grows by per token of context, per
    sequence, from its Hugging Face config.json (a dict). Keys as transformers' LlamaConfig reads them:
    num_hidden_layers, num_attention_heads, hidden_size, and optionally num_key_value_heads (absent: one KV
    head per query head) and head_dim (absent: hidden_size // num_attention_heads). Other keys are ignored.
    Fractional element sizes (0.5 for INT4) are rounded up to whole bytes (specs.kv_bytes_per_token)."""
    check_type("config", config, Mapping, "a dict read from a config.json")
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if key not in config:
            fail("config", dict(config), f"a Llama config.json with the key {key!r}")
    n_heads = check_positive_int("config['num_attention_heads']", config["num_attention_heads"], unit="heads")
    n_kv = n_heads if config.get("num_key_value_heads") is None else config["num_key_value_heads"]
    head_dim = config["hidden_size"] // n_heads if config.get("head_dim") is None else config["head_dim"]
    return kv_bytes(check_positive_int("config['num_hidden_layers']", config["num_hidden_layers"], unit="layers"),
                    check_positive_int("config['num_key_value_heads']", n_kv, unit="heads"),
                    check_positive_int("config['head_dim']", head_dim, unit="elements"), bytes_per_element)


def llama_config(spec: ModelSpec) -> dict:
    """The config.json keys exercise 1 reads, for a preset of labkit.specs (standard multi-head or
    grouped-query attention; MLA models have no such config): notebook 01 runs the learner's function on them."""
    check_type("spec", spec, ModelSpec)
    if spec.is_mla:
        fail("spec", spec.name, "a model with standard or grouped-query attention (MLA caches a latent instead)")
    return {"num_hidden_layers": spec.n_layers, "hidden_size": spec.d_model, "num_attention_heads": spec.n_heads,
            "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim}


def whole_bytes(got: Any, expected: int) -> bool:
    """Exercise 1's comparison: an int (not a float such as 32768.0, not a bool) equal to the expected one."""
    return is_int(got) and got == expected


def random_kv_case(rng: Rng) -> tuple:
    """(config, bytes_per_element): a Llama-style config.json of up to 128 layers and 64 query heads, grouped
    over 1 to all of them; num_key_value_heads absent in a quarter of the cases (then every query head has its
    own KV head), head_dim given in half of them and then often not hidden_size / num_attention_heads;
    elements of 3 bits to 4 bytes; keys the cache does not depend on, as real configs carry."""
    n_kv = 1 + rng.below(16)
    n_heads = n_kv * (1 + rng.below(4))
    head_dim = 16 * (1 + rng.below(16))
    config = {"num_hidden_layers": 1 + rng.below(128), "num_attention_heads": n_heads,
              "hidden_size": n_heads * 16 * (1 + rng.below(16)),
              "intermediate_size": 64 * (1 + rng.below(256)), "vocab_size": 1000 + rng.below(150_000)}
    if rng.below(4):
        config["num_key_value_heads"] = n_kv
    if rng.below(2):
        config["head_dim"] = head_dim
    return config, rng.choice([0.375, 0.5, 0.75, 1, 2, 4])


def matmul_attainable_flops(m: int, k: int, n: int, bytes_per_element: float, peak_flops: float,
                            bandwidth: float) -> float:
    """Exercise 2's reference: FLOP/s that y[m, n] = x[m, k] @ w[k, n] can reach on a machine of `peak_flops`
    FLOP/s and `bandwidth` bytes/s when x and w are read once and y written once, every element of
    `bytes_per_element` bytes: the roofline at the product's arithmetic intensity."""
    return attainable_flops(matmul_intensity(m, n, k, bytes_per_element), peak_flops, bandwidth)


def random_matmul_case(rng: Rng) -> tuple:
    """(m, k, n, bytes_per_element, peak_flops, bandwidth): 1 to 8,192 rows, inner and output widths of 1 to
    16,384, elements of INT4 to FP32, a real device's BF16 peak and bandwidth or a random machine's."""
    shape = (1 + rng.below(8192), 1 + rng.below(16384), 1 + rng.below(16384))
    element = rng.choice([0.5, 1, 2, 4])
    if rng.below(2):
        return (*shape, element, 1e9 * (1 + rng.below(10**6)), 1e9 * (1 + rng.below(10**4)))
    return (*shape, element, *rng.choice(MATMUL_DEVICES))


def random_ceiling_case(rng: Rng) -> tuple:
    """A real model's (n_params, bits, KV bytes per token at FP16), a batch of 1 to 64 sequences of 128 to
    8,192 tokens, and a real device's bandwidth."""
    m = model(rng.choice(CEILING_MODELS))
    return (m.n_params, rng.choice([4, 4.5, 8, 16]), m.kv_bytes_per_token(2), 1 + rng.below(64),
            128 * (1 + rng.below(64)), rng.choice(CEILING_BANDWIDTHS))


TINYLM_CONFIG = json.loads((TINYLM_CHECKPOINT / "config.json").read_text())  # data/tinylm/config.json

KV_BYTES_PER_TOKEN = Exercise(
    "kv_bytes_per_token", kv_bytes_from_config,
    cases=[(TINYLM_CONFIG, 4),  # TinyLM's own config.json, FP32 elements
           # Llama-2-70B's config.json: 8 KV heads of 64 query heads (num_attention_heads gives 8x too much)
           ({"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
             "num_key_value_heads": 8, "vocab_size": 32000}, 2),
           # a Llama-1-style config.json, written before num_key_value_heads existed: every query head has its
           # own KV head (config["num_key_value_heads"] raises KeyError here)
           ({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
             "vocab_size": 32000}, 2),
           # Qwen3-0.6B's config.json: head_dim 128 with 16 heads of a 1024-wide model (hidden_size //
           # num_attention_heads gives half)
           ({"head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
             "num_hidden_layers": 28, "num_key_value_heads": 8, "vocab_size": 151936}, 2),
           # three layers of one 1-wide KV head at 3 bits: 2.25 bytes -> 3 (int() and round() give 2)
           ({"hidden_size": 2, "num_attention_heads": 2, "num_hidden_layers": 3, "num_key_value_heads": 1}, 0.375)],
    random_case=random_kv_case, compare=whole_bytes)

# (peak FLOP/s in BF16, bandwidth bytes/s) of an H100 SXM and an RTX 4090 (data/hardware.json)
MATMUL_DEVICES = tuple((device(name).peak_flops["bf16"], device(name).bandwidth) for name in ("h100-sxm", "rtx-4090"))

MATMUL_ATTAINABLE_FLOPS = Exercise(
    "matmul_attainable_flops", matmul_attainable_flops,
    cases=[(1, 4096, 4096, 2, 989.4e12, 3.35e12),      # one token through a 4096x4096 BF16 layer: memory-bound
           (8192, 8192, 8192, 2, 989.4e12, 3.35e12),   # a large square product: compute-bound (max() fails here)
           # a 512-wide square product: still memory-bound on an H100; the written output is a third of its bytes
           (512, 512, 512, 2, 989.4e12, 3.35e12),
           # attention scores of 4,096 tokens, 128-wide heads: the 4096x4096 output is 94% of the bytes, so a
           # product that forgets it looks compute-bound
           (4096, 128, 4096, 2, 989.4e12, 3.35e12)],
    random_case=random_matmul_case)

DENSE_DECODE_CEILING = Exercise(
    "dense_decode_ceiling", dense_decode_ceiling,
    cases=[(6_738_415_616, 16, 2**19, 1, 4096, 3.35e12),   # Llama-2-7B in FP16 on an H100, 4k context
           # Llama-2-70B at Q4_0's 4.5 bits, 8 sequences of 4k on an H200: tokens/s of the whole batch, and
           # 8 KV caches (a per-sequence answer, or one KV cache for the batch, fails here)
           (68_976_648_192, 4.5, 327_680, 8, 4096, 4.8e12)],
    random_case=random_ceiling_case)

EXERCISES = [KV_BYTES_PER_TOKEN, MATMUL_ATTAINABLE_FLOPS, DENSE_DECODE_CEILING]
