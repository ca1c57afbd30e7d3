"""BlockManager: a stateful hypothesis machine over random interleavings of allocate, append, fork and free,
checked after every step against the invariants of issue 13 and against a shadow store that writes each
token id into its slot (so reading a sequence back through its block table must give its tokens: wrong hits,
missed copies-on-write and evicted blocks in use all show); regressions; bad input."""
import copy

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from labkit.kv_cache import BlockManager, OutOfBlocksError, blocks_needed, block_hash
from tests.refusals import assert_refused

BASES = [[1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 3, 3], [2, 2, 1, 1, 0, 0, 3, 3, 2, 2, 1, 1], [0] * 14]


def snapshot(bm: BlockManager) -> dict:
    return {"tables": {s: bm.block_table(s) for s in bm.seq_ids}, "tokens": {s: bm.tokens(s) for s in bm.seq_ids},
            "refs": [bm.ref_count(b) for b in range(bm.num_blocks)], "free": bm.num_free_blocks,
            "cached": bm.cached_blocks(), "hashes": bm.hash_map(), "counters": (bm.prompt_tokens, bm.cached_tokens)}


class Shadow:
    """Physical slots holding token ids, written the way a paged cache writes keys and values."""

    def __init__(self, bm: BlockManager):
        self.bm, self.slots = bm, {}

    def apply_copies(self):
        bs = self.bm.block_size
        for src, dst in self.bm.take_copies():
            for o in range(bs):
                self.slots[dst * bs + o] = self.slots.get(src * bs + o)

    def write(self, seq, start):
        self.apply_copies()
        bs, table, tokens = self.bm.block_size, self.bm.block_table(seq), self.bm.tokens(seq)
        for p in range(start, len(tokens)):
            assert self.bm.ref_count(table[p // bs]) == 1, "a write into a shared block"
            self.slots[table[p // bs] * bs + p % bs] = tokens[p]

    def read(self, seq):
        bs, table = self.bm.block_size, self.bm.block_table(seq)
        return [self.slots.get(table[p // bs] * bs + p % bs) for p in range(self.bm.num_tokens(seq))]


class BlockMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = None

    @precondition(lambda self: self.bm is None)
    @rule(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans())
    def start(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, caching, vocab_size=4)
        self.shadow, self.next_id = Shadow(self.bm), 0

    def refused(self, call):
        before = snapshot(self.bm)
        with pytest.raises(OutOfBlocksError):
            call()
        assert snapshot(self.bm) == before, "a refused call changed the manager"

    @precondition(lambda self: self.bm is not None)
    @rule(base=st.sampled_from(range(len(BASES))), length=st.integers(1, 14), tail=st.lists(st.integers(0, 3),
                                                                                             max_size=3))
    def allocate(self, base, length, tail):
        prompt = BASES[base][:length] + tail
        seq, self.next_id = self.next_id, self.next_id + 1
        if self.bm.can_allocate(prompt):
            cached = self.bm.allocate(seq, prompt)
            assert cached % self.bm.block_size == 0 and 0 <= cached < len(prompt)
            assert len(self.bm.block_table(seq)) == blocks_needed(len(prompt), self.bm.block_size)
            if not self.bm.enable_prefix_caching:
                assert cached == 0
            self.shadow.write(seq, cached)
        else:
            self.refused(lambda: self.bm.allocate(seq, prompt))

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        seq = data.draw(st.sampled_from(self.bm.seq_ids))
        if self.bm.can_append(seq):
            n = self.bm.num_tokens(seq)
            self.bm.append(seq, token)
            self.shadow.write(seq, n)
        else:
            self.refused(lambda: self.bm.append(seq, token))

    @precondition(lambda self: self.bm is not None and self.bm.seq_ids)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.bm.seq_ids))
        child, self.next_id = self.next_id, self.next_id + 1
        self.bm.fork(parent, child)
        assert self.bm.block_table(child) == self.bm.block_table(parent)

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
        assert all(holders[b] == 0 for b in bm.cached_blocks())  # cached blocks are unreferenced
        assert len(set(bm.cached_blocks())) == bm.num_cached_blocks
        for h, (b, parent, tokens) in bm.hash_map().items():  # the map points only at matching contents
            assert block_hash(parent, list(tokens)) == h
            assert [self.shadow.slots.get(b * bm.block_size + o) for o in range(bm.block_size)] == list(tokens)
        assert set(bm.cached_blocks()) <= {b for b, _, _ in bm.hash_map().values()}
        for s in bm.seq_ids:  # every sequence reads back its own tokens through its table
            assert self.shadow.read(s) == bm.tokens(s)


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


# --- regressions: bugs real block managers had ------------------------------------------------------------

def test_a_fully_cached_prompt_of_exactly_k_blocks_still_computes_its_last_token():
    bm = BlockManager(8, 4)
    prompt = list(range(12))  # exactly 3 blocks
    bm.allocate("a", prompt)
    bm.free("a")
    assert bm.allocate("b", prompt) == 8  # two blocks from the cache; the third is computed again
    assert bm.cached_tokens == 8 and len(bm.block_table("b")) == 3
    assert bm.ref_count(bm.block_table("b")[2]) == 1


def test_reallocating_a_cached_block_that_sits_in_the_free_pool_takes_it_out_of_eviction():
    bm = BlockManager(4, 4)
    bm.allocate("a", list(range(9)))  # blocks 0, 1 full and registered, block 2 partial
    bm.free("a")
    assert bm.cached_blocks() == [1, 0]
    assert bm.allocate("b", list(range(9))) == 8
    shared = bm.block_table("b")[:2]
    assert bm.cached_blocks() == [] and [bm.ref_count(b) for b in shared] == [1, 1]
    assert bm.can_allocate([3, 3, 3, 3, 3]) is False  # b's tail took one of the 2 free blocks: 1 left
    bm.allocate("c", [3])
    assert not set(bm.block_table("c")) & set(bm.block_table("b"))


def test_a_prefix_hit_is_not_counted_before_the_allocation_it_depends_on():
    bm = BlockManager(3, 4)
    bm.allocate("a", list(range(9)))  # 3 blocks: the whole pool
    bm.free("a")  # blocks 1, 0 cached, 2 free
    longer = list(range(8)) + [9] * 9  # hits 2 blocks, needs 3 new: 5 > 3 available (2 of them are the hits)
    assert bm.can_allocate(longer) is False
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError, match="check can_allocate"):
        bm.allocate("b", longer)
    assert snapshot(bm) == before and bm.cached_tokens == 0 and bm.prompt_tokens == 9


def test_hits_taken_from_the_pool_are_not_also_counted_as_evictable():
    bm = BlockManager(3, 4)
    bm.allocate("a", list(range(9)))
    bm.free("a")  # 1 free + 2 cached
    fits = list(range(8)) + [5]  # 2 hits (both cached) + 1 new = the whole pool
    assert bm.can_allocate(fits) and bm.allocate("b", fits) == 8
    assert bm.num_available_blocks == 0


def test_eviction_takes_the_end_of_a_prefix_before_its_start_and_older_sequences_first():
    bm = BlockManager(6, 2)
    bm.allocate("old", [0, 1, 2, 3, 0])  # blocks 0, 1 full, 2 partial
    bm.allocate("new", [3, 3, 2, 2, 1])  # blocks 3, 4 full, 5 partial
    bm.free("old")
    bm.free("new")
    assert bm.cached_blocks() == [1, 0, 4, 3] and bm.num_free_blocks == 2
    bm.allocate("x", [1, 1, 1, 1, 1, 1, 1])  # 4 blocks: the 2 free, then evicts 1 and 0
    assert bm.cached_blocks() == [4, 3]
    assert not bm.can_allocate([3, 3, 2, 2, 0])  # 2 hits, but no block left for the last token
    bm.free("x")
    assert bm.allocate("y", [3, 3, 2, 2, 0]) == 4  # "new"'s prefix survived


def test_a_shared_prefix_shorter_than_a_block_never_hits():
    bm = BlockManager(8, 16)
    bm.allocate("a", list(range(15)) + [1])
    assert bm.allocate("b", list(range(15)) + [2]) == 0


def test_a_hash_collision_is_a_miss(monkeypatch):
    from labkit.kv_cache import blocks
    monkeypatch.setattr(blocks, "block_hash", lambda parent, tokens: 7)  # every block collides
    bm = BlockManager(8, 2)
    bm.allocate("a", [0, 1, 2])
    bm.free("a")
    assert bm.allocate("b", [0, 2, 2]) == 0  # different tokens under the same hash: no hit
    assert bm.allocate("c", [0, 1, 3]) == 2  # the stored tokens match: a hit


def test_fork_then_append_copies_the_shared_partial_block_once():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    bm.allocate("p", [1, 2, 3, 0, 1, 2])
    bm.fork("p", "c")
    bm.append("c", 3)
    assert bm.take_copies() == [(1, 2)] and bm.block_table("c") == [0, 2]
    bm.append("p", 0)  # the parent's block is its own again: no copy
    assert bm.take_copies() == [] and bm.block_table("p") == [0, 1]


def test_a_copy_into_a_block_freed_before_it_ran_is_dropped():
    bm = BlockManager(8, 4)
    bm.allocate("p", [1, 2])
    bm.fork("p", "c")
    bm.append("c", 3)
    bm.free("c")
    assert bm.take_copies() == []


def test_the_counters_add_up():
    bm = BlockManager(16, 4)
    for i in range(3):
        bm.allocate(i, list(range(10)))
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
    bm.allocate("a", [1, 2, 3])
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
    bm.allocate("a", [1, 2, 3, 4])
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


def test_refused_calls_deep_copy_of_state_is_the_snapshot():  # the snapshot itself sees every kind of state
    bm = BlockManager(4, 2)
    bm.allocate("a", [1, 2, 3])
    s = copy.deepcopy(snapshot(bm))
    bm.append("a", 1)
    assert snapshot(bm) != s
