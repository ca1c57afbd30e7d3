"""The block manager: KV memory as a pool of fixed-size blocks, a block table per sequence, reference counts,
copy-on-write and prefix caching (notebook 05, section 2; PagedKVCache stores keys and values in its blocks,
and the serving lab schedules with it). The model is vLLM's (Kwon et al., SOSP 2023) block manager.

    pool of num_blocks blocks, block_size token slots each
    seq "a"  tokens t0 .. t40    block table [5, 2, 7]     slots: position p -> block table[p // 16],
    seq "b"  tokens t0 .. t20    block table [5, 3]               offset p % 16          (block_size 16)
                                 block 5 holds t0..t15 for both: ref_count(5) == 2

Every block is in exactly one state:

    free     no reference, no valid contents            (the free list, first in first out)
    in use   referenced by ref_count(b) >= 1 block tables
    cached   no reference, but its full contents are still findable by hash (prefix caching); taken back by
             a prefix hit, or evicted least recently used when the free list is empty

Rules: `can_allocate` before `allocate` and `can_append` before `append` (a refused call raises
OutOfBlocksError and changes nothing); `fork` shares every block of the parent, and the first append to a
shared, partly filled last block copies it (copy-on-write: the copy to perform is queued for the cache,
`take_copies`). With prefix caching, `allocate` reuses the longest cached prefix of full blocks, verified
token by token. A prompt cached entirely still recomputes its last token (its logits are needed), so at most
the full blocks before the last token are served from the cache.

Computed tokens. Reserving a slot (allocate, append) is not computing it: the manager owns, per sequence, how
many leading tokens have their keys and values stored (`num_computed`: the cache hits at allocation, then
whatever the caller reports with `mark_computed(seq_id, n)` after the forward that wrote them; PagedKVCache
does it in `advance`). A full block enters the prefix cache's hash map only once all its tokens are computed
(vLLM caches only computed blocks), so a sequence freed before its forward (a failed or aborted request)
leaves nothing findable, and a second request with the same prompt arriving before the first one's prefill
gets a miss, not uncomputed slots.

For a scheduler (the serving lab):

- `num_free_blocks` counts ONLY blocks with no reference and no cached contents. Evictable cached blocks are
  also available to an allocation (vLLM counts them free): `num_available_blocks` = free + cached. Decide
  admission with `can_allocate(token_ids)` (it counts free, evictable and prefix hits), never by comparing
  with num_free_blocks.
- A prompt that needs more blocks than the whole pool can never be allocated: `fits_in_pool(token_ids)` is
  False and `allocate` raises LargerThanPoolError (a ValueError), not OutOfBlocksError, so refuse it at
  admission instead of waiting for blocks. A sequence that already holds every block of the pool cannot
  append either (can_append stays False): preempting others does not help it; cap its length at admission.
- Swapping or recomputing a preempted sequence is the caller's (swap.py costs both); after a recompute the
  caller allocates again and marks the tokens computed as the forwards write them.

Images (lab 07): `allocate(seq_id, token_ids, mm=[(offset, length, image hash), ...])` names the prompt's image
placeholder ranges; each block's hash then includes the images overlapping it (prefix.mm_extra_keys, vLLM's
extra keys), so identical placeholders with different images never share a block and the same image hits.
`hash_mm=False` builds the naive cache that hashes tokens only (notebook 07 shows it answering from the wrong
image).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Hashable, Sequence

from .._checks import check_bool, check_int, check_positive_int, fail, is_int
from .prefix import CachedPool, block_hash, check_spans, mm_extra_keys


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free (or evictable) blocks than the call needs now; the manager is unchanged. Freeing
    or preempting other sequences can make the call succeed later."""


class LargerThanPoolError(ValueError):
    """The prompt needs more blocks than the whole pool holds: no amount of freeing makes it fit (refuse the
    request at admission; fits_in_pool says so beforehand). The manager is unchanged."""


def check_block_size(block_size) -> int:
    """A positive power of two (TypeError for a non-int, ValueError for another int)."""
    if not is_int(block_size):
        fail("block_size", block_size, "a positive power of two (tokens per block)", TypeError)
    if block_size < 1 or block_size & (block_size - 1):
        fail("block_size", block_size, "a positive power of two (tokens per block)")
    return int(block_size)


def plural(n: int, noun: str) -> str:
    """'1 token', '2 tokens' (for messages)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def blocks_needed(n_tokens: int, block_size: int) -> int:
    """Blocks that hold `n_tokens` tokens: ceil(n_tokens / block_size) (notebook 05)."""
    check_positive_int("n_tokens", n_tokens, allow_zero=True)
    check_block_size(block_size)
    return -(-n_tokens // block_size)


class BlockManager:
    """Blocks of `block_size` token slots (a power of two) in a pool of `num_blocks`; see the module docstring.
    vocab_size: token ids must be in [0, vocab_size) (None: any id below 2**32 until a PagedKVCache ties it to
    its model's vocabulary; `vocab_size_given` says which). Sequence ids are ints or
    strings. Counters: `prompt_tokens` (tokens of every allocated prompt) and `cached_tokens` (those served
    from the prefix cache), updated only by allocations that succeed. hash_mm: include the images in the
    block hashes (False: the naive cache, see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 vocab_size: int | None = None, hash_mm: bool = True):
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_block_size(block_size)
        self.enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        self.hash_mm = check_bool("hash_mm", hash_mm)
        self.vocab_size_given = vocab_size is not None
        self.vocab_size = 2**32 if vocab_size is None else check_positive_int("vocab_size", vocab_size)
        self._ref = [0] * self.num_blocks
        self._free: deque[int] = deque(range(self.num_blocks))
        self._pool = CachedPool()
        self._hash: dict[int, int] = {}                            # registered block -> its hash
        self._content: dict[int, tuple[int | None, tuple]] = {}    # registered block -> (parent hash, tokens)
        self._extra: dict[int, tuple] = {}                         # registered block -> its image keys, if any
        self._mm: dict[Hashable, tuple] = {}                       # seq -> its images (offset, length, hash)
        self._tables: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, list[int]] = {}
        self._hashes: dict[Hashable, list[int]] = {}               # the hash chain of its computed full blocks
        self._computed: dict[Hashable, int] = {}                   # leading tokens whose K/V are stored
        self._copies: list[tuple[int, int]] = []
        self.prompt_tokens = 0
        self.cached_tokens = 0

    # --- checks -------------------------------------------------------------------------------------------

    def _seq(self, name: str, seq_id, exists: bool = True) -> Hashable:
        if not (is_int(seq_id) or isinstance(seq_id, str)):
            fail(name, seq_id, "a sequence id (an int or a str)", TypeError)
        if exists and seq_id not in self._tables:
            fail(name, seq_id, f"a sequence this manager holds ({len(self._tables)} sequences)")
        if not exists and seq_id in self._tables:
            fail(name, seq_id, "a new sequence id (this one is already allocated)")
        return seq_id

    def _token(self, name: str, token) -> int:
        if not is_int(token):
            fail(name, token, f"a token id (an int in [0, {self.vocab_size}))", TypeError)
        if not 0 <= token < self.vocab_size:
            fail(name, token, f"a token id in [0, {self.vocab_size})")
        return int(token)

    def _prompt(self, token_ids) -> list[int]:
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
            fail("token_ids", token_ids, "a non-empty list of token ids", TypeError)
        if not token_ids:
            fail("token_ids", token_ids, "a non-empty list of token ids")
        return [self._token("token_ids[i]", t) for t in token_ids]

    # --- the pool -----------------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no reference AND no cached contents. NOT what an allocation may take: evictable cached
        blocks are available too (num_available_blocks; vLLM counts them as free). Admit with can_allocate."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks with no reference whose contents the prefix cache keeps (evictable)."""
        return len(self._pool)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one block table."""
        return self.num_blocks - len(self._free) - len(self._pool)

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation may take: free ones, then cached ones by eviction."""
        return len(self._free) + len(self._pool)

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold block `block_id`."""
        if not is_int(block_id):
            fail("block_id", block_id, f"an int in [0, {self.num_blocks})", TypeError)
        if not 0 <= block_id < self.num_blocks:
            fail("block_id", block_id, f"an int in [0, {self.num_blocks})")
        return self._ref[block_id]

    def _take(self) -> int:
        """A block for new contents: the oldest free one, else the least recently used cached one."""
        if self._free:
            b = self._free.popleft()
        else:
            b = self._pool.evict(self._hash)
            del self._hash[b], self._content[b]
            self._extra.pop(b, None)
        self._ref[b] = 1
        return b

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference from each block, last block first (so a prefix's end is evicted before its start)."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._hash:
                    self._pool.release([b])
                else:
                    self._free.append(b)

    def _seal(self, seq_id, block: int, index: int) -> None:
        """Block number `index` of seq_id is full and computed: extend its hash chain and register the block."""
        tokens = tuple(self._tokens[seq_id][index * self.block_size:(index + 1) * self.block_size])
        chain = self._hashes[seq_id]
        parent = chain[-1] if chain else None
        extra = self._extra_keys(self._mm[seq_id], index)
        h = block_hash(parent, tokens, extra) if extra else block_hash(parent, tokens)
        chain.append(h)
        if self._pool.register(h, block):
            self._hash[block], self._content[block] = h, (parent, tokens)
            if extra:
                self._extra[block] = extra

    # --- allocation ---------------------------------------------------------------------------------------

    def _extra_keys(self, spans: tuple, index: int) -> tuple:
        """The image keys of block number `index` of a sequence with images `spans` (none when hash_mm is off)."""
        return mm_extra_keys(spans, index * self.block_size, (index + 1) * self.block_size) \
            if spans and self.hash_mm else ()

    def _plan(self, tokens: list[int], spans: tuple = ()) -> tuple[list[int], int]:
        """(cached blocks a prompt would reuse, new blocks it needs beyond them); changes nothing."""
        bs, hits = self.block_size, []
        if self.enable_prefix_caching:
            parent = None
            for i in range((len(tokens) - 1) // bs):  # the last token is always computed again
                block_tokens, extra = tuple(tokens[i * bs:(i + 1) * bs]), self._extra_keys(spans, i)
                h = block_hash(parent, block_tokens, extra) if extra else block_hash(parent, block_tokens)
                b = self._pool.by_hash.get(h)
                if b is None or self._content[b] != (parent, block_tokens) \
                        or self._extra.get(b, ()) != extra:  # a collision is a miss
                    break
                hits.append(b)
                parent = h
        return hits, blocks_needed(len(tokens), bs) - len(hits)

    def _fits(self, hits: list[int], new: int) -> bool:
        reclaimed = sum(1 for b in hits if self._ref[b] == 0)  # hits taken out of the evictable pool
        return new <= self.num_available_blocks - reclaimed

    def fits_in_pool(self, token_ids: Sequence[int]) -> bool:
        """Could `token_ids` ever be allocated, with the whole pool free? False: refuse it at admission."""
        return blocks_needed(len(self._prompt(token_ids)), self.block_size) <= self.num_blocks

    def can_allocate(self, token_ids: Sequence[int], mm: Sequence[tuple[int, int, str]] = ()) -> bool:
        """Would allocate(..., token_ids, mm) find enough blocks now, counting free blocks, evictable cached
        blocks and prefix hits? The admission test a scheduler should use (see the module docstring)."""
        tokens = self._prompt(token_ids)
        return self._fits(*self._plan(tokens, check_spans(mm, len(tokens))))

    def allocate(self, seq_id, token_ids: Sequence[int], mm: Sequence[tuple[int, int, str]] = ()) -> int:
        """Give new sequence `seq_id` blocks for its prompt `token_ids` with images `mm` ((offset, length, image
        hash) placeholder ranges, see the module docstring); returns how many leading tokens the prefix cache
        already holds (a multiple of block_size, always < len(token_ids))."""
        seq_id = self._seq("seq_id", seq_id, exists=False)
        tokens = self._prompt(token_ids)
        spans = check_spans(mm, len(tokens))
        hits, new = self._plan(tokens, spans)
        if blocks_needed(len(tokens), self.block_size) > self.num_blocks:
            raise LargerThanPoolError(f"a prompt of {plural(len(tokens), 'token')} is larger than the pool: it needs "
                                      f"{plural(blocks_needed(len(tokens), self.block_size), 'block')} of "
                                      f"{self.block_size}, the pool has {self.num_blocks} (refuse it: fits_in_pool)")
        if not self._fits(hits, new):
            raise OutOfBlocksError(f"a prompt of {plural(len(tokens), 'token')} needs {plural(new, 'new block')} "
                                   f"of {self.block_size}, only {self.num_available_blocks} "
                                   f"{'is' if self.num_available_blocks == 1 else 'are'} free or evictable: "
                                   f"check can_allocate")
        for b in hits:
            if self._ref[b] == 0:
                self._pool.take(b)
            self._ref[b] += 1
        table = hits + [self._take() for _ in range(new)]
        self._tables[seq_id], self._tokens[seq_id], self._mm[seq_id] = table, tokens, spans
        self._hashes[seq_id] = [self._hash[b] for b in hits]
        cached = len(hits) * self.block_size
        self._computed[seq_id] = cached  # the rest is computed by the caller's forward: mark_computed
        self.prompt_tokens += len(tokens)
        self.cached_tokens += cached
        return cached

    def _append_needs_block(self, seq_id) -> bool:
        n, table = len(self._tokens[seq_id]), self._tables[seq_id]
        return n % self.block_size == 0 or self._ref[table[-1]] > 1

    def can_append(self, seq_id) -> bool:
        """Would append(seq_id, ...) find a block if it needs one (a full last block, or a shared one to copy)?"""
        self._seq("seq_id", seq_id)
        return not self._append_needs_block(seq_id) or self.num_available_blocks > 0

    def append(self, seq_id, token_id: int) -> None:
        """Reserve the slot of one more token of `seq_id`. Takes a new block when the last one is full, and copies
        a shared, partly filled last block first (the copy is queued: take_copies)."""
        tokens = self._tokens.get(seq_id) if is_int(seq_id) or isinstance(seq_id, str) else None
        if tokens is None:
            self._seq("seq_id", seq_id)
        if type(token_id) is not int or not 0 <= token_id < self.vocab_size:
            token_id = self._token("token_id", token_id)
        table = self._tables[seq_id]
        n = len(tokens)
        if n % self.block_size == 0:
            if not self._free and not self._pool.order:
                raise OutOfBlocksError(f"seq_id {seq_id!r} needs a new block and the pool of {self.num_blocks} "
                                       f"has none free or evictable: check can_append")
            table.append(self._take())
        elif self._ref[table[-1]] > 1:
            if not self._free and not self._pool.order:
                raise OutOfBlocksError(f"seq_id {seq_id!r} must copy its shared last block and the pool of "
                                       f"{self.num_blocks} has none free or evictable: check can_append")
            src = table[-1]
            self._ref[src] -= 1
            table[-1] = self._take()
            self._copies.append((src, table[-1]))
        tokens.append(token_id)

    def num_computed(self, seq_id) -> int:
        """Leading tokens of `seq_id` whose keys and values are stored (cache hits + what mark_computed reported)."""
        return self._computed[self._seq("seq_id", seq_id)]

    def mark_computed(self, seq_id, num_tokens: int) -> None:
        """The forward wrote the keys and values of `seq_id`'s first `num_tokens` tokens (PagedKVCache.advance
        calls it). Full blocks that are now computed enter the prefix cache. A smaller number than before
        (a rewind, to recompute the same tokens) keeps the blocks already registered: their tokens are fixed."""
        tokens = self._tokens.get(seq_id) if type(seq_id) in (int, str) else None  # fast path: once per step
        if tokens is None:
            seq_id = self._seq("seq_id", seq_id)
            tokens = self._tokens[seq_id]
        if type(num_tokens) is not int or not 0 <= num_tokens <= len(tokens):
            num_tokens = check_int("num_tokens", num_tokens, 0, len(tokens))
        self._computed[seq_id] = num_tokens
        if self.enable_prefix_caching:
            chain = self._hashes[seq_id]
            if len(chain) < num_tokens // self.block_size:
                table = self._tables[seq_id]
                for i in range(len(chain), num_tokens // self.block_size):
                    self._seal(seq_id, table[i], i)

    def fork(self, parent_id, child_id) -> None:
        """New sequence `child_id` shares every block (and token) of `parent_id` (parallel sampling, beams)."""
        parent_id = self._seq("parent_id", parent_id)
        child_id = self._seq("child_id", child_id, exists=False)
        table = list(self._tables[parent_id])
        for b in table:
            self._ref[b] += 1
        self._tables[child_id], self._tokens[child_id] = table, list(self._tokens[parent_id])
        self._mm[child_id] = self._mm[parent_id]
        self._hashes[child_id] = list(self._hashes[parent_id])
        self._computed[child_id] = self._computed[parent_id]

    def free(self, seq_id) -> None:
        """Forget `seq_id`: each of its blocks loses a reference; unreferenced ones become cached or free."""
        seq_id = self._seq("seq_id", seq_id)
        self._release(self._tables.pop(seq_id))
        del self._tokens[seq_id], self._hashes[seq_id], self._computed[seq_id], self._mm[seq_id]
        self._copies = [(src, dst) for src, dst in self._copies if self._ref[dst]]  # no copy into a freed block

    def shuffle_free(self, seed: int = 0) -> None:
        """Put the free list in a seeded random order, so that new sequences get scattered, out-of-order blocks
        (notebook 05 and the tests show that attention does not care)."""
        check_int("seed", seed, 0)
        order = list(self._free)
        random.Random(seed).shuffle(order)
        self._free = deque(order)

    # --- what the cache and the notebook read -------------------------------------------------------------

    def block_table(self, seq_id) -> list[int]:
        """The physical blocks of `seq_id`, in position order (a copy)."""
        return list(self._tables[self._seq("seq_id", seq_id)])

    def num_tokens(self, seq_id) -> int:
        """Token slots reserved for `seq_id` (prompt + appended)."""
        return len(self._tokens[self._seq("seq_id", seq_id)])

    def tokens(self, seq_id) -> list[int]:
        return list(self._tokens[self._seq("seq_id", seq_id)])

    @property
    def seq_ids(self) -> list:
        return list(self._tables)

    def cached_blocks(self) -> list[int]:
        """Evictable cached blocks, the next one to be evicted first."""
        return list(self._pool.order)

    def hash_map(self) -> dict[int, tuple[int, int | None, tuple]]:
        """hash -> (block, parent hash, stored tokens) for every registered block (a copy, for tests and plots)."""
        return {h: (b, *self._content[b]) for h, b in self._pool.by_hash.items()}

    def block_extra_keys(self, block_id: int) -> tuple:
        """The image keys (image hash, offset) that registered block `block_id`'s hash includes (() if none)."""
        self.ref_count(block_id)  # checks block_id
        return self._extra.get(block_id, ())

    def free_blocks(self) -> list[int]:
        """The free list, the next block handed out first (a copy)."""
        return list(self._free)

    def pending_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies queued and not yet taken (a copy; take_copies consumes them)."""
        return list(self._copies)

    def seq_hashes(self, seq_id) -> list[int]:
        """The hash chain of `seq_id`'s computed full blocks (a copy)."""
        return list(self._hashes[self._seq("seq_id", seq_id)])

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies (source block, destination block) queued since the last call, in order."""
        out, self._copies = self._copies, []
        return out
