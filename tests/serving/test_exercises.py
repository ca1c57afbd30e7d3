"""Notebook 06's exercises: each reference passes its own check, common mistakes fail it, a stub gets the
reference, and the notebook's solutions (written out here independently, as a learner would) pass. The
admission rule is checked against the real Scheduler; top-p and TPOT against brute force."""
import itertools
import math

import pytest
import torch

from labkit.kv_cache import BlockManager
from labkit.rng import Rng
from labkit.serving import SamplingParams, exercises as ex
from labkit.serving.config import EngineConfig
from labkit.serving.scheduler import Scheduler
from labkit.serving.sequence import Sequence, Status


def top_p_filter(probs, p):
    order = torch.argsort(probs, descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    kept = torch.zeros_like(probs)
    kept[order[before < p]] = probs[order[before < p]]
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
    (lambda probs, p: probs, ex.TOP_P),                                                       # no filter
    (lambda probs, p: torch.where(top_p_filter(probs, p) > 0, probs, 0.0), ex.TOP_P),       # not renormalised
    (admit_shortest_first, ex.ADMIT),
    (lambda r, w, b, f, bs, m: admitted([], w, b, f, bs, m - len(r)) if m > len(r) else 0, ex.ADMIT),  # decodes free
    (lambda r, w, b, f, bs, m: admitted(r, w, b, 10**9, bs, m), ex.ADMIT),                    # ignores blocks
    (lambda a, t: (t[-1] - a) / len(t), ex.TPOT),                                             # E2E / tokens
    (lambda a, t: (t[-1] - t[0]) / len(t) if len(t) > 1 else None, ex.TPOT),                  # divides by n
    (lambda a, t: (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0, ex.TPOT),             # 0 for one token
], ids=["drops the crossing token", "no filter", "not renormalised", "overtakes", "decodes cost nothing",
        "no blocks", "e2e over tokens", "divides by n", "zero for one token"])
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
    """The smallest subset (by size, then by mass) of most likely tokens whose mass reaches p, by enumeration."""
    v = len(probs)
    for size in range(1, v + 1):
        best = max(itertools.combinations(range(v), size), key=lambda s: sum(probs[i] for i in s))
        if sum(probs[i] for i in best) >= p - 1e-12:
            out = torch.zeros(v, dtype=torch.float64)
            out[list(best)] = probs[list(best)]
            return out / out.sum()


def test_top_p_reference_is_the_smallest_set_reaching_p():
    rng = Rng(5)
    for _ in range(40):
        probs, p = ex._random_probs(rng, 2 + rng.below(7)), (1 + rng.below(99)) / 100
        assert torch.allclose(ex.top_p_filter(probs, p), brute_top_p(probs, p), atol=1e-12)


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
        assert abs(probs.sum().item() - 1) < 1e-9 and 0 < p < 1 and probs.dtype == torch.float64
        running, waiting, budget, free, bs, m = ex.random_admit_case(rng)
        assert len(running) <= m <= budget and free >= sum(1 for n in running if n % bs == 0)
        arrival, times = ex.random_tpot_case(rng)
        assert times and times == sorted(times) and times[0] >= arrival
