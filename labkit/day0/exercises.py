"""Notebook 07's exercises, defined once (the notebook's check cells and tests/day0/test_exercises.py use them):

    QK_NORM     qk_norm(x, weight, eps) -> x RMS-normalised over its last dimension (head_dim), times weight:
                the operator the course's runtime lacks on day 0                                  (section 2)
    RANK_PART   rank_part(weight, style, rank, tp) -> the part of a stored tensor that tensor-parallel rank
                `rank` of `tp` holds, for a split style of labkit.day0.tp_plan                    (section 3)
    BLOCK_KEYS  block_extra_keys(images, start, end) -> the extra keys of the KV block of positions
                [start, end): (image hash, offset - start) of every image overlapping it          (section 6)

The references are the package's own code: the operator table's qk_norm (labkit.day0.operators), the loader's
rank_slice (labkit.day0.loading), and the block manager's mm_extra_keys (labkit.kv_cache.prefix, vLLM's
_gen_mm_extra_hash_keys). tests/day0/test_exercises.py checks each against an independent reference.
"""

from __future__ import annotations

import torch

from ..course import Exercise
from ..kv_cache import prefix
from ..rng import Rng
from .loading import rank_slice
from .operators import qk_norm

STYLES = ("column", "row", "vocab", "replicated")


def _tensor(rng: Rng, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.below(2**31))
    return torch.randn(shape, generator=gen) * scale


# --- QK_NORM --------------------------------------------------------------------------------------------------

def random_qk_norm_case(rng: Rng) -> tuple[torch.Tensor, torch.Tensor, float]:
    shape = (1 + rng.below(2), 1 + rng.below(4), 1 + rng.below(6), 2 ** (1 + rng.below(5)))  # [B, H, T, head_dim]
    scale = (0.001, 0.1, 1.0, 30.0)[rng.below(4)]
    return _tensor(rng, shape, scale), 0.5 + _tensor(rng, shape[-1:]).abs(), (1e-5, 1e-6)[rng.below(2)]


def _qk_norm_cases() -> list[tuple]:
    rng = Rng(70)
    ramp = torch.arange(1.0, 9.0).view(1, 1, 2, 4)                         # two rows of 4: rms 2.74 and 6.6
    return [(ramp, torch.ones(4), 1e-6),
            (ramp, torch.tensor([1.0, 2.0, 0.5, -1.0]), 1e-6),              # the weight scales each position
            (_tensor(rng, (2, 4, 3, 8)), 1 + _tensor(rng, (8,)).abs(), 1e-5),
            (_tensor(rng, (1, 2, 2, 16), 1e-4), torch.ones(16), 1e-5)]      # tiny q: eps inside the root matters


QK_NORM = Exercise("qk_norm", qk_norm, cases=_qk_norm_cases(), random_case=random_qk_norm_case, rtol=1e-5,
                   atol=1e-6)


# --- RANK_PART ------------------------------------------------------------------------------------------------

def rank_part(weight: torch.Tensor, style: str, rank: int, tp: int) -> torch.Tensor:
    """The part of `weight` that rank `rank` of `tp` holds: "column" and "vocab" split dimension 0 (output
    features, vocabulary rows) into tp equal blocks, "row" splits dimension 1 (input features), "replicated"
    is the whole tensor on every rank. The loader's own rule (labkit.day0.loading.rank_slice)."""
    return weight[rank_slice(tuple(weight.shape), style, rank, tp)]


def random_rank_part_case(rng: Rng) -> tuple[torch.Tensor, str, int, int]:
    style, tp = STYLES[rng.below(len(STYLES))], (1, 2, 4, 8)[rng.below(4)]
    shape = (tp * (1 + rng.below(4)),) if style == "replicated" and rng.below(2) else \
        (tp * (1 + rng.below(4)), tp * (1 + rng.below(4)))
    return _tensor(rng, shape), style, rng.below(tp), tp


RANK_PART = Exercise("rank_part", rank_part, cases=[
    (torch.arange(24.0).view(6, 4), "column", 1, 2),       # rows 3..5
    (torch.arange(24.0).view(4, 6), "row", 2, 3),          # columns 4..5 of every row
    (torch.arange(32.0).view(8, 4), "vocab", 3, 4),        # rows 6..7
    (torch.arange(5.0), "replicated", 1, 2),               # a norm: the whole vector
    (torch.arange(12.0).view(3, 4), "row", 0, 1)],         # tp = 1: everything
    random_case=random_rank_part_case)


# --- BLOCK_KEYS -----------------------------------------------------------------------------------------------

def block_extra_keys(images: list[tuple[int, int, str]], start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The extra keys of the KV block holding token positions [start, end), in the order of `images` ((offset,
    length, image hash) triples sorted by offset, not overlapping): (hash, offset - start) for every image
    with at least one placeholder inside the block. The block manager's own rule (vLLM's extra keys)."""
    return prefix.mm_extra_keys(images, start, end)


def random_block_keys_case(rng: Rng) -> tuple[list[tuple[int, int, str]], int, int]:
    images, at = [], rng.below(6)
    for i in range(rng.below(5)):
        length = 1 + rng.below(20)
        images.append((at, length, f"{rng.below(2**32):08x}"))
        at += length + rng.below(8)
    block = 2 ** (1 + rng.below(4))
    start = block * rng.below(max(1, at // block + 2))
    return images, start, start + block


BLOCK_KEYS = Exercise("block_extra_keys", block_extra_keys, cases=[
    ([(0, 16, "a1")], 0, 16),                      # the image fills the block: ("a1", 0)
    ([(0, 16, "a1")], 16, 32),                     # the block after it: no image, no keys
    ([(4, 16, "a1")], 16, 32),                     # the image's tail: it started 12 positions before the block
    ([(2, 3, "a1"), (7, 4, "b2")], 0, 8),          # two images share the block
    ([(8, 8, "a1")], 0, 8),                        # starts where the block ends: not in it
    ([], 0, 16)],
    random_case=random_block_keys_case)
