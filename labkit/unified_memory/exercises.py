"""Notebook 02's exercises, defined once: the check cells (`check.exercise(fn, exercises.NAME)`) and
tests/unified_memory/test_exercises.py both use these.

    LRU_REPLAY    lru_replay(trace, n_frames) -> (faults, sorted pages on the device at the end): an int and a
                  list of ints. LRU by hand; the reference is the paging engine itself (explore.replay_summary)
    DENSITY_NODE  my_density_node(resident, i, threshold, leaf) -> (start, end): two ints. CUDA's tree-based
                  density prefetch inside one block; the reference is prefetch.density_node

Each fixed case is chosen to tell one wrong answer from the right one (the comment beside it says which), so
that the [FAIL] line names a case the learner can replay by hand; the random cases cover the rest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import is_int
from ..course import Exercise, check
from .explore import replay_summary
from .prefetch import density_node


def random_trace(rng) -> tuple[list[int], int]:
    """40 accesses over 12 pages, and 1 to 6 frames."""
    return [rng.below(12) for _ in range(40)], 1 + rng.below(6)


def random_block(rng) -> tuple[np.ndarray, int, float, int]:
    """A block of any length 1..64 (allocations that end inside the block: cut-off nodes), a third of it
    resident, a fault anywhere in it, a threshold and a leaf of 1, 2 or 4 pages."""
    n = 1 + rng.below(64)
    resident = np.array([rng.below(3) == 0 for _ in range(n)])
    return resident, rng.below(n), rng.choice([0.25, 0.5, 0.75]), 2 ** rng.below(3)


def exact_ints(got: Any, expected: Any) -> bool:
    """The answer equals the reference's and every count or page number in it is an int (numpy's included):
    6.0 faults, True, or an array of pages where a list is asked for fail."""
    if is_int(expected):
        return is_int(got) and got == expected
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(exact_ints(g, e) for g, e in zip(got, expected)))
    return check.same(got, expected)


LRU_REPLAY = Exercise(
    name="lru_replay", reference=replay_summary,
    cases=[([1, 2, 3, 1, 4, 5, 2], 3),     # (6, [2, 4, 5]): pages left unsorted ([4, 5, 2]) fail here
           ([1, 2, 2, 1, 3, 4, 1, 3], 3),  # LRU 4 faults; FIFO, clock, MRU and LFU (any tie rule) 5 faults each
           ([0] * 5, 1)],                  # one frame, one page: 1 fault
    random_case=random_trace, compare=exact_ints)

DENSITY_NODE = Exercise(
    name="my_density_node", reference=density_node,
    # (0, 4), the docstring's example: the root [0, 8) holds 4 of 8, not *more* than half (">=" takes (0, 8))
    cases=[(np.array([1, 1, 1, 0, 0, 0, 0, 0], bool), 3, 0.5, 2),
           # (0, 6): counts pages resident *or taken* (resident only: (4, 6)), and the cut-off root [0, 6)
           (np.array([1, 1, 0, 0, 0, 0], bool), 5, 0.5, 2),
           # the threshold counts: 0.75 -> (0, 2), 0.5 would give (0, 4), 0.25 -> (0, 8)
           (np.array([0, 0, 1, 0, 0, 0, 0, 0], bool), 0, 0.75, 2),
           (np.array([0, 0, 1, 0, 0, 0, 0, 0], bool), 0, 0.25, 2)],
    random_case=random_block, n_random=30, compare=exact_ints)
