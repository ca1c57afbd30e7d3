"""PagedKVCache and paged attention against independent references: generation with the contiguous KVCache
(greedy tokens equal, logits within 1e-4) with scattered, permuted blocks; attention over random block tables
against torch's scaled_dot_product_attention on the contiguous tensors; copy-on-write seen through the pool;
a prefix hit that skips its prefill and still gives the same logits; bad input."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from labkit.kv_cache import BlockManager, PagedKVCache, paged_attention, paged_generate, slots_of
from labkit.kv_cache.blocks import OutOfBlocksError
from labkit.kv_cache.paged import gather
from labkit.tinylm import KVCache
from tests.refusals import assert_refused

LOGIT_TOL = 1e-4  # float32, a different gather order than the contiguous cache: identical math, ~1e-6 seen


@torch.no_grad()
def contiguous_greedy(model, prompt, n):
    cache = KVCache(model.cfg)
    logits = model(torch.tensor([prompt]), cache)[0, -1]
    out, rows = [], []
    for _ in range(n):
        rows.append(logits)
        out.append(int(logits.argmax()))
        logits = model(torch.tensor([[out[-1]]]), cache)[0, -1]
    return out, torch.stack(rows)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_generation_equals_the_contiguous_cache_with_scattered_blocks(pretrained, block_size):
    model, tok = pretrained
    prompt = tok.encode("The key of room 7 is blue. The key of room 3 is")
    bm = BlockManager(256 // block_size + 8, block_size, vocab_size=256)
    bm.shuffle_free(seed=block_size)
    cache = PagedKVCache(model.cfg, bm)
    got, got_logits = paged_generate(model, prompt, 40, cache, seq_id="s", return_logits=True)
    table = bm.block_table("s")
    assert table != sorted(table) or len(table) == 1  # really scattered
    want, want_logits = contiguous_greedy(model, prompt, 40)
    assert got == want
    assert torch.allclose(got_logits, want_logits, atol=LOGIT_TOL, rtol=0)


def test_a_prefix_hit_skips_its_prefill_and_gives_the_same_logits(pretrained):
    model, tok = pretrained
    shared = tok.encode("Q: what is 12 + 30? A: 42\nQ: what is 7 + 5? A: 12\n")
    bm = BlockManager(64, 8, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    paged_generate(model, shared + tok.encode("Q: 1 + 1?"), 4, cache, seq_id=0)
    cached_before = bm.cached_tokens
    got, logits = paged_generate(model, shared + tok.encode("Q: 2 + 2?"), 6, cache, seq_id=1, return_logits=True)
    assert bm.cached_tokens - cached_before == len(shared) // 8 * 8 > 0
    want, want_logits = contiguous_greedy(model, shared + tok.encode("Q: 2 + 2?"), 6)
    assert got == want and torch.allclose(logits, want_logits, atol=LOGIT_TOL, rtol=0)


def test_parallel_samples_share_blocks_and_copy_on_write_keeps_them_apart(pretrained):
    model, tok = pretrained
    prompt = tok.encode("Once upon a time")  # 16 tokens: the last block is partly filled at block size 32
    bm = BlockManager(16, 32, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    cache.start("p", prompt)
    model(torch.tensor([prompt]), cache.select(["p"]))
    cache.fork("p", "c")
    assert bm.block_table("c") == bm.block_table("p") and bm.ref_count(bm.block_table("p")[0]) == 2
    outs = {}
    for seq, first in (("p", ord("!")), ("c", ord("?"))):  # each child continues with its own token
        bm.append(seq, first)
        outs[seq] = model(torch.tensor([[first]]), cache.select([seq]))[0, -1]
    assert bm.block_table("c") != bm.block_table("p")
    for seq, first in (("p", ord("!")), ("c", ord("?"))):
        want = contiguous_greedy(model, prompt + [first], 1)[1][0]
        assert torch.allclose(outs[seq], want, atol=LOGIT_TOL, rtol=0)


def test_a_batch_of_forked_sequences_runs_through_one_forward(pretrained):
    model, tok = pretrained
    prompt = tok.encode("abc abc abc")
    bm = BlockManager(16, 4, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    cache.start(0, prompt)
    model(torch.tensor([prompt]), cache.select([0]))
    cache.fork(0, 1)
    nxt = [ord("x"), ord("y")]
    for s, t in zip((0, 1), nxt):
        bm.append(s, t)
    logits = model(torch.tensor([[nxt[0]], [nxt[1]]]), cache.select([0, 1]))[:, -1]
    for row, t in enumerate(nxt):
        want = contiguous_greedy(model, prompt + [t], 1)[1][0]
        assert torch.allclose(logits[row], want, atol=LOGIT_TOL, rtol=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), length=st.integers(1, 70), t=st.integers(1, 4), log_bs=st.integers(0, 4),
       kv=st.sampled_from([(4, 4), (4, 2), (4, 1)]))
def test_attention_over_random_block_tables_equals_sdpa_on_contiguous_tensors(seed, length, t, log_bs, kv):
    t = min(t, length)
    bs, (heads, kv_heads) = 2**log_bs, kv
    gen = torch.Generator().manual_seed(seed)
    n_blocks = -(-length // bs)
    num_blocks = n_blocks + 3
    table = torch.randperm(num_blocks, generator=gen)[:n_blocks].tolist()
    k, v = torch.randn(2, kv_heads, length, 8, generator=gen)
    q = torch.randn(heads, t, 8, generator=gen)
    k_pool, v_pool = torch.randn(2, kv_heads, num_blocks * bs, 8, generator=gen)  # garbage in unused slots
    for p in range(length):  # scatter the contiguous tensors by hand
        k_pool[:, table[p // bs] * bs + p % bs] = k[:, p]
        v_pool[:, table[p // bs] * bs + p % bs] = v[:, p]
    assert torch.equal(gather(k_pool, table, length, bs), k)
    group = heads // kv_heads
    mask = torch.ones(t, length, dtype=torch.bool).tril(diagonal=length - t)
    want = F.scaled_dot_product_attention(q[None], k.repeat_interleave(group, 0)[None],
                                          v.repeat_interleave(group, 0)[None], attn_mask=mask)[0]
    got = paged_attention(q, k_pool, v_pool, table, length, bs)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


# --- bad input ----------------------------------------------------------------------------------------------

def prefilled(model):
    """A cache whose sequence 0 holds the computed prompt [1, 2, 3]."""
    bm = BlockManager(4, 4, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    cache.start(0, [1, 2, 3])
    model(torch.tensor([[1, 2, 3]]), cache.select([0]))
    return bm, cache


def test_a_forward_past_the_reserved_slots_is_refused(pretrained):
    model, _ = pretrained
    bm, cache = prefilled(model)
    with pytest.raises(ValueError, match="reserve each new token with block_manager.append"):
        model(torch.tensor([[4]]), cache)
    assert cache.computed(0) == 3


def test_running_out_of_blocks_mid_generation_frees_the_sequence(pretrained):
    model, _ = pretrained
    bm = BlockManager(2, 2, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    with pytest.raises(OutOfBlocksError):
        paged_generate(model, [1, 2, 3], 5, cache)
    assert bm.seq_ids == [] and bm.num_available_blocks == 2 and bm.num_used_blocks == 0


def test_a_second_request_before_the_first_ones_forward_is_not_served_uncomputed_blocks(pretrained):
    model, tok = pretrained
    prompt = tok.encode("The key of room 7 is")[:20]
    bm = BlockManager(16, 8, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    assert cache.start("a", prompt) == 0
    assert cache.start("b", prompt) == 0  # a's K/V are not written yet: nothing to share
    logits = model(torch.tensor([prompt]), cache.select(["b"]))[0, -1]
    want = contiguous_greedy(model, prompt, 1)[1][0]
    assert torch.allclose(logits, want, atol=LOGIT_TOL, rtol=0)
    assert cache.start("c", prompt) == 16  # b's forward wrote them: now they are shared


def test_a_failed_request_leaves_no_blocks_for_the_next_one_with_its_prefix(pretrained):
    model, tok = pretrained
    prompt = tok.encode("Once upon a time, there was")
    bm = BlockManager(8, 4)  # vocab_size tied to the model's by the cache
    cache = PagedKVCache(model.cfg, bm)
    assert bm.vocab_size == model.cfg.vocab_size
    before = (bm.free_blocks(), bm.hash_map())
    assert_refused(lambda: paged_generate(model, prompt + [300], 3, cache, seq_id="bad"), ValueError, "prompt",
                   300, "the model's vocabulary")
    assert bm.seq_ids == [] and (bm.free_blocks(), bm.hash_map()) == before
    with pytest.raises(OutOfBlocksError):  # fails after allocating: freed, and its uncomputed blocks not cached
        paged_generate(model, prompt, 8, cache, seq_id="big")
    assert bm.seq_ids == [] and bm.num_used_blocks == 0
    got, logits = paged_generate(model, prompt, 2, cache, seq_id="next", return_logits=True)
    want, want_logits = contiguous_greedy(model, prompt, 2)
    assert got == want and torch.allclose(logits, want_logits, atol=LOGIT_TOL, rtol=0)


def test_freeing_through_the_manager_leaves_no_state_in_the_cache(pretrained):
    model, _ = pretrained
    bm, cache = prefilled(model)
    assert cache.computed(0) == bm.num_computed(0) == 3
    bm.free(0)
    assert_refused(lambda: cache.computed(0), ValueError, "seq_id", 0, "a sequence this manager holds")
    bm.allocate(0, [4, 5])  # the same id, a new sequence: nothing computed, whatever the cache saw before
    assert cache.computed(0) == 0 and cache.select([0]).length == 0


def test_bad_arguments_are_refused(pretrained):
    model, _ = pretrained
    bm = BlockManager(4, 4)
    assert_refused(lambda: PagedKVCache(model.cfg, bm, dtype=torch.int8), ValueError, "dtype", torch.int8,
                   "a floating-point torch.dtype")
    assert_refused(lambda: PagedKVCache("cfg", bm), TypeError, "cfg", "cfg", "a TinyLMConfig")
    assert_refused(lambda: PagedKVCache(model.cfg, BlockManager(4, 4, vocab_size=300)), ValueError,
                   "block_manager", "a BlockManager with vocab_size 300", "the model's vocab_size 256")
    cache = PagedKVCache(model.cfg, bm)
    assert_refused(lambda: cache.select([0]), ValueError, "seq_ids[i]", 0, "a sequence this manager holds")
    cache.start(6, [1])
    assert_refused(lambda: cache.select([6, 6]), ValueError, "seq_ids", [6, 6], "distinct sequence ids")
    with pytest.raises(ValueError, match="no sequence selected"):
        model(torch.tensor([[1]]), PagedKVCache(model.cfg, BlockManager(4, 4)))
    model(torch.tensor([[1]]), cache.select([6]))
    cache.start(7, [1, 2])
    with pytest.raises(ValueError, match="different cached lengths"):
        cache.select([6, 7]).length
    assert_refused(lambda: gather(torch.zeros(2, 6, 4), [0], 4, 4), ValueError, "pool", (2, 6, 4),
                   "[n_kv_heads, num_blocks * 4, head_dim]")


def test_bad_requests_to_paged_generate_are_refused_before_anything_is_allocated(pretrained):
    model, _ = pretrained
    bm = BlockManager(64, 4, vocab_size=256)
    cache = PagedKVCache(model.cfg, bm)
    ctx = model.cfg.max_seq_len
    assert_refused(lambda: paged_generate(model, [1] * (ctx - 2), 3, cache), ValueError, "prompt",
                   f"{ctx - 2} tokens + max_new_tokens 3", f"between 1 and {ctx} tokens")
    assert_refused(lambda: paged_generate(model, [], 3, cache), ValueError, "prompt", "0 tokens + max_new_tokens 3",
                   "between 1")
    assert_refused(lambda: paged_generate(model, [1, -1], 3, cache), ValueError, "prompt", -1, "[0, 256)")
    assert_refused(lambda: paged_generate(model, "hi", 3, cache), TypeError, "prompt", "hi", "a list of token ids")
    assert_refused(lambda: paged_generate(model, [1], 0, cache), ValueError, "max_new_tokens", 0, "positive")
    with pytest.raises(TypeError, match=r"^model must be a TinyLM .*, got str$"):  # tinylm's own check
        paged_generate("m", [1], 1, cache)
    paged_generate(model, [1], 1, cache, seq_id="x")
    assert_refused(lambda: paged_generate(model, [1], 1, cache, seq_id="x"), ValueError, "seq_id", "x",
                   "a new sequence id")
    assert bm.seq_ids == ["x"]


def test_block_tables_and_lengths_out_of_range_are_refused():
    pool = torch.zeros(2, 16, 4)  # 4 blocks of 4
    assert_refused(lambda: slots_of([0, 1], -1, 4), ValueError, "length", -1, "non-negative")
    assert_refused(lambda: slots_of([0, -1], 4, 4), ValueError, "block_table", [0, -1], "non-negative")
    assert_refused(lambda: gather(pool, [0, 4], 5, 4), ValueError, "block_table", [0, 4], "[0, 4)")
    assert_refused(lambda: gather(pool, [0], 5, 4), ValueError, "length", 5, "<= 4")
    assert_refused(lambda: gather(pool, [0, 1.0], 5, 4), TypeError, "block_table", [0, 1.0], "ints")
    q = torch.zeros(2, 1, 4)
    assert_refused(lambda: paged_attention(q, pool, pool, [7], 1, 4), ValueError, "block_table", [7], "[0, 4)")
    assert_refused(lambda: paged_attention(q[0], pool, pool, [0], 1, 4), ValueError, "q", (1, 4), "a 3-D tensor")
