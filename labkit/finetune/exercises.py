"""Notebook 09's exercises, defined once (the notebook's check cells and tests/finetune/test_exercises.py use them):

    SIXTEEN_BYTES  mixed_precision_adam_bytes(n_params) -> {"weights", "gradients", "master", "adam m", "adam v",
                   "total"}: bytes to train n_params parameters with mixed-precision Adam          (section 1)
    LORA_QKV       lora_qkv_forward(x, W, sizes, adapters, alpha) -> y [.., q + k + v]: a fused q/k/v projection
                   W [q + k + v, in] plus LoRA adapters on some of its three parts, each of its own rank
                                                                                                 (section 3)
    BLOCK_QUANT    quantize_blockwise(x, code, block) -> (codes uint8 [n], absmax float32 [blocks]): each value
                   the index of the nearest level of `code` to value / its block's absmax, ties to the lower
                   level                                                                         (section 4)
    LORA_BUDGET    largest_rank(model, method, budget, tokens, checkpointing) -> the largest LoRA rank whose
                   training bytes (memory.training_memory) fit in `budget`, 0 when none does   (section 6)
"""

from __future__ import annotations

import math

import torch

from ..course import Exercise
from ..rng import Rng
from .memory import ADAM_BYTES, max_rank, training_memory
from .optim8bit import CODEBOOKS, quantize_blockwise


def mixed_precision_adam_bytes(n_params: int) -> dict[str, int]:
    """Bytes by part, and their total, for n_params parameters under mixed-precision Adam (ZeRO's 16 per parameter)."""
    out = {part: b * n_params for part, b in ADAM_BYTES.items()}
    out["total"] = sum(out.values())
    return out


SIXTEEN_BYTES = Exercise("mixed_precision_adam_bytes", mixed_precision_adam_bytes,
                         cases=[(820_352,), (6_738_415_616,)],  # TinyLM, Llama-2-7B
                         random_case=lambda rng: (10**6 + rng.below(10**12),))

QKV = ("q", "k", "v")


class Adapters(dict):
    """{"q": (A, B), ...}: a dict whose repr lists the factors' shapes (a check's [FAIL] line stays one line)."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{p!r}: (A {list(a.shape)}, B {list(b.shape)})" for p, (a, b) in self.items()) + "}"


def lora_qkv_forward(x: torch.Tensor, W: torch.Tensor, sizes: tuple[int, int, int], adapters: dict,
                     alpha: float) -> torch.Tensor:
    """x [.., in] -> [.., q + k + v]: x W^T for the fused weight W [q + k + v, in] (rows: q's `sizes[0]`, then k's,
    then v's), plus, on the part p of each adapters[p] = (A [r, in], B [size of p, r]) (PEFT's lora_A, lora_B),
    (alpha / r) (x A^T) B^T, r that adapter's own rank. Never builds an [out, in] product."""
    parts = list((x @ W.T).split(list(sizes), dim=-1))
    for i, name in enumerate(QKV):
        if name in adapters:
            A, B = adapters[name]
            parts[i] = parts[i] + (x @ A.T) @ B.T * (alpha / A.shape[0])
    return torch.cat(parts, dim=-1)


def random_qkv_case(rng: Rng) -> tuple:
    """Float64 x [b, in], a fused W for h query heads and g key/value heads of width d (g divides h: grouped-query
    attention), adapters on a random subset of q, k, v with ranks 1..min(in, part) (B not zero), alpha 1..32."""
    g = torch.Generator().manual_seed(rng.below(2**31))
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    d, kv_heads = 1 + rng.below(4), 1 + rng.below(2)
    sizes = (d * kv_heads * (1 + rng.below(3)), d * kv_heads, d * kv_heads)
    n_in, b = 1 + rng.below(12), 1 + rng.below(4)
    adapters = {}
    for name, size in zip(QKV, sizes):
        if rng.below(3):
            r = 1 + rng.below(min(n_in, size))
            adapters[name] = (t(r, n_in), t(size, r))
    return t(b, n_in), t(sum(sizes), n_in), sizes, Adapters(adapters), float(1 + rng.below(32))


def _qkv_case(seed: int, n_in: int, sizes: tuple[int, int, int], ranks: dict[str, int], alpha: float) -> tuple:
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    adapters = Adapters({p: (t(r, n_in), t(sizes[QKV.index(p)], r)) for p, r in ranks.items()})
    return t(3, n_in), t(sum(sizes), n_in), sizes, adapters, alpha


LORA_QKV = Exercise("lora_qkv_forward", lora_qkv_forward, cases=[
    _qkv_case(0, 8, (8, 4, 4), {"q": 2, "v": 2}, 16.0),          # the LoRA paper's W_q and W_v, grouped k and v
    _qkv_case(1, 6, (6, 3, 3), {"k": 3}, 4.0),                   # k only: q and v stay the frozen projection
    _qkv_case(2, 8, (8, 2, 2), {"q": 4, "k": 1, "v": 2}, 8.0),   # three ranks: each adapter scales by its own
    _qkv_case(3, 4, (4, 4, 4), {}, 16.0)],                       # no adapter: the frozen projection alone
    random_case=random_qkv_case)

DYADIC = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
"""A codebook whose midpoints, and every value's distances to its levels, are exact in float32: a value on a
midpoint is a tie under any way of computing the nearest level."""


def random_block_case(rng: Rng) -> tuple:
    """One time in three an exact-tie case: a dyadic codebook (levels j / 2**m), each block's absmax a power of 2
    and values on levels and midpoints. Otherwise x float32 [n] (n 1..700, values spread over several decades,
    some zeros) with the signed or unsigned dynamic codebook. Blocks of 16, 64 or 256."""
    g = torch.Generator().manual_seed(rng.below(2**31))
    n, block = 1 + rng.below(700), (16, 64, 256)[rng.below(3)]
    if rng.below(3) == 0:
        m = 1 + rng.below(6)
        code = torch.arange(-2**m, 2**m + 1, dtype=torch.float32) / 2**m
        halves = torch.randint(-2 ** (m + 1), 2 ** (m + 1) + 1, (n,), generator=g).float() / 2 ** (m + 1)
        scale = 2.0 ** (rng.below(7) - 3)
        x = halves * scale
        x[::block] = scale  # every |value| <= scale: each block's absmax is this power of 2
        return x, code, block
    signed = bool(rng.below(2))
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 2, (n,), generator=g).float()
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if not signed:
        x = x.abs()
    return x, CODEBOOKS[signed], block


BLOCK_QUANT = Exercise("quantize_blockwise", quantize_blockwise, cases=[
    (torch.tensor([0.5, -1.0, 0.0, 0.25]), CODEBOOKS[True], 2),
    (torch.zeros(5), CODEBOOKS[True], 4),
    (torch.tensor([3.0, 3e-4, 0.0]), CODEBOOKS[False], 256),
    (torch.tensor([4.0, 1.0, -3.0, 0.0, 2.0, -1.0]), DYADIC, 8),       # exact ties at 0.25, -0.75, -0.25
    (torch.tensor([1.0, 0.75, -0.25, 0.25, -0.75, -1.0]), DYADIC, 3)],  # ties in two blocks of absmax 1
    random_case=random_block_case)


def largest_rank(model: str, method: str, budget: int, tokens: int, checkpointing: bool) -> int:
    """The largest LoRA rank r <= memory.max_rank(model) for which training_memory(model, method, tokens, r,
    checkpointing)["total"] <= budget (bytes); 0 when rank 1 does not fit. Found by bisection: the total grows
    with r."""
    def fits(r: int) -> bool:
        return training_memory(model, method, tokens, r, checkpointing)["total"] <= budget

    if not fits(1):
        return 0
    lo, hi = 1, max_rank(model)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


BUDGET_MODELS = ("tinylm", "llama-2-7b", "llama-3-8b", "mixtral-8x7b", "opt-13b")


def random_budget_case(rng: Rng) -> tuple:
    """A model of BUDGET_MODELS, lora or qlora, 2**8..2**14 tokens, checkpointing or not, and a budget between
    the totals at two neighbouring ranks (up to 1024); one time in six below rank 1's total, one in six above
    the largest rank's."""
    model, method = rng.choice(BUDGET_MODELS), rng.choice(("lora", "qlora"))
    tokens, ckpt = 2 ** (8 + rng.below(7)), bool(rng.below(2))
    cap = max_rank(model)

    def total(r: int) -> float:
        return training_memory(model, method, tokens, r, ckpt)["total"]

    kind = rng.below(6)
    if kind == 0:
        budget = int(total(1)) - 1 - rng.below(10**6)
    elif kind == 1:
        budget = math.ceil(total(cap)) + rng.below(10**9)
    else:
        r = 1 + rng.below(min(cap - 1, 2 ** (1 + rng.below(10))))  # ranks of a few to a thousand
        budget = int(total(r) + (total(r + 1) - total(r)) * rng.below(1000) / 1000)
    return model, method, max(budget, 1), tokens, ckpt


def _budget_case(model: str, method: str, rank: float, tokens: int, ckpt: bool) -> tuple:
    """A fixed case whose budget is the total at `rank` (a fraction: between two ranks)."""
    lo = training_memory(model, method, tokens, int(rank), ckpt)["total"]
    hi = training_memory(model, method, tokens, int(rank) + 1, ckpt)["total"]
    return model, method, int(lo + (hi - lo) * (rank - int(rank))), tokens, ckpt


LORA_BUDGET = Exercise("largest_rank", largest_rank, cases=[
    _budget_case("llama-2-7b", "lora", 16, 4096, True),      # a budget exactly on a rank's total: it fits
    _budget_case("llama-2-7b", "qlora", 100.5, 4096, True),  # between two ranks
    ("llama-2-7b", "lora", 16 * 10**9, 4096, False),         # a 16 GB machine without checkpointing: no rank
    ("tinylm", "lora", 10**9, 256, False),                    # more than enough: the largest rank TinyLM allows
    _budget_case("mixtral-8x7b", "qlora", 7.25, 1024, True)],  # experts get no adapters
    random_case=random_budget_case)
