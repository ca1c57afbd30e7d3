"""Sharing: the trie against a brute-force longest common prefix, block-hash hits against whole shared blocks
counted by hand, the memory saved by forking, and a shared prefix shorter than a block."""
from hypothesis import given, settings, strategies as st

from labkit.kv_cache import sharing
from tests.refusals import assert_refused


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=20), min_size=1, max_size=8),
       log_bs=st.integers(0, 3))
def test_both_matchers_against_brute_force(prompts, log_bs):
    bs = 2**log_bs
    got = sharing.matching_comparison(prompts, bs)
    best = [max([common_prefix(p, q) for q in prompts[:i]], default=0) for i, p in enumerate(prompts)]
    assert got["token trie"] == sum(min(b, len(p) - 1) for b, p in zip(best, prompts))
    assert got["block hash"] == sum(min(b, len(p) - 1) // bs * bs for b, p in zip(best, prompts))
    assert got["prompt tokens"] == sum(map(len, prompts))


def test_few_shot_prompts_share_their_prefix_and_a_block_longer_than_it_never_hits():
    prompts = sharing.few_shot_prompts(8, shots=3)
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared > 16
    s = sharing.prefix_sharing(prompts, 16)
    assert s.tokens_skipped == 7 * (shared // 16 * 16)
    assert s.blocks_without - s.blocks_with == 7 * (shared // 16)
    big = 1 << shared.bit_length()  # a block longer than the shared prefix
    assert sharing.prefix_sharing(prompts, big).tokens_skipped == 0


def test_parallel_sampling_shares_the_full_prompt_blocks():
    # 40 prompt tokens: blocks 0, 1 full and shared; block 2 (8 tokens) copied by the first two samples to
    # append, kept by the last; then 50, 60, 70 tokens need 1, 1, 2 more blocks
    s = sharing.parallel_sampling(40, [10, 20, 30], block_size=16)
    assert s.blocks_without == 4 + 4 + 5 and s.blocks_with == 2 + (1 + 1) + (1 + 1) + (1 + 2)
    assert 0 < s.saved < 1


def test_bad_input_is_refused():
    assert_refused(lambda: sharing.prefix_sharing([]), ValueError, "prompts", [], "a non-empty list of non-empty")
    assert_refused(lambda: sharing.prefix_sharing([[1], []]), ValueError, "prompts", [[1], []], "non-empty prompts")
    assert_refused(lambda: sharing.matching_comparison("ab"), TypeError, "prompts", "ab", "a list of prompts")
    assert_refused(lambda: sharing.parallel_sampling(8, []), ValueError, "output_lens", [], "n >= 1 samples")
    assert_refused(lambda: sharing.parallel_sampling(8, [3, -1]), ValueError, "output_lens[i]", -1, "non-negative")
