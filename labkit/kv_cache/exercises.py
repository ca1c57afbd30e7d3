"""Notebook 05's exercises, defined once (the notebook's check cells and tests/kv_cache/test_exercises.py use
them):

    HASH_CHAIN     hash_chain(tokens, block_size) -> [hash of each full block], chained with
                   labkit.kv_cache.block_hash(parent, block_tokens)     (section 2)
    NEW_BLOCKS     new_blocks(prompt_len, shared, lookahead, block_size) -> the free blocks a request takes
                   when its first `shared` prompt tokens are in the prefix cache and `lookahead` slots are
                   reserved after the prompt (BlockManager's rule; tests/kv_cache/test_exercises.py checks it
                   against a real BlockManager)                          (section 2)
    PAGED_GATHER   gather(pool, block_table, length, block_size) -> [n_kv_heads, length, head_dim]
                   on index_pool(...) pools, whose values name their slots    (section 3)
"""

from __future__ import annotations

import torch

from .._checks import check_int, check_positive_int
from ..course import Exercise
from ..rng import Rng
from .blocks import blocks_needed
from .paged import gather
from .prefix import hash_chain


def new_blocks(prompt_len: int, shared: int, lookahead: int, block_size: int) -> int:
    """Free blocks a BlockManager takes to admit a prompt of `prompt_len` tokens whose first `shared` tokens
    another prompt computed and left in the prefix cache, and to reserve `lookahead` more slots after it (vLLM's
    lookahead slots: tokens written before the scheduler looks again). Only whole blocks are shared, and never
    the block of the prompt's last token, which is always computed again (its logits are sampled)."""
    check_positive_int("prompt_len", prompt_len)
    check_int("shared", shared, 0, prompt_len, "tokens of the prompt")
    check_positive_int("lookahead", lookahead, allow_zero=True)
    reused = min(shared, prompt_len - 1) // block_size
    return blocks_needed(prompt_len + lookahead, block_size) - reused


def random_new_blocks_case(rng: Rng) -> tuple[int, int, int, int]:
    """A prompt of 1-160 tokens sharing none, part, a block-aligned part or all of itself; 0-8 lookahead slots
    (none half the time); blocks of 1 to 32 slots."""
    block_size, prompt_len = 2 ** rng.below(6), 1 + rng.below(160)
    shared = (0, rng.below(prompt_len + 1), prompt_len // block_size * block_size, prompt_len)[rng.below(4)]
    return prompt_len, shared, rng.below(9) * rng.below(2), block_size


NEW_BLOCKS = Exercise("new_blocks", new_blocks, cases=[
    (40, 0, 0, 16),    # nothing cached
    (40, 32, 0, 16),   # two whole blocks cached
    (40, 20, 0, 16),   # 20 tokens cached: one whole block
    (32, 32, 0, 16),   # the whole prompt cached
    (16, 0, 1, 16),    # one lookahead slot past a full block
    (33, 33, 4, 16)],
    random_case=random_new_blocks_case)


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
