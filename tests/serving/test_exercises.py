"""Notebook 06's exercises: each reference passes its own check, common mistakes fail it, a stub gets the
reference, and the notebook's solutions (written out here independently, as a learner would) pass. The
admission rule is checked against the real Scheduler; top-p against the sampling module and brute force; TPOT
against its definition."""
import math

import pytest
import torch

from labkit.kv_cache import BlockManager
from labkit.rng import Rng
from labkit.serving import SamplingParams, exercises as ex, probabilities
from labkit.serving.config import EngineConfig
from labkit.serving.scheduler import Scheduler
from labkit.serving.sequence import Sequence, Status


def top_p_filter(probs, p):
    ranked = torch.sort(probs, descending=True).values
    before = torch.cumsum(ranked, 0) - ranked         # mass ranked ahead of each
    last = ranked[int((before < p).sum()) - 1]        # the least likely token kept: the one that reaches p
    kept = torch.where(probs >= last, probs, 0.0)     # with every token tied with it
    return kept / kept.sum()


def admitted(running, waiting, budget, free_blocks, block_size, max_num_seqs):
    budget -= len(running)
    free_blocks -= sum(1 for n in running if n % block_size == 0)
    joined = 0
    for n in waiting:
        blocks = -(-n // block_size)
        if len(running) + joined >= max_num_seqs or blocks > free_blocks or (n > budget and (running or joined)):
            break
        budget, free_blocks, joined = budget - n, free_blocks - blocks, joined + 1
    return joined


def tpot(arrival, token_times):
    if len(token_times) < 2:
        return None
    return (token_times[-1] - token_times[0]) / (len(token_times) - 1)


EXERCISES = [(top_p_filter, ex.TOP_P), (admitted, ex.ADMIT), (tpot, ex.TPOT)]


def test_the_notebook_solutions_and_the_references_pass(capsys):
    for fn, exercise in EXERCISES:
        assert exercise.check(fn) is fn
        copy_of_reference = lambda *a, e=exercise: e.reference(*a)  # noqa: E731
        assert exercise.check(copy_of_reference) is copy_of_reference
    assert capsys.readouterr().out.count("[PASS]") == 2 * len(EXERCISES)


def top_p_by_sort_position(probs, p):  # splits a tie at the threshold by where argsort put the tokens
    order = torch.argsort(probs, descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    kept = torch.zeros_like(probs)
    kept[order[before < p]] = probs[order[before < p]]
    return kept / kept.sum()


def top_p_without_the_crossing_token(probs, p):
    order = torch.argsort(probs, descending=True)
    kept = torch.zeros_like(probs)
    inside = order[torch.cumsum(probs[order], 0) <= p]
    kept[inside] = probs[inside]
    return kept / kept.sum() if kept.sum() > 0 else kept


def admit_shortest_first(running, waiting, budget, free_blocks, block_size, max_num_seqs):
    """Short prompts overtake long ones (not first come, first served)."""
    return admitted(running, sorted(waiting), budget, free_blocks, block_size, max_num_seqs)


@pytest.mark.parametrize("fn, exercise", [
    (top_p_without_the_crossing_token, ex.TOP_P),
    (top_p_by_sort_position, ex.TOP_P),
    (lambda probs, p: probs, ex.TOP_P),                                                       # no filter
    (lambda probs, p: torch.where(top_p_filter(probs, p) > 0, probs, 0.0), ex.TOP_P),       # not renormalised
    (admit_shortest_first, ex.ADMIT),
    (lambda r, w, b, f, bs, m: admitted([], w, b, f, bs, m - len(r)) if m > len(r) else 0, ex.ADMIT),  # decodes free
    (lambda r, w, b, f, bs, m: admitted(r, w, b, 10**9, bs, m), ex.ADMIT),                    # ignores blocks
    (lambda a, t: (t[-1] - a) / len(t), ex.TPOT),                                             # E2E / tokens
    (lambda a, t: (t[-1] - t[0]) / len(t) if len(t) > 1 else None, ex.TPOT),                  # divides by n
    (lambda a, t: (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0, ex.TPOT),             # 0 for one token
], ids=["drops the crossing token", "ties by sort position", "no filter", "not renormalised", "overtakes",
        "decodes cost nothing", "no blocks", "e2e over tokens", "divides by n", "zero for one token"])
def test_common_mistakes_fail(fn, exercise, capsys):
    assert exercise.check(fn) is exercise.reference  # the notebook goes on with the reference
    assert capsys.readouterr().out.startswith("[FAIL]")


@pytest.mark.parametrize("exercise", [ex.TOP_P, ex.ADMIT, ex.TPOT], ids=lambda e: e.name)
def test_a_stub_is_todo(exercise, capsys):
    def stub(*args):
        raise NotImplementedError("exercise: write this part")
    assert exercise.check(stub) is exercise.reference and capsys.readouterr().out.startswith("[TODO]")


# --- the references against independent ones ---------------------------------------------------------------

def brute_top_p(probs, p):
    """Every set that keeps all tokens at or above some probability (the sets that never split a tie), smallest
    first: the first whose mass reaches p."""
    for threshold in sorted(set(probs.tolist()), reverse=True):
        kept = torch.where(probs >= threshold, probs, 0.0)
        if kept.sum() >= p:
            return kept / kept.sum()


def on_a_boundary(probs, p):
    """Whether p equals a cumulative sum of the sorted probabilities: where rounding in softmax(log(probs))
    decides whether the next token is kept."""
    return any(abs(c - p) < 1e-12 for c in torch.cumsum(torch.sort(probs, descending=True).values, 0).tolist())


def test_top_p_reference_is_the_smallest_tie_closed_set_and_the_sampling_modules():
    rng = Rng(5)
    cases = list(ex.TOP_P.cases) + [ex.random_top_p_case(rng) for _ in range(300)]
    assert sum(len(set(probs.tolist())) < len(probs) for probs, _ in cases) > 100  # ties are common
    for probs, p in cases:
        got = ex.top_p_filter(probs, p)
        assert torch.allclose(got, brute_top_p(probs, p), atol=1e-12), (probs, p)
        if not on_a_boundary(probs, p):
            module = probabilities(torch.log(probs), SamplingParams(temperature=1.0, top_p=p))
            assert torch.equal(got > 0, module > 0) and torch.allclose(got, module, atol=1e-12), (probs, p)


def test_top_p_does_not_depend_on_the_order_of_the_vocabulary():
    rng = Rng(8)
    for _ in range(100):
        probs, p = ex.random_top_p_case(rng)
        perm = torch.randperm(len(probs), generator=torch.Generator().manual_seed(rng.below(2**31)))
        shuffled, kept = ex.top_p_filter(probs[perm], p), ex.top_p_filter(probs, p)[perm]
        assert torch.equal(shuffled > 0, kept > 0) and torch.allclose(shuffled, kept, atol=1e-15)


@pytest.mark.parametrize("args, error, match", [
    ((torch.tensor([0.5, 0.5]), 0.5), ValueError, "probs must be a 1-D float64"),
    ((torch.tensor([[0.5, 0.5]], dtype=torch.float64), 0.5), ValueError, "probs must be a 1-D float64"),
    (([0.5, 0.5], 0.5), TypeError, "probs must be"),
    ((torch.tensor([0.5, 0.5], dtype=torch.float64), 0.0), ValueError, "p must be a number in"),
    ((torch.tensor([0.5, 0.5], dtype=torch.float64), 1.5), ValueError, "p must be")])
def test_top_p_refuses_bad_input_by_name(args, error, match):
    with pytest.raises(error, match=match):
        ex.top_p_filter(*args)


def scheduler_admits(running, waiting, budget, free_blocks, block_size, max_num_seqs):
    """Build the situation in a real BlockManager + Scheduler (policy "continuous") and count the waiting requests
    its next step schedules."""
    held = sum(-(-n // block_size) for n in running)
    bm = BlockManager(held + free_blocks + 64, block_size, enable_prefix_caching=False)
    bm.allocate("ballast", [1] * (64 * block_size))  # the pool is larger than the free blocks
    sched = Scheduler(bm, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget))
    for i, n in enumerate(running):
        seq = Sequence(f"run-{i}", [2] * n, SamplingParams(max_tokens=10, temperature=0), arrival=0.0)
        bm.allocate(seq.request_id, seq.tokens)
        bm.mark_computed(seq.request_id, n)
        seq.output.append(3)  # its last sampled token: computed in this step
        seq.status = Status.RUNNING
        sched.running.append(seq)
    assert bm.num_free_blocks == free_blocks
    for i, n in enumerate(waiting):
        sched.add(Sequence(f"wait-{i}", [4] * n, SamplingParams(max_tokens=1, temperature=0), arrival=1.0 + i))
    out = sched.schedule(now=10.0)
    assert not out.preempted
    new = [s.seq.request_id for s in out.scheduled if s.seq.request_id.startswith("wait-")]
    assert new == [f"wait-{i}" for i in range(len(new))]  # in queue order, from its head
    return len(new)


def test_admission_rule_is_the_schedulers():
    rng = Rng(11)
    cases = list(ex.ADMIT.cases) + [ex.random_admit_case(rng) for _ in range(200)]
    for case in cases:
        assert ex.admitted(*case) == scheduler_admits(*case), case


def test_tpot_reference_follows_its_definition_and_is_the_mean_itl():
    rng = Rng(2)
    for _ in range(50):
        arrival, times = ex.random_tpot_case(rng)
        got = ex.tpot(arrival, times)
        if len(times) == 1:
            assert got is None
        else:
            itl = [b - a for a, b in zip(times, times[1:])]
            assert math.isclose(got, ((times[-1] - arrival) - (times[0] - arrival)) / (len(times) - 1), abs_tol=1e-12)
            assert math.isclose(got, sum(itl) / len(itl), abs_tol=1e-12)


def test_random_cases_are_valid_inputs():
    rng = Rng(3)
    for _ in range(50):
        probs, p = ex.random_top_p_case(rng)
        assert abs(probs.sum().item() - 1) < 1e-9 and 0 < p <= 1 and probs.dtype == torch.float64
        running, waiting, budget, free, bs, m = ex.random_admit_case(rng)
        assert len(running) <= m <= budget and free >= sum(1 for n in running if n % bs == 0)
        arrival, times = ex.random_tpot_case(rng)
        assert times and times == sorted(times) and times[0] >= arrival
