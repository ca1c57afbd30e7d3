"""PagedBatch and StepInput: a packed step over the paged pool gives each sequence the logits it gets alone.

The independent references are TinyLM's own forward over each whole sequence, without any cache, and, for
attention alone (decode rows cut into groups by length), each sequence's attention computed by brute force."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.serving import ModelRunner
from labkit.serving.batch import StepInput
from labkit.serving.batch import SPLIT_KEYS, PagedBatch, decode_groups, slot_table
from tests.refusals import assert_refused

BS = 4
ATOL = 1e-4  # float32 logits; a packed step reduces in another order than the lone forward (COURSE.md)


def step_of(seqs, tables, starts, ends, sample=None):
    """A StepInput computing tokens [start, end) of each sequence (token lists) through its block table."""
    tokens, positions, slots = [], [], []
    for seq, table, a, b in zip(seqs, tables, starts, ends):
        tokens += seq[a:b]
        positions += range(a, b)
        slots += [table[p // BS] * BS + p % BS for p in range(a, b)]
    rows = list(range(len(seqs))) if sample is None else sample
    return StepInput(torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots),
                     [b - a for a, b in zip(starts, ends)], list(ends), tables, rows)


def alone(model, seq, end):
    with torch.no_grad():
        return model(torch.tensor([seq[:end]]))[0, -1]


def random_tables(lengths, num_blocks, rng):
    """Disjoint block tables in shuffled order (so neighbours in the pool belong to other sequences)."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = []
    for n in lengths:
        k = -(-n // BS)
        tables.append(free[:k])
        free = free[k:]
    return tables


def test_slot_table_matches_brute_force():
    tables, lengths = [[5, 2, 7], [1], [3, 0]], [9, 2, 8]
    table = slot_table(tables, lengths, BS)
    assert table.shape == (3, 9)
    for i, (t, n) in enumerate(zip(tables, lengths)):
        assert table[i, :n].tolist() == [t[p // BS] * BS + p % BS for p in range(n)]


def reference_attention(q, k_pool, v_pool, step):
    """Each sequence alone, brute force in float64: every query row of it against the keys and values read
    through its own block table, positions <= its own. q [1, H, N, hd], pools [Hkv, slots, hd] -> [1, H, N, hd]."""
    q, k_pool, v_pool = q.double(), k_pool.double(), v_pool.double()
    out, start = torch.zeros_like(q), 0
    group = q.shape[1] // k_pool.shape[0]  # query heads per KV head
    for n, c, table in zip(step.query_lens, step.context_lens, step.block_tables):
        slots = [table[p // BS] * BS + p % BS for p in range(c)]
        for h in range(q.shape[1]):
            keys, values = k_pool[h // group, slots], v_pool[h // group, slots]  # [c, hd]
            for j in range(n):
                seen = c - n + j + 1  # the query at position c - n + j sees positions 0 .. c - n + j
                w = torch.softmax(keys[:seen] @ q[0, h, start + j] / q.shape[-1] ** 0.5, dim=0)
                out[0, h, start + j] = w @ values[:seen]
        start += n
    return out


def test_decode_groups_of_the_docstring_example():
    lengths = [250, 244, 231] + [64 - 33 * i // 28 for i in range(29)]
    assert [[lengths[i] for i in g] for g in decode_groups(lengths)] == [lengths[:3], lengths[3:]]
    assert decode_groups([5, 9, 7], 0) == [[1], [2], [0]] and decode_groups([5, 9, 7], 10 ** 6) == [[1, 2, 0]]
    assert decode_groups([]) == []
    assert_refused(lambda: decode_groups([3], -1), ValueError, "split_keys", -1, "an int >= 0")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=70), st.sampled_from([0, 50, 500, SPLIT_KEYS, 10 ** 6]))
def test_decode_groups_partition_sorted_rows_by_the_cut_rule(lengths, split_keys):
    groups = decode_groups(lengths, split_keys)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))                       # every row once
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)    # longest first
    for g, group in enumerate(groups):
        head = lengths[group[0]]
        for i in group[1:]:  # joined: the cut would have saved at most split_keys key positions
            assert (head - lengths[i]) * (len(flat) - flat.index(i)) <= split_keys
        if g:                # cut: it saves more than split_keys
            assert (lengths[groups[g - 1][0]] - head) * (len(flat) - flat.index(group[0])) > split_keys


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 3)), min_size=1, max_size=12),
       st.sampled_from([0, 20, 200, SPLIT_KEYS]), st.integers(0, 99))
def test_attend_equals_each_sequence_alone_across_group_edges(shapes, split_keys, seed):
    """Decode rows of many lengths (some equal, so some groups need no mask) and prefill chunks in one step,
    against the brute-force reference. The pools are random everywhere, so a row padded without its mask, or
    attending through another row's slots, or written to another row's output, reads other numbers."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ctx = [c for c, _ in shapes]
    q_lens = [1 if r < 3 else rng.randint(1, c) for (c, r) in shapes]  # 1 in 3: a prefill chunk
    H, Hkv, hd, num_blocks = 4, 2, 8, 140
    tables = random_tables(ctx, num_blocks, rng)
    step = step_of([[0] * c for c in ctx], tables, [c - n for c, n in zip(ctx, q_lens)], ctx)
    pools = torch.randn(2, Hkv, num_blocks * BS, hd).unbind(0)
    batch = PagedBatch(step, (pools[0][None], pools[1][None]), BS, split_keys)
    assert sorted(i for rows, _, _ in batch.decode for i in rows.tolist()) == \
        [s for s, n in zip(step.logit_rows().tolist(), q_lens) if n == 1]  # every decode row in one group
    N = step.num_tokens
    q, k, v = torch.randn(1, H, N, hd), torch.randn(1, Hkv, N, hd), torch.randn(1, Hkv, N, hd)
    out = batch.attend(0, q, k, v)
    assert torch.allclose(out.double(), reference_attention(q, pools[0], pools[1], step), atol=1e-5)


def test_prefill_then_mixed_step_equals_each_sequence_alone(model, prompts):
    rng = random.Random(0)
    seqs = [prompts[0] + [65] * 3, prompts[6][:30], prompts[12]]
    runner = ModelRunner(model, 64, BS)
    tables = random_tables([len(s) for s in seqs], 64, rng)
    first = [len(seqs[0]) - 1, 7, len(seqs[2])]  # step 1: prefills (the third whole)
    logits = runner.execute(step_of(seqs, tables, [0, 0, 0], first))
    for row, (s, e) in enumerate(zip(seqs, first)):
        assert torch.allclose(logits[row], alone(model, s, e), atol=ATOL)
    # step 2: a decode, a chunk after 7 cached tokens, and nothing for the third (it is not in the batch)
    step = step_of(seqs[:2], tables[:2], first[:2], [len(seqs[0]), 19])
    logits = runner.execute(step)
    assert torch.allclose(logits[0], alone(model, seqs[0], len(seqs[0])), atol=ATOL)
    assert torch.allclose(logits[1], alone(model, seqs[1], 19), atol=ATOL)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=6), st.integers(0, 99))
def test_random_packed_steps_equal_alone(model, prompts, shapes, seed):
    """Sequences computed in 1-3 chunks (0 = one step), packed with the others in every step."""
    rng = random.Random(seed)
    seqs = [(prompts[rng.randrange(len(prompts))] * 10)[:n] for n, _ in shapes]
    cuts = [sorted({0, n, *(rng.randrange(1, n) for _ in range(c) if n > 1)}) for (n, c) in shapes]
    runner = ModelRunner(model, 80, BS)
    tables = random_tables([len(s) for s in seqs], 80, rng)
    for k in range(max(len(c) for c in cuts) - 1):
        live = [i for i, c in enumerate(cuts) if k + 1 < len(c)]
        step = step_of([seqs[i] for i in live], [tables[i] for i in live], [cuts[i][k] for i in live],
                       [cuts[i][k + 1] for i in live])
        logits = runner.execute(step)
        for row, i in enumerate(live):
            assert torch.allclose(logits[row], alone(model, seqs[i], cuts[i][k + 1]), atol=ATOL)


def test_sample_rows_pick_the_last_token_of_those_sequences(model, prompts):
    seqs = [prompts[12][:10], prompts[13][:12]]
    tables = random_tables([10, 12], 16, random.Random(1))
    step = step_of(seqs, tables, [0, 0], [10, 12], sample=[1])
    assert step.logit_rows().tolist() == [21]
    logits = ModelRunner(model, 16, BS).execute(step)
    assert logits.shape == (1, model.cfg.vocab_size)
    assert torch.allclose(logits[0], alone(model, seqs[1], 12), atol=ATOL)


def test_a_step_that_does_not_add_up_is_refused(model):
    runner = ModelRunner(model, 8, BS)
    step = StepInput(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), [2], [2], [[0]], [0])
    with pytest.raises(ValueError, match="step must be one query length"):
        PagedBatch(step, (runner.k, runner.v), BS)
    assert_refused(lambda: runner.execute("step"), TypeError, "step", "step", "a labkit.serving.batch.StepInput")


def test_a_step_without_images_has_no_embeds_and_the_lab_06_constructor_still_works():
    one = torch.zeros(1, dtype=torch.long)
    step = StepInput(one, one, one, [1], [1], [[0]], [0], [], [], [], [])
    assert step.embeds is None and step.num_tokens == 1
