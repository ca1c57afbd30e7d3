"""Lab 05, the KV cache (notebook 05): how big it is, the block manager, paged attention, the waste it removes,
sharing across requests, quantized keys and values, and what to do when blocks run out. The serving lab (06)
schedules with the BlockManager and runs TinyLM on the PagedKVCache.

    size       KV bytes per token for MHA / GQA / MQA / MLA (labkit.specs), growth with context and batch
    blocks     BlockManager (free list, reference counts, block tables, copy-on-write, computed tokens),
               blocks_needed; for the serving lab's scheduler read its docstring: num_free_blocks excludes
               evictable cached blocks (admit with can_allocate), a prompt larger than the whole pool is
               fits_in_pool False / LargerThanPoolError (refuse at admission), full blocks are cached only
               once mark_computed says their K/V were written (PagedKVCache.advance calls it)
    prefix     the hash chain over full blocks and the pool of cached blocks (LRU)
    paged      PagedKVCache (TinyLM's cache contract on the blocks), gather, paged_attention, paged_generate
    waste      request traces; max-length reservation against paging; the block-size sweep
    sharing    a common few-shot prefix, parallel sampling, hash blocks against a token trie
    quantized  INT8 / INT4 / INT2 per token and per channel, FP8; KIVI's finding; quality on TinyLM
    swap       out of blocks: swap to the host against recompute, by block size
    explore    the pool as text, the block-table story and its widget, the plots
    exercises  the notebook's exercises
"""

from . import exercises, explore, prefix, quantized, sharing, size, swap, waste
from .blocks import BlockManager, LargerThanPoolError, blocks_needed, check_block_size
from .paged import PagedKVCache, paged_attention, paged_generate, slots_of
from .prefix import block_hash

__all__ = ["exercises", "explore", "prefix", "quantized", "sharing", "size", "swap", "waste", "BlockManager",
           "LargerThanPoolError", "blocks_needed", "check_block_size", "PagedKVCache", "paged_attention",
           "paged_generate", "slots_of", "block_hash"]
