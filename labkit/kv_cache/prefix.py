"""Prefix caching: the hash chain over full blocks, and the pool of cached blocks kept after their sequences
end, evicted least recently used (notebook 05, sections 2 and 5).

A full block of `block_size` token ids is named by the hash of its parent's hash and its own ids, so a
block's hash stands for the whole prefix up to its end (vLLM's automatic prefix caching, Kwon et al. 2023):

    tokens   | t0 .. t15 | t16 .. t31 | t32 .. t40 |      block_size 16
    hashes   h0 = H(root, t0..t15)   h1 = H(h0, t16..t31)   (the last block is not full: no hash)

Two prompts share block i only if they agree on every token up to the end of block i. A prompt shorter than
one block has no full block, hence nothing to share. Hashes are the first 8 bytes of SHA-256 (stable across
machines and Python runs); a hit is still checked against the stored tokens and parent hash, so a collision
costs a miss, never wrong keys and values.

CachedPool holds the blocks nobody references any more but whose contents are still valid, in eviction
order: the least recently freed first, and among the blocks of one sequence freed together, the end of its
prefix before its start (a later block is useless without the earlier ones).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from typing import Iterable, Sequence

from .._checks import check_positive_int, fail, is_int

ROOT = b"labkit.kv_cache root"  # what the first block of a sequence is chained to


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The 64-bit hash of a full block: SHA-256 of (parent's hash, or ROOT for the first block) followed by the
    token ids as little-endian uint32, first 8 bytes read little-endian."""
    if parent is not None and not (is_int(parent) and 0 <= parent < 2**64):
        fail("parent", parent, "None or a 64-bit hash (an int in [0, 2**64))", TypeError if not is_int(parent)
             else ValueError)
    if isinstance(tokens, (str, bytes)) or not all(is_int(t) and 0 <= t < 2**32 for t in tokens):
        fail("tokens", tokens, "a sequence of token ids (ints in [0, 2**32))", TypeError)
    head = ROOT if parent is None else parent.to_bytes(8, "little")
    digest = hashlib.sha256(head + struct.pack(f"<{len(tokens)}I", *tokens)).digest()
    return int.from_bytes(digest[:8], "little")


def hash_chain(tokens: Sequence[int], block_size: int, hash_fn=block_hash) -> list[int]:
    """The hashes of every *full* block of `tokens` (len(tokens) // block_size of them), each chained to the one
    before it. Notebook 05's exercise HASH_CHAIN."""
    check_positive_int("block_size", block_size)
    out: list[int] = []
    parent = None
    for i in range(len(tokens) // block_size):
        parent = hash_fn(parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


class CachedPool:
    """Blocks with no reference whose contents stay valid, with the hash map that finds them again.

        by_hash:  hash -> block id        (only blocks whose stored tokens produced that hash)
        order:    evictable blocks, least recently freed first

    A block is in `by_hash` while its contents are valid (referenced or not); it is in `order` only while no
    sequence references it. The BlockManager owns reference counts and calls this class to keep both in step.
    """

    def __init__(self):
        self.by_hash: dict[int, int] = {}
        self.order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, block: int) -> bool:
        return block in self.order

    def register(self, h: int, block: int) -> bool:
        """Make `block` findable by hash `h`; False (and nothing changes) when another block holds that hash."""
        if h in self.by_hash:
            return False
        self.by_hash[h] = block
        return True

    def release(self, blocks: Iterable[int]) -> None:
        """These blocks lost their last reference: they become evictable, the first given evicted first."""
        for b in blocks:
            self.order[b] = None

    def take(self, block: int) -> None:
        """A hit on an evictable block: it is referenced again and leaves the eviction order."""
        del self.order[block]

    def evict(self, hash_of: dict[int, int]) -> int:
        """Take the least recently freed block and drop its hash (`hash_of`: block -> its hash) from the map."""
        block, _ = self.order.popitem(last=False)
        del self.by_hash[hash_of[block]]
        return block
