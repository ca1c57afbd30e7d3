"""BlockManager: a stateful hypothesis machine over random interleavings of allocate, append, compute (the
forward that writes K/V, reported with mark_computed), fork and free, checked after every step against the
manager's invariants (reference counts equal the tables holding a block; free, used and cached blocks add up;
free and cached blocks are unreferenced) and against a shadow store that writes each token id into its slot
only when it is computed (so the hash map must point only at computed blocks holding its tokens, and reading a
sequence back through its block table must give its computed tokens: wrong hits, uncomputed blocks cached,
missed copies-on-write and evicted blocks in use all show); regressions; bad input. Images (lab 07): the machine's
prompts may hold an image (a placeholder range with an image hash A or B over the same placeholder token), the
shadow writes (token, image) into each slot, so a block shared between two different images shows."""

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from labkit.kv_cache import BlockManager, LargerThanPoolError, blocks_needed, block_hash
from labkit.kv_cache.blocks import OutOfBlocksError
from labkit.kv_cache.sharing import prefill
from tests.refusals import assert_refused

BASES = [[1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 3, 3], [2, 2, 1, 1, 0, 0, 3, 3, 2, 2, 1, 1], [0] * 14]


def snapshot(bm: BlockManager) -> dict:
    """Every piece of state a refused call could change (free-list order, copy queue, hash chains included)."""
    seqs = bm.seq_ids
    return {"tables": {s: bm.block_table(s) for s in seqs}, "tokens": {s: bm.tokens(s) for s in seqs},
            "computed": {s: bm.num_computed(s) for s in seqs}, "chains": {s: bm.seq_hashes(s) for s in seqs},
            "refs": [bm.ref_count(b) for b in range(bm.num_blocks)], "free": bm.free_blocks(),
            "cached": bm.cached_blocks(), "hashes": bm.hash_map(), "copies": bm.pending_copies(),
            "counters": (bm.prompt_tokens, bm.cached_tokens), "vocab": bm.vocab_size}


class Shadow:
    """Physical slots holding token ids, written the way a paged cache writes keys and values: by the forward."""

    def __init__(self, bm: BlockManager, label=lambda seq, p: None):
        self.bm, self.slots, self.label = bm, {}, label  # label(seq, p): the image at position p of seq, or None

    def apply_copies(self):
        bs = self.bm.block_size
        for src, dst in self.bm.take_copies():
            for o in range(bs):
                self.slots[dst * bs + o] = self.slots.get(src * bs + o)

    def compute(self, seq, upto):
        """The forward of positions num_computed(seq) .. upto - 1, then mark_computed (as PagedKVCache does)."""
        self.apply_copies()
        bm = self.bm
        bs, table, tokens = bm.block_size, bm.block_table(seq), bm.tokens(seq)
        for p in range(bm.num_computed(seq), upto):
            block = table[p // bs]
            sharers = [s for s in bm.seq_ids
                       if len(bm.block_table(s)) > p // bs and bm.block_table(s)[p // bs] == block]
            assert len(sharers) == bm.ref_count(block)
            assert all(bm.tokens(s)[p] == tokens[p] for s in sharers if bm.num_tokens(s) > p), \
                "a write into a block shared with a sequence holding another token there"
            self.slots[block * bs + p % bs] = (tokens[p], self.label(seq, p))
        bm.mark_computed(seq, upto)

    def read(self, seq, n):
        """What the next forward would read: queued copies are carried out first (nothing writes in between)."""
        source: dict[int, int] = {}
        for src, dst in self.bm.pending_copies():
            source[dst] = source.get(src, src)
        bs, table = self.bm.block_size, [source.get(b, b) for b in self.bm.block_table(seq)]
        return [self.slots.get(table[p // bs] * bs + p % bs) for p in range(n)]


class BlockMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = None

    @precondition(lambda self: self.bm is None)
    @rule(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans())
    def start(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, caching, vocab_size=4)
        self.shadow, self.next_id, self.images = Shadow(self.bm, self.image_at), 0, {}

    def image_at(self, seq, p):
        return next((h for o, n, h in self.images.get(seq, ()) if o <= p < o + n), None)

    def refused(self, call, error=OutOfBlocksError):
        before = snapshot(self.bm)
        with pytest.raises(error):
            call()
        assert snapshot(self.bm) == before, "a refused call changed the manager"

    @precondition(lambda self: self.bm is not None)
    @rule(base=st.sampled_from(range(len(BASES))), length=st.integers(1, 14), tail=st.lists(st.integers(0, 3),
                                                                                             max_size=3),
          image=st.none() | st.tuples(st.integers(0, 13), st.integers(1, 6), st.sampled_from("AB")))
    def allocate(self, base, length, tail, image):
        prompt = BASES[base][:length] + tail
        seq, self.next_id = self.next_id, self.next_id + 1
        mm = []
        if image is not None and image[0] < len(prompt):  # an image over the same placeholder token (3)
            o, n = image[0], min(image[1], len(prompt) - image[0])
            prompt[o:o + n] = [3] * n
            mm = [(o, n, image[2])]
        if mm:  # the lab 07 call form; without an image, the lab 05 one below
            fits = blocks_needed(len(prompt), self.bm.block_size) <= self.bm.num_blocks
            assert self.bm.fits_in_pool(prompt) == fits
            if self.bm.can_allocate(prompt, mm):
                self.images[seq] = mm
                cached = self.bm.allocate(seq, prompt, mm)
                assert cached % self.bm.block_size == 0 and 0 <= cached < len(prompt)
            else:
                self.refused(lambda: self.bm.allocate(seq, prompt, mm),
                             OutOfBlocksError if fits else LargerThanPoolError)
            return
        fits = blocks_needed(len(prompt), self.bm.block_size) <= self.bm.num_blocks
        assert self.bm.fits_in_pool(prompt) == fits
        if self.bm.can_allocate(prompt):
            cached = self.bm.allocate(seq, prompt)
            assert cached % self.bm.block_size == 0 and 0 <= cached < len(prompt)
            assert self.bm.num_computed(seq) == cached
            assert len(self.bm.block_table(seq)) == blocks_needed(len(prompt), self.bm.block_size)
            if not self.bm.enable_prefix_caching:
                assert cached == 0
        else:
            self.refused(lambda: self.bm.allocate(seq, prompt), OutOfBlocksError if fits else LargerThanPoolError)

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def compute(self, data):
        seq = data.draw(st.sampled_from(self.bm.seq_ids))
        done, n = self.bm.num_computed(seq), self.bm.num_tokens(seq)
        self.shadow.compute(seq, data.draw(st.integers(done, n)))

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        seq = data.draw(st.sampled_from(self.bm.seq_ids))
        if self.bm.can_append(seq):
            self.bm.append(seq, token)
        else:
            self.refused(lambda: self.bm.append(seq, token))

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.bm.seq_ids))
        child, self.next_id = self.next_id, self.next_id + 1
        self.bm.fork(parent, child)
        self.images[child] = self.images.get(parent, [])
        assert self.bm.block_table(child) == self.bm.block_table(parent)
        assert self.bm.num_computed(child) == self.bm.num_computed(parent)

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def free(self, data):
        self.bm.free(data.draw(st.sampled_from(self.bm.seq_ids)))
        if not self.bm.seq_ids:  # no leak
            assert self.bm.num_used_blocks == 0 and all(self.bm.ref_count(b) == 0 for b in range(self.bm.num_blocks))

    @invariant()
    def consistent(self):
        bm = self.bm
        if bm is None:
            return
        tables = [bm.block_table(s) for s in bm.seq_ids]
        holders = [sum(t.count(b) for t in tables) for b in range(bm.num_blocks)]
        assert [bm.ref_count(b) for b in range(bm.num_blocks)] == holders
        used = sum(1 for h in holders if h)
        assert bm.num_free_blocks + used + bm.num_cached_blocks == bm.num_blocks
        assert bm.num_used_blocks == used
        assert all(holders[b] == 0 for b in bm.free_blocks())  # no block is both free and referenced
        assert all(holders[b] == 0 for b in bm.cached_blocks())  # cached blocks are unreferenced
        assert len(set(bm.cached_blocks())) == bm.num_cached_blocks
        assert not set(bm.free_blocks()) & {b for b, _, _ in bm.hash_map().values()}
        for h, (b, parent, tokens) in bm.hash_map().items():  # only computed blocks holding their tokens
            assert block_hash(parent, list(tokens), bm.block_extra_keys(b)) == h
            slots = [self.shadow.slots.get(b * bm.block_size + o) for o in range(bm.block_size)]
            assert [s and s[0] for s in slots] == list(tokens)
        assert set(bm.cached_blocks()) <= {b for b, _, _ in bm.hash_map().values()}
        for s in bm.seq_ids:  # every sequence reads back its own computed tokens through its table
            n = bm.num_computed(s)
            assert self.shadow.read(s, n) == [(t, self.image_at(s, p)) for p, t in enumerate(bm.tokens(s)[:n])]
            assert len(bm.seq_hashes(s)) <= n // bm.block_size or not bm.enable_prefix_caching


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


# --- regressions: bugs found in real block managers --------------------------------------------------------

def test_a_fully_cached_prompt_of_exactly_k_blocks_still_computes_its_last_token():
    bm = BlockManager(8, 4)
    prompt = list(range(12))  # exactly 3 blocks
    prefill(bm, "a", prompt)
    bm.free("a")
    assert bm.allocate("b", prompt) == 8  # two blocks from the cache; the third is computed again
    assert bm.cached_tokens == 8 and len(bm.block_table("b")) == 3
    assert bm.ref_count(bm.block_table("b")[2]) == 1


def test_reallocating_a_cached_block_that_sits_in_the_free_pool_takes_it_out_of_eviction():
    bm = BlockManager(4, 4)
    prefill(bm, "a", list(range(9)))  # blocks 0, 1 full and registered, block 2 partial
    bm.free("a")
    assert bm.cached_blocks() == [1, 0]
    assert bm.allocate("b", list(range(9))) == 8
    shared = bm.block_table("b")[:2]
    assert bm.cached_blocks() == [] and [bm.ref_count(b) for b in shared] == [1, 1]
    assert bm.can_allocate([3, 3, 3, 3, 3]) is False  # b's tail took one of the 2 free blocks: 1 left
    prefill(bm, "c", [3])
    assert not set(bm.block_table("c")) & set(bm.block_table("b"))


def test_a_prefix_hit_is_not_counted_before_the_allocation_it_depends_on():
    bm = BlockManager(5, 4)
    prefill(bm, "a", list(range(9)))  # blocks 0, 1, 2
    prefill(bm, "z", [1])  # block 3 stays in use
    bm.free("a")  # blocks 1, 0 cached, 4 and 2 free: 4 available, 2 of them the hits
    longer = list(range(8)) + [9] * 9  # hits 2 blocks, needs 3 new: 3 > 4 - 2
    assert bm.fits_in_pool(longer) and bm.can_allocate(longer) is False
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError, match="check can_allocate"):
        bm.allocate("b", longer)
    assert snapshot(bm) == before and bm.cached_tokens == 0 and bm.prompt_tokens == 10


def test_hits_taken_from_the_pool_are_not_also_counted_as_evictable():
    bm = BlockManager(3, 4)
    prefill(bm, "a", list(range(9)))
    bm.free("a")  # 1 free + 2 cached
    fits = list(range(8)) + [5]  # 2 hits (both cached) + 1 new = the whole pool
    assert bm.can_allocate(fits) and bm.allocate("b", fits) == 8
    assert bm.num_available_blocks == 0


def test_eviction_takes_the_end_of_a_prefix_before_its_start_and_older_sequences_first():
    bm = BlockManager(6, 2)
    prefill(bm, "old", [0, 1, 2, 3, 0])  # blocks 0, 1 full, 2 partial
    prefill(bm, "new", [3, 3, 2, 2, 1])  # blocks 3, 4 full, 5 partial
    bm.free("old")
    bm.free("new")
    assert bm.cached_blocks() == [1, 0, 4, 3] and bm.num_free_blocks == 2
    prefill(bm, "x", [1, 1, 1, 1, 1, 1, 1])  # 4 blocks: the 2 free, then evicts 1 and 0
    assert bm.cached_blocks() == [4, 3]
    assert not bm.can_allocate([3, 3, 2, 2, 0])  # 2 hits, but no block left for the last token
    bm.free("x")
    assert bm.allocate("y", [3, 3, 2, 2, 0]) == 4  # "new"'s prefix survived


def test_a_shared_prefix_shorter_than_a_block_never_hits():
    bm = BlockManager(8, 16)
    prefill(bm, "a", list(range(15)) + [1])
    assert bm.allocate("b", list(range(15)) + [2]) == 0


def test_a_hash_collision_is_a_miss(monkeypatch):
    from labkit.kv_cache import blocks
    monkeypatch.setattr(blocks, "block_hash", lambda parent, tokens: 7)  # every block collides
    bm = BlockManager(8, 2)
    prefill(bm, "a", [0, 1, 2])
    bm.free("a")
    assert bm.allocate("b", [0, 2, 2]) == 0  # different tokens under the same hash: no hit
    assert bm.allocate("c", [0, 1, 3]) == 2  # the stored tokens match: a hit


def test_fork_then_append_copies_the_shared_partial_block_once():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    prefill(bm, "p", [1, 2, 3, 0, 1, 2])
    bm.fork("p", "c")
    bm.append("c", 3)
    assert bm.take_copies() == [(1, 2)] and bm.block_table("c") == [0, 2]
    bm.append("p", 0)  # the parent's block is its own again: no copy
    assert bm.take_copies() == [] and bm.block_table("p") == [0, 1]


def test_a_copy_into_a_block_freed_before_it_ran_is_dropped():
    bm = BlockManager(8, 4)
    prefill(bm, "p", [1, 2])
    bm.fork("p", "c")
    bm.append("c", 3)
    bm.free("c")
    assert bm.take_copies() == []


def test_the_counters_add_up():
    bm = BlockManager(16, 4)
    for i in range(3):
        prefill(bm, i, list(range(10)))
    assert (bm.prompt_tokens, bm.cached_tokens) == (30, 16)


# --- bad input: a clear error, and the manager unchanged ----------------------------------------------

def refused_unchanged(bm, call, error, name, value, expected):
    before = snapshot(bm)
    assert_refused(call, error, name, value, expected)
    assert snapshot(bm) == before


@pytest.mark.parametrize("size, error", [(0, ValueError), (3, ValueError), (12, ValueError), (-4, ValueError),
                                         (4.0, TypeError), (True, TypeError), ("16", TypeError)])
def test_a_block_size_that_is_not_a_positive_power_of_two_is_refused(size, error):
    assert_refused(lambda: BlockManager(8, size), error, "block_size", size, "a positive power of two")


def test_bad_calls_are_refused_and_change_nothing():
    bm = BlockManager(4, 4, vocab_size=256)
    prefill(bm, "a", [1, 2, 3])
    refused_unchanged(bm, lambda: bm.append("zz", 1), ValueError, "seq_id", "zz", "a sequence this manager holds")
    refused_unchanged(bm, lambda: bm.free(7), ValueError, "seq_id", 7, "a sequence this manager holds")
    refused_unchanged(bm, lambda: bm.block_table(1.5), TypeError, "seq_id", 1.5, "an int or a str")
    refused_unchanged(bm, lambda: bm.fork("a", "a"), ValueError, "child_id", "a", "a new sequence id")
    refused_unchanged(bm, lambda: bm.fork("b", "c"), ValueError, "parent_id", "b", "a sequence this manager")
    refused_unchanged(bm, lambda: bm.allocate("a", [1]), ValueError, "seq_id", "a", "a new sequence id")
    refused_unchanged(bm, lambda: bm.allocate("b", [1, 256]), ValueError, "token_ids[i]", 256, "[0, 256)")
    refused_unchanged(bm, lambda: bm.allocate("b", [1, -1]), ValueError, "token_ids[i]", -1, "[0, 256)")
    refused_unchanged(bm, lambda: bm.allocate("b", []), ValueError, "token_ids", [], "a non-empty list")
    refused_unchanged(bm, lambda: bm.allocate("b", "abc"), TypeError, "token_ids", "abc", "a non-empty list")
    refused_unchanged(bm, lambda: bm.append("a", 300), ValueError, "token_id", 300, "[0, 256)")
    refused_unchanged(bm, lambda: bm.append("a", 2.0), TypeError, "token_id", 2.0, "a token id")
    refused_unchanged(bm, lambda: bm.ref_count(4), ValueError, "block_id", 4, "[0, 4)")
    refused_unchanged(bm, lambda: bm.can_allocate([1.5]), TypeError, "token_ids[i]", 1.5, "a token id")


def test_appending_past_the_pool_is_refused_and_changes_nothing():
    bm = BlockManager(2, 2)
    prefill(bm, "a", [1, 2, 3, 4])
    assert not bm.can_append("a")
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError, match="check can_append"):
        bm.append("a", 5)
    assert snapshot(bm) == before


@given(n=st.integers(0, 10_000), log_bs=st.integers(0, 8))
def test_blocks_needed_is_the_fewest_blocks_that_hold_n_tokens(n, log_bs):
    bs = 2**log_bs
    k = blocks_needed(n, bs)
    assert k * bs >= n and (k - 1) * bs < n or (k == 0 and n == 0)


def test_the_snapshot_sees_each_kind_of_state_a_refused_call_could_change():
    """Each step below changes one kind of state only (order of the free list, the copy queue, computed
    tokens and hash chains, the eviction order): the snapshot must tell every one apart."""
    bm = BlockManager(8, 2)
    seen = [snapshot(bm)]
    bm.shuffle_free(seed=3)  # the same free blocks in another order
    assert bm.num_free_blocks == 8
    seen.append(snapshot(bm))
    bm.allocate("a", [1, 2, 3])
    seen.append(snapshot(bm))
    bm.mark_computed("a", 3)  # K/V written: a's full block enters the hash map and its chain
    seen.append(snapshot(bm))
    bm.fork("a", "b")
    bm.append("b", 1)  # copy-on-write queued
    seen.append(snapshot(bm))
    bm.take_copies()  # only the queue changes
    seen.append(snapshot(bm))
    assert all(x != y for i, x in enumerate(seen) for y in seen[i + 1:])


# --- computed tokens: only blocks whose K/V were written are cached ----------------------------------------

def test_a_prompt_allocated_but_not_computed_is_not_a_prefix_hit():
    bm = BlockManager(16, 4)
    prompt = list(range(10))
    assert bm.allocate("a", prompt) == 0
    assert bm.hash_map() == {} and bm.num_computed("a") == 0
    assert bm.allocate("b", prompt) == 0  # a's prefill has not run: nothing to share yet
    bm.mark_computed("a", 10)
    assert len(bm.hash_map()) == 2 and bm.allocate("c", prompt) == 8


def test_freeing_a_sequence_before_its_forward_caches_nothing():
    bm = BlockManager(4, 4)
    bm.allocate("bad", list(range(9)))
    bm.mark_computed("bad", 5)  # a forward got through block 0 only
    bm.free("bad")
    assert bm.num_cached_blocks == 1 and bm.num_free_blocks == 3
    assert bm.allocate("next", list(range(9))) == 4  # block 0 is served, block 1 (never computed) is not


def test_appended_tokens_enter_the_cache_only_once_computed():
    bm = BlockManager(8, 2)
    prefill(bm, "a", [1, 2, 3])
    bm.append("a", 4)  # block 1 is full, but its last token's K/V are not written
    assert len(bm.seq_hashes("a")) == 1 and len(bm.hash_map()) == 1
    bm.mark_computed("a", 4)
    assert bm.seq_hashes("a") == [block_hash(None, [1, 2]), block_hash(block_hash(None, [1, 2]), [3, 4])]


def test_mark_computed_is_refused_past_the_reserved_tokens():
    bm = BlockManager(8, 2)
    bm.allocate("a", [1, 2, 3])
    refused_unchanged(bm, lambda: bm.mark_computed("a", 4), ValueError, "num_tokens", 4, "in [0, 3]")
    refused_unchanged(bm, lambda: bm.mark_computed("a", -1), ValueError, "num_tokens", -1, "in [0, 3]")
    refused_unchanged(bm, lambda: bm.mark_computed("z", 1), ValueError, "seq_id", "z", "a sequence this manager")


def test_a_prompt_larger_than_the_pool_has_its_own_error():
    bm = BlockManager(2, 4)
    assert bm.fits_in_pool(list(range(8))) and not bm.fits_in_pool(list(range(9)))
    bm.allocate("a", [1])
    assert not bm.can_allocate(list(range(8)))  # too big now: OutOfBlocksError, it fits later
    with pytest.raises(OutOfBlocksError):
        bm.allocate("b", list(range(8)))
    before = snapshot(bm)
    with pytest.raises(LargerThanPoolError, match="larger than the pool"):
        bm.allocate("c", list(range(9)))  # never fits: a ValueError, not a wait
    assert snapshot(bm) == before and issubclass(LargerThanPoolError, ValueError)


# --- images (lab 07): the image hash is part of the block hash ----------------------------------------------

IMAGE_PROMPT = [9] * 8 + [1, 2, 3]  # 8 placeholder tokens of one image, then text


def computed(bm, seq, prompt, mm):
    hits = bm.allocate(seq, prompt, mm)
    bm.mark_computed(seq, len(prompt))
    return hits


@pytest.mark.parametrize("hash_mm, second, hits", [
    (True, "img-A", 8), (True, "img-B", 0),     # the same image hits, another image with the same tokens misses
    (False, "img-B", 8)])                        # the naive cache (tokens only) shares the first image's blocks
def test_blocks_of_one_image_are_shared_only_with_the_same_image(hash_mm, second, hits):
    bm = BlockManager(16, 4, vocab_size=16, hash_mm=hash_mm)
    computed(bm, "a", IMAGE_PROMPT, [(0, 8, "img-A")])
    assert computed(bm, "b", IMAGE_PROMPT, [(0, 8, second)]) == hits
    shared = set(bm.block_table("a")) & set(bm.block_table("b"))
    assert len(shared) == hits // 4


def test_the_image_offset_and_a_text_only_prompt_are_part_of_the_key():
    bm = BlockManager(16, 4, vocab_size=16)
    computed(bm, "a", [9] * 12, [(0, 8, "img-A")])
    assert computed(bm, "b", [9] * 12, [(4, 8, "img-A")]) == 0  # same tokens, image elsewhere: block 0 differs
    assert computed(bm, "c", [9] * 12, []) == 4  # b's block 0 holds no image: plain tokens share it, not a's
    assert bm.block_table("c")[0] == bm.block_table("b")[0] != bm.block_table("a")[0]
    assert computed(bm, "d", [9] * 12, [(0, 8, "img-A")]) == 8
    assert bm.block_extra_keys(bm.block_table("a")[1]) == (("img-A", -4),)  # vLLM's (hash, offset - block start)


def test_a_text_block_after_an_image_still_depends_on_it_through_the_chain():
    bm = BlockManager(16, 2, vocab_size=16)
    computed(bm, "a", [9, 9, 1, 2, 3], [(0, 2, "img-A")])
    assert bm.block_extra_keys(bm.block_table("a")[1]) == ()  # no image in block 1: no extra key ...
    assert computed(bm, "b", [9, 9, 1, 2, 3], [(0, 2, "img-B")]) == 0  # ... but its parent differs: a miss


def test_bad_images_are_refused_and_change_nothing():
    bm = BlockManager(8, 4, vocab_size=16)
    prefill(bm, "a", [1, 2, 3])
    refused_unchanged(bm, lambda: bm.allocate("b", [1, 2], [(1, 2, "x")]), ValueError, "mm[0]", (1, 2, "x"),
                      "inside the prompt's 2 tokens")
    refused_unchanged(bm, lambda: bm.can_allocate([1, 2], [(0, 1, "x"), (0, 1, "y")]), ValueError, "mm",
                      "image 'y' at 0 inside [0, 1)", "do not overlap")
    refused_unchanged(bm, lambda: bm.allocate("b", [1], [[0, 1, "x"]]), TypeError, "mm[0]", [0, 1, "x"], "triple")
    assert_refused(lambda: BlockManager(4, 4, hash_mm=1), TypeError, "hash_mm", 1, "True or False")
