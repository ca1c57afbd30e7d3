"""The hash chain: SHA-256 as documented (recomputed here with hashlib), chained so that equal blocks after
different prefixes differ, only full blocks hashed; the cached pool's eviction order; bad input."""
import hashlib
import struct

from hypothesis import given, strategies as st

from labkit.kv_cache.prefix import block_hash, hash_chain
from labkit.kv_cache.prefix import ROOT, CachedPool, check_spans, mm_extra_keys
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


# --- images: extra keys (lab 07) ---------------------------------------------------------------------------

def sha_mm(parent, tokens, extra):
    """The documented encoding: after the tokens, b"mm" + uint32 length + UTF-8 hash + int64 offset per key."""
    head = ROOT if parent is None else parent.to_bytes(8, "little")
    tail = b"".join(b"mm" + struct.pack("<I", len(h.encode())) + h.encode() + struct.pack("<q", o) for h, o in extra)
    data = head + struct.pack(f"<{len(tokens)}I", *tokens) + tail
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


@given(tokens=st.lists(st.integers(0, 300), min_size=1, max_size=8),
       extra=st.lists(st.tuples(st.sampled_from(["a", "b", "é"]), st.integers(-8, 8)), max_size=3))
def test_extra_keys_are_hashed_as_documented_and_none_is_the_plain_hash(tokens, extra):
    assert block_hash(7, tokens, tuple(extra)) == sha_mm(7, tokens, extra)
    if not extra:
        assert block_hash(None, tokens, ()) == sha(None, tokens)
    else:
        assert block_hash(7, tokens, tuple(extra)) != block_hash(7, tokens)


@given(spans=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 6)), max_size=4), start=st.integers(0, 24),
       size=st.integers(1, 8))
def test_the_extra_keys_of_a_block_are_the_images_with_a_position_in_it(spans, start, size):
    """Against brute force over positions: an image is a key of [start, start + size) iff one of its
    placeholder positions lies there; its offset is taken relative to the block's start (as vLLM does)."""
    taken, kept = set(), []
    for o, n in spans:  # keep a non-overlapping subset
        if not taken & set(range(o, o + n)):
            taken |= set(range(o, o + n))
            kept.append((o, n, f"img{o}"))
    ordered = check_spans(kept, 30)
    want = tuple((h, o - start) for o, n, h in ordered if set(range(o, o + n)) & set(range(start, start + size)))
    assert mm_extra_keys(ordered, start, start + size) == want


def test_bad_spans_and_extra_keys_are_refused():
    assert_refused(lambda: check_spans([(0, 2, "a"), (1, 2, "b")], 8), ValueError, "mm", "image 'b' at 1 inside [0, 2)",
                   "ranges that do not overlap")
    assert_refused(lambda: check_spans([(6, 3, "a")], 8), ValueError, "mm[0]", (6, 3, "a"), "inside the prompt's 8")
    assert_refused(lambda: check_spans([(0, 0, "a")], 8), ValueError, "mm[0]", (0, 0, "a"), "at least one token")
    assert_refused(lambda: check_spans([(0, 2, "")], 8), TypeError, "mm[0]", (0, 2, ""), "non-empty str")
    assert_refused(lambda: check_spans("ab", 8), TypeError, "mm", "ab", "(offset, length, image hash) triples")
    assert_refused(lambda: block_hash(None, [1], [("a", 1.5)]), TypeError, "extra_keys", ("a", 1.5), "pairs")
