"""PagedBatch and StepInput: a packed step over the paged pool gives each sequence the logits it gets alone.

The independent reference is TinyLM's own forward over each whole sequence, without any cache."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.serving import ModelRunner
from labkit.serving.batch import StepInput
from labkit.serving.batch import PagedBatch, slot_table
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
