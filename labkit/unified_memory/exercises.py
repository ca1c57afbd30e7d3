"""Notebook 02's exercises, defined once: the check cells (`check.exercise(fn, exercises.NAME)`) and
tests/unified_memory/test_exercises.py both use these.

    LRU_REPLAY    lru_replay(trace, n_frames) -> (faults, sorted pages on the device at the end):
                  LRU by hand; the reference is the paging engine itself (explore.replay_summary)
    DENSITY_NODE  my_density_node(resident, i, threshold, leaf) -> (start, end): CUDA's tree-based density
                  prefetch inside one block; the reference is prefetch.density_node
"""

from __future__ import annotations

import numpy as np

from ..course import Exercise
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


LRU_REPLAY = Exercise(
    name="lru_replay", reference=replay_summary,
    cases=[([1, 2, 3, 1, 4, 5, 2], 3), ([0] * 5, 1)],
    random_case=random_trace)

DENSITY_NODE = Exercise(
    name="my_density_node", reference=density_node,
    cases=[(np.array([1, 1, 1, 0, 0, 0, 0, 0], bool), 3, 0.5, 2),
           (np.array([1, 1, 0, 0, 0, 0], bool), 5, 0.5, 2)],
    random_case=random_block, n_random=30)
