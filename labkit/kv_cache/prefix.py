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

Images (lab 07). A block of image placeholder tokens holds the keys and values of the image's features, not of
the placeholder ids, so two requests with the same placeholders and different images must not share it. The
block's hash then also covers extra keys: (image hash, image offset - block start) for every image whose
placeholder range overlaps the block (`mm_extra_keys`; vLLM's `_gen_mm_extra_hash_keys` and
`generate_block_hash_extra_keys` in vllm/v1/core/kv_cache_utils.py, the offset included as vLLM does so the
same image at another place in identical placeholder blocks differs too). No image: no extra keys, the same
hash as before.

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


def block_hash(parent: int | None, tokens: Sequence[int], extra_keys: Sequence[tuple[str, int]] = ()) -> int:
    """The 64-bit hash of a full block: SHA-256 of (parent's hash, or ROOT for the first block) followed by the
    token ids as little-endian uint32, then for each extra key (image hash, offset) the bytes b"mm", the hash's
    UTF-8 length (uint32) and bytes and the offset (int64), all little-endian; first 8 bytes read
    little-endian. No extra keys: exactly the hash of the tokens (lab 05)."""
    if parent is not None and not (is_int(parent) and 0 <= parent < 2**64):
        fail("parent", parent, "None or a 64-bit hash (an int in [0, 2**64))", TypeError if not is_int(parent)
             else ValueError)
    if isinstance(tokens, (str, bytes)) or not all(is_int(t) and 0 <= t < 2**32 for t in tokens):
        fail("tokens", tokens, "a sequence of token ids (ints in [0, 2**32))", TypeError)
    head = ROOT if parent is None else parent.to_bytes(8, "little")
    tail = b""
    for key in extra_keys:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and is_int(key[1])):
            fail("extra_keys", key, "(image hash: str, offset: int) pairs", TypeError)
        name = key[0].encode()
        tail += b"mm" + struct.pack("<I", len(name)) + name + struct.pack("<q", key[1])
    digest = hashlib.sha256(head + struct.pack(f"<{len(tokens)}I", *tokens) + tail).digest()
    return int.from_bytes(digest[:8], "little")


def check_spans(spans, num_tokens: int) -> tuple[tuple[int, int, str], ...]:
    """`spans`: the images of a prompt of `num_tokens` tokens, as (offset, length, image hash) triples, each
    range inside the prompt, none overlapping another; returned sorted by offset."""
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        fail("mm", spans, "a sequence of (offset, length, image hash) triples", TypeError)
    for i, sp in enumerate(spans):
        if not (isinstance(sp, tuple) and len(sp) == 3 and is_int(sp[0]) and is_int(sp[1])
                and isinstance(sp[2], str) and sp[2]):
            fail(f"mm[{i}]", sp, "an (offset: int, length: int, image hash: non-empty str) triple", TypeError)
        if sp[0] < 0 or sp[1] < 1 or sp[0] + sp[1] > num_tokens:
            fail(f"mm[{i}]", sp, f"a range of at least one token inside the prompt's {num_tokens} tokens")
    out = tuple(sorted((int(o), int(n), h) for o, n, h in spans))
    for (o1, n1, _), (o2, _, h2) in zip(out, out[1:]):
        if o2 < o1 + n1:
            fail("mm", f"image {h2!r} at {o2} inside [{o1}, {o1 + n1})", "ranges that do not overlap")
    return out


def mm_extra_keys(spans: Sequence[tuple[int, int, str]], start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The extra keys of the block of token positions [start, end): (image hash, offset - start) for each span
    (offset, length, hash; sorted, from check_spans) overlapping it (vLLM's _gen_mm_extra_hash_keys)."""
    return tuple((h, o - start) for o, n, h in spans if o < end and o + n > start)


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
