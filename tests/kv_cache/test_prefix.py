"""The hash chain: SHA-256 as documented (recomputed here with hashlib), chained so that equal blocks after
different prefixes differ, only full blocks hashed; the cached pool's eviction order; bad input."""
import hashlib
import struct

from hypothesis import given, strategies as st

from labkit.kv_cache import block_hash, hash_chain
from labkit.kv_cache.prefix import ROOT, CachedPool
from tests.refusals import assert_refused


def sha(parent, tokens):
    head = ROOT if parent is None else parent.to_bytes(8, "little")
    return int.from_bytes(hashlib.sha256(head + struct.pack(f"<{len(tokens)}I", *tokens)).digest()[:8], "little")


@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=40), log_bs=st.integers(0, 4))
def test_the_chain_is_sha256_of_parent_and_tokens(tokens, log_bs):
    bs = 2**log_bs
    chain = hash_chain(tokens, bs)
    assert len(chain) == len(tokens) // bs
    parent = None
    for i, h in enumerate(chain):
        parent = sha(parent, tokens[i * bs:(i + 1) * bs])
        assert h == parent


def test_equal_blocks_after_different_prefixes_hash_differently():
    a, b = hash_chain([1, 2, 9, 9], 2), hash_chain([3, 4, 9, 9], 2)
    assert a[0] != b[0] and a[1] != b[1]
    assert hash_chain([1, 2, 9, 9, 5], 2) == a  # the partial block has no hash


def test_the_pool_evicts_in_release_order_and_forgets_the_hash():
    pool = CachedPool()
    for h, b in ((10, 0), (11, 1), (12, 2)):
        assert pool.register(h, b)
    assert not pool.register(10, 5)  # a hash already held keeps its block
    pool.release([2, 1, 0])
    pool.take(1)
    assert pool.evict({0: 10, 1: 11, 2: 12}) == 2 and 12 not in pool.by_hash and len(pool) == 1


def test_bad_input_is_refused():
    assert_refused(lambda: block_hash(-1, [1]), ValueError, "parent", -1, "None or a 64-bit hash")
    assert_refused(lambda: block_hash(None, "ab"), TypeError, "tokens", "ab", "a sequence of token ids")
    assert_refused(lambda: hash_chain([1], 0), ValueError, "block_size", 0, "a positive int")
