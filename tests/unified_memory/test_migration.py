"""The migration machinery on its own: batched fault runs equal one fault at a time; the LRU queue
survives many rebuilds; clock gives a second chance."""
import numpy as np
import pytest

from labkit.unified_memory.migration import DEVICE, HOST
from labkit.unified_memory import UnifiedMemory
from .test_engine import Reference, agree

PS = 4096


@pytest.mark.parametrize("eviction", ["lru", "fifo", "clock"])
@pytest.mark.parametrize("device_pages", [1, 3, 64, 300, 700])
def test_batched_fault_runs_and_the_lazy_queue_match_the_page_by_page_reference(eviction, device_pages):
    # 300 and 700 resident pages: more than the 256 the lazy victim queue holds, so it is rebuilt many times;
    # clock: runs of faults go through _clock_run (one and two turns of the hand)
    rng = np.random.default_rng(device_pages)
    trace = np.concatenate([np.tile(np.arange(900), 2), rng.integers(0, 900, 1500), np.arange(899, -1, -1),
                            rng.permutation(900)])
    um = UnifiedMemory(device_pages * PS, 1000 * PS, eviction=eviction)
    ref = Reference(device_pages, 1000, eviction)
    a = um.alloc(900 * PS)
    assert ref.alloc(900) == a.first_page
    um.access_pages(trace + a.first_page)  # runs of faults go through _fault_run and _min_key_victims
    for p in (trace + a.first_page).tolist():
        ref.access(p)
    agree(um, ref)


def test_lru_victims_are_the_least_recently_used_through_queue_rebuilds():
    # recency kept by hand in an OrderedDict from the trace itself (not from the pool's keys)
    from collections import OrderedDict
    um = UnifiedMemory(1000 * PS, 5000 * PS)
    a = um.alloc(5000 * PS)
    rng = np.random.default_rng(0)
    order = OrderedDict()

    def touch(pages):
        um.access_pages(np.asarray(pages) + a.first_page)
        for q in pages:
            order.pop(q, None)
            order[q] = True
            if len(order) > 1000:
                order.popitem(last=False)

    touch(rng.permutation(1000).tolist())  # fill the device in a random order
    for step in range(50):
        touch([1000 + step])
        on_device = set(np.flatnonzero(um.where(np.arange(5000) + a.first_page) == DEVICE).tolist())
        assert on_device == set(order)
        touch(rng.choice(sorted(on_device), 30).tolist())  # refresh some pages


def test_clock_gives_a_second_chance():
    um = UnifiedMemory(3 * PS, 8 * PS, eviction="clock")
    a = um.alloc(6 * PS)
    um.access_pages(np.array([0, 1, 2, 3]) + a.first_page)  # 3 faults: all bits cleared, 0 evicted
    assert um.where([a.first_page]).tolist() == [HOST] and not um.ref[a.first_page + 1]
    um.access_pages(np.array([1, 4]) + a.first_page)        # 1 is referenced again: 2 goes, not 1
    assert um.where(np.arange(5) + a.first_page).tolist() == [HOST, DEVICE, HOST, DEVICE, DEVICE]
