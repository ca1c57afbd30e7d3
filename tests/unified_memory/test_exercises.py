"""Notebook 02's exercises: each reference passes its own check, a wrong function fails it, and the
references agree with independent solutions (an OrderedDict LRU; a set-based density count)."""
from collections import OrderedDict

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


def test_a_wrong_lru_fails():
    def fifo_replay(trace, n_frames):  # forgets to move hits to the end
        frames, faults = OrderedDict(), 0
        for p in trace:
            if p not in frames:
                faults += 1
                if len(frames) == n_frames:
                    frames.popitem(last=False)
                frames[p] = True
        return faults, sorted(frames)
    assert exercises.LRU_REPLAY.check(fifo_replay) is exercises.LRU_REPLAY.reference


def test_a_wrong_density_node_fails():
    def leaf_only(resident, i, threshold=0.5, leaf=16):
        start = i - i % leaf
        return start, min(start + leaf, len(resident))
    assert exercises.DENSITY_NODE.check(leaf_only) is exercises.DENSITY_NODE.reference


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
    assert exercises.LRU_REPLAY.reference([1, 2, 3, 1, 4, 5, 2], 3) == (6, [2, 4, 5])
    assert isinstance(exercises.random_block(Rng(0))[0], np.ndarray)
