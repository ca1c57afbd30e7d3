"""Notebook 05's exercises, defined once (the notebook's check cells and tests/kv_cache/test_exercises.py use
them):

    BLOCKS_NEEDED  blocks_needed(n_tokens, block_size) -> int          (section 2)
    HASH_CHAIN     hash_chain(tokens, block_size) -> [hash of each full block], chained with
                   labkit.kv_cache.block_hash(parent, block_tokens)     (section 2)
    PAGED_GATHER   gather(pool, block_table, length, block_size) -> [n_kv_heads, length, head_dim]
                   on index_pool(...) pools, whose values name their slots    (section 3)
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int
from ..course import Exercise
from ..rng import Rng
from .blocks import blocks_needed
from .paged import gather
from .prefix import hash_chain


def random_blocks_case(rng: Rng) -> tuple[int, int]:
    return rng.below(2000), 2 ** rng.below(9)


BLOCKS_NEEDED = Exercise("blocks_needed", blocks_needed, cases=[(0, 16), (1, 16), (16, 16), (17, 16), (40, 16)],
                         random_case=random_blocks_case)


def random_chain_case(rng: Rng) -> tuple[list[int], int]:
    return [rng.below(256) for _ in range(rng.below(60))], 2 ** rng.below(5)


HASH_CHAIN = Exercise("hash_chain", hash_chain, cases=[([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), ([5, 5], 4)],
                      random_case=random_chain_case)


def index_pool(n_kv_heads: int, slots: int, head_dim: int) -> torch.Tensor:
    """The pool every gather case uses: each element holds its own flat index, as float32. A [FAIL] line
    shows the pool's shape, which is then the whole case, and a wrong value tells which slot was read
    (slot = value // head_dim % slots)."""
    for name, value in (("n_kv_heads", n_kv_heads), ("slots", slots), ("head_dim", head_dim)):
        check_positive_int(name, value)
    return torch.arange(n_kv_heads * slots * head_dim, dtype=torch.float32).reshape(n_kv_heads, slots, head_dim)


def random_gather_case(rng: Rng) -> tuple[torch.Tensor, list[int], int, int]:
    gen = torch.Generator().manual_seed(rng.below(2**31))
    block_size, num_blocks = 2 ** rng.below(4), 2 + rng.below(10)
    n_used = 1 + rng.below(num_blocks)
    table = torch.randperm(num_blocks, generator=gen)[:n_used].tolist()
    length = (n_used - 1) * block_size + 1 + rng.below(block_size)
    return index_pool(1 + rng.below(3), num_blocks * block_size, 4), table, length, block_size


# the notebook's worked example: 2 KV heads, 4 blocks of 2 slots, a sequence of 3 tokens in blocks 2 then 0
EXAMPLE_POOL = index_pool(2, 8, 2)
PAGED_GATHER = Exercise("gather", gather, cases=[(EXAMPLE_POOL, [2, 0], 3, 2)], random_case=random_gather_case)
