"""The prefetchers: density_node by hand and against a set-based count of the rule; the candidates a fault
takes (host pages only, inside the allocation, at most device_pages - 1), seen through the pool's counters."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory import HOST, UnifiedMemory, density_node

from ..refusals import assert_refused

PS = 4096


def density_by_sets(resident, i, threshold, leaf):
    taken = set(range(i - i % leaf, min(i - i % leaf + leaf, len(resident))))
    size = 2 * leaf
    while size < 2 * max(len(resident), leaf):
        node = range(i - i % size, min(i - i % size + size, len(resident)))
        if sum(q in taken or bool(resident[q]) for q in node) > threshold * len(node):
            taken |= set(node)
        size *= 2
    return min(taken), max(taken) + 1


def test_density_node_by_hand():
    r = np.zeros(8, bool)
    assert density_node(r, 5, leaf=2) == (4, 6)
    r[:3] = True
    assert density_node(r, 3, leaf=2) == (0, 4)
    assert density_node(np.ones(8, bool), 0, leaf=1) == (0, 8)
    # 6 pages in a block of 8, leaf 2: fault at 5 takes [4, 6); the clipped node [4, 8) has 2 pages inside,
    # both taken (2 > 0.5 * 2); the root [0, 6) holds 2 resident + 2 taken = 4 > 3
    r = np.array([1, 1, 0, 0, 0, 0], bool)
    assert density_node(r, 5, 0.5, 2) == (0, 6)
    assert density_node(r, 5, 0.7, 2) == (4, 6)  # 4 > 0.7 * 6 = 4.2 fails
    assert density_node([True], 0, 0.0, 16) == (0, 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=70), st.data(), st.sampled_from([0.0, 0.25, 0.5, 0.75]),
       st.sampled_from([1, 2, 4, 16]))
def test_density_node_matches_a_set_based_count(resident, data, threshold, leaf):
    i = data.draw(st.integers(0, len(resident) - 1))
    assert density_node(np.array(resident), i, threshold, leaf) == density_by_sets(resident, i, threshold, leaf)


@pytest.mark.parametrize("args, error, message", [
    ((np.zeros(4, bool), 4), ValueError, r"i must be an int in \[0, 3\]"),
    ((np.zeros(4, bool), 1.0), TypeError, "i must be an int"),
    ((np.zeros(4, bool), 1, 1.0), ValueError, "threshold"),
    ((np.zeros(4, bool), 1, -0.1), ValueError, "threshold"),
    ((np.zeros(4, bool), 1, "0.5"), TypeError, "threshold"),
    ((np.zeros(4, bool), 1, True), TypeError, "threshold"),
    ((np.zeros(4, bool), 1, 0.5, 0), ValueError, "leaf must be a positive int"),
    ((np.zeros((2, 2), bool), 1), ValueError, "resident must be a non-empty 1-D"),
    ((np.zeros(0, bool), 0), ValueError, "resident must be a non-empty 1-D"),
])
def test_density_node_refuses_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        density_node(*args)


def test_sequential_prefetch_stays_inside_the_allocation_and_takes_host_pages_only():
    um = UnifiedMemory(64 * PS, 64 * PS, prefetch="sequential", prefetch_pages=4, block_bytes=8 * PS, leaf_bytes=PS)
    a, b = um.alloc(6 * PS), um.alloc(8 * PS)
    um.access_pages([a.first_page + 2])          # brings 2, 3, 4, 5: the allocation ends at 6
    assert um.stats.migrations == 4 and um.where(np.arange(6) + a.first_page).tolist() == [0, 0, 1, 1, 1, 1]
    um.access_pages([a.first_page + 0])          # 0, then 1 (2..4 are already there)
    assert um.stats.migrations == 6 and um.where([b.first_page]).tolist() == [HOST]


def test_a_fault_never_brings_more_than_the_device_holds():
    um = UnifiedMemory(3 * PS, 64 * PS, prefetch="sequential", prefetch_pages=10)
    a = um.alloc(20 * PS)
    um.access_pages([a.first_page])
    assert (um.stats.faults, um.stats.migrations, um.n_device) == (1, 3, 3)  # the page + device_pages - 1
    um.access_pages([a.first_page + 10])  # evicts the three, brings 10, 11, 12
    assert um.where(np.arange(13) + a.first_page).tolist() == [0] * 10 + [1] * 3 and um.stats.evictions == 3


def test_density_node_refuses_a_leaf_or_residency_that_is_not_what_it_says():
    assert_refused(lambda: density_node([True, False], 0, leaf=True), TypeError, "leaf", True, "a positive int")
    assert_refused(lambda: density_node([0.5, 2.0], 0), TypeError, "resident", [0.5, 2.0], "one bool (or 0/1)")
    assert_refused(lambda: density_node([0, 2], 0), ValueError, "resident", [0, 2], "one bool (or 0/1)")
    assert density_node([1, 0], 1, leaf=1) == (0, 2)
