"""Notebook 02's exercises: each reference passes its own check, the wrong answers a learner is likely to write
fail it on a fixed case that the [FAIL] line names together with the first differing value, and the references
agree with independent solutions (an OrderedDict LRU; a set-based density count)."""
from collections import Counter, OrderedDict

import numpy as np
import pytest

from labkit.rng import Rng
from labkit.unified_memory import exercises

from .reference import lru_by_hand
from .test_prefetch import density_by_sets

EXERCISES = [exercises.LRU_REPLAY, exercises.DENSITY_NODE]


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_the_reference_passes_its_own_check(ex, capsys):
    def learner(*args):
        return ex.reference(*args)
    assert ex.check(learner) is learner
    assert "[PASS]" in capsys.readouterr().out


def replay_with(victim):
    """An LRU-shaped learner whose victim rule is `victim(frames, uses, now)`; frames: page -> arrival tick."""
    def learner(trace, n_frames):
        frames, last, uses, faults = {}, {}, Counter(), 0
        for now, p in enumerate(trace):
            uses[p] += 1
            if p not in frames:
                faults += 1
                if len(frames) == n_frames:
                    del frames[victim(frames, last, uses)]
                frames[p] = now
            last[p] = now
        return faults, sorted(frames)
    return learner


fifo = replay_with(lambda frames, last, uses: min(frames, key=frames.get))           # forgets hits
mru = replay_with(lambda frames, last, uses: max(frames, key=last.get))              # the newest goes
lfu = replay_with(lambda frames, last, uses: min(frames, key=lambda q: (uses[q], q)))  # the least used goes


def clock(trace, n_frames):
    """Second chance, written by hand: a learner who wrote clock instead of LRU."""
    slots, bits, hand, faults = [None] * n_frames, [0] * n_frames, 0, 0
    for p in trace:
        if p in slots:
            bits[slots.index(p)] = 1
            continue
        faults += 1
        while slots[hand] is not None and bits[hand]:
            bits[hand], hand = 0, (hand + 1) % n_frames
        slots[hand], bits[hand], hand = p, 1, (hand + 1) % n_frames
    return faults, sorted(q for q in slots if q is not None)


def unsorted(trace, n_frames):  # right LRU, pages in recency order
    frames, faults = OrderedDict(), 0
    for p in trace:
        if p in frames:
            frames.move_to_end(p)
            continue
        faults += 1
        if len(frames) == n_frames:
            frames.popitem(last=False)
        frames[p] = True
    return faults, list(frames)


def float_faults(trace, n_frames):
    faults, pages = lru_by_hand(trace, n_frames)
    return float(faults), pages


def pages_as_array(trace, n_frames):
    faults, pages = lru_by_hand(trace, n_frames)
    return faults, np.array(pages)


def verdict_of(ex, fn, capsys) -> str:
    """The one [FAIL] line of checking `fn` under the name the notebook gives it (the exercise's name)."""
    def learner(*args):
        return fn(*args)
    learner.__name__ = ex.name
    assert ex.check(learner) is ex.reference
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] ") and out.count("\n") == 1, out
    return out


DISTINGUISHING = "lru_replay([1, 2, 2, 1, 3, 4, 1, 3], 3) returned as value 1 of 2: 5, not the answer for this case."


@pytest.mark.parametrize("wrong, expected", [
    (fifo, DISTINGUISHING), (clock, DISTINGUISHING),
    (mru, "lru_replay([1, 2, 3, 1, 4, 5, 2], 3) returned as value 1 of 2: 5, not the answer for this case."),
    (lfu, "lru_replay([1, 2, 3, 1, 4, 5, 2], 3) returned as value 2 of 2: as value 1 of 3: 1, "
          "not the answer for this case."),
    (unsorted, "lru_replay([1, 2, 3, 1, 4, 5, 2], 3) returned as value 2 of 2: as value 1 of 3: 4, "
               "not the answer for this case."),
    (float_faults, "lru_replay([1, 2, 3, 1, 4, 5, 2], 3) returned (6.0, [2, 4, 5]), expected (6, [2, 4, 5])."),
    (pages_as_array, "lru_replay([1, 2, 3, 1, 4, 5, 2], 3) returned as value 2 of 2: array(shape [3], int64)"),
], ids=["fifo", "clock", "mru", "lfu", "unsorted", "float-faults", "array-of-pages"])
def test_a_wrong_lru_fails_on_a_fixed_case_it_names(wrong, expected, capsys):
    line = verdict_of(exercises.LRU_REPLAY, wrong, capsys)
    assert expected in line, line


def test_the_distinguishing_case_tells_the_policies_apart():
    """Independently of the check: the second fixed case has LRU at 4 faults and every other policy at 5."""
    case = exercises.LRU_REPLAY.cases[1]
    assert lru_by_hand(*case) == exercises.LRU_REPLAY.reference(*case) == (4, [1, 3, 4])
    for wrong in (fifo, clock, mru, lfu):
        assert wrong(*case)[0] == 5
    for ev in ("fifo", "clock"):
        assert exercises.replay_summary(*case, eviction=ev)[0] == 5


def density_with(rule):
    """A density learner whose node test is rule(count, threshold, size)."""
    def learner(resident, i, threshold=0.5, leaf=16):
        n = len(resident)
        start = i - i % leaf
        end = min(start + leaf, n)
        size = 2 * leaf
        while size < 2 * max(n, leaf):
            a = i - i % size
            b = min(a + size, n)
            if rule(sum(1 for q in range(a, b) if resident[q] or start <= q < end), threshold, b - a):
                start, end = a, b
            size *= 2
        return start, end
    return learner


def resident_only(resident, i, threshold=0.5, leaf=16):
    """Counts resident pages only, not those the fault already takes."""
    n, start = len(resident), i - i % leaf
    end, size = min(start + leaf, n), 2 * leaf
    while size < 2 * max(n, leaf):
        a = i - i % size
        b = min(a + size, n)
        if sum(bool(resident[q]) for q in range(a, b)) > threshold * (b - a):
            start, end = a, b
        size *= 2
    return start, end


def float_bounds(resident, i, threshold=0.5, leaf=16):
    start, end = exercises.density_node(resident, i, threshold, leaf)
    return float(start), float(end)


BLOCK = "array(shape [8], bool) [False, False, True, False, False, False, False, False]"


@pytest.mark.parametrize("wrong, expected", [
    (density_with(lambda count, threshold, size: count > 0.5 * size),  # ignores the threshold
     f"my_density_node({BLOCK}, 0, 0.75, 2) returned as value 2 of 2: 4, not the answer for this case."),
    (density_with(lambda count, threshold, size: count >= threshold * size),  # "at least" for "more than"
     f"my_density_node({BLOCK.replace('False, False, True', 'True, True, True')}, 3, 0.5, 2) "
     "returned as value 2 of 2: 8, not the answer for this case."),
    (resident_only,
     "my_density_node(array(shape [6], bool) [True, True, False, False, False, False], 5, 0.5, 2) "
     "returned as value 1 of 2: 4, not the answer for this case."),
    (float_bounds, "returned (0.0, 4.0), expected (0, 4)."),
], ids=["ignores-threshold", "at-least", "resident-only", "float-bounds"])
def test_a_wrong_density_node_fails_on_a_fixed_case_it_names(wrong, expected, capsys):
    line = verdict_of(exercises.DENSITY_NODE, wrong, capsys)
    assert expected in line, line


def test_a_leaf_only_density_node_fails(capsys):
    def leaf_only(resident, i, threshold=0.5, leaf=16):
        start = i - i % leaf
        return start, min(start + leaf, len(resident))
    assert f"my_density_node({BLOCK.replace('False, False, True', 'True, True, True')}, 3, 0.5, 2) returned as " \
           "value 1 of 2: 2, not the answer for this case." in verdict_of(exercises.DENSITY_NODE, leaf_only, capsys)


def test_exact_ints_wants_ints_where_the_reference_has_them():
    assert exercises.exact_ints((np.int64(4), [1, 3]), (4, [1, 3]))
    assert exercises.exact_ints([4, (1, 3)], (4, [1, 3]))
    for wrong in ((4.0, [1, 3]), (True, [1]), (4, [1.0, 3]), (4, np.array([1, 3])), (4, [1, 3, 5]), 4, (4, {1, 3})):
        assert not exercises.exact_ints(wrong, (4, [1, 3])), wrong
    assert exercises.exact_ints(0.5, 0.5) and not exercises.exact_ints(0.6, 0.5)


def test_the_references_agree_with_independent_solutions():
    rng = Rng(5)
    for _ in range(50):
        trace, frames = exercises.random_trace(rng)
        assert exercises.LRU_REPLAY.reference(trace, frames) == lru_by_hand(trace, frames)
        resident, i, threshold, leaf = exercises.random_block(rng)
        assert exercises.DENSITY_NODE.reference(resident, i, threshold, leaf) == \
            density_by_sets(resident.tolist(), i, threshold, leaf)
    for case in exercises.LRU_REPLAY.cases:
        assert exercises.LRU_REPLAY.reference(*case) == lru_by_hand(*case)
    for case in exercises.DENSITY_NODE.cases:
        assert exercises.DENSITY_NODE.reference(*case) == density_by_sets(case[0].tolist(), *case[1:])
    assert exercises.LRU_REPLAY.reference([1, 2, 3, 1, 4, 5, 2], 3) == (6, [2, 4, 5])
    assert isinstance(exercises.random_block(Rng(0))[0], np.ndarray)
