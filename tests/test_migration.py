"""The migration machinery on its own: batched fault runs equal one fault at a time; the LRU queue
survives many rebuilds; clock gives a second chance."""
import numpy as np
import pytest

from labkit.migration import DEVICE, HOST
from labkit.unified_memory import UnifiedMemory

PS = 4096


@pytest.mark.parametrize("eviction", ["lru", "fifo"])
@pytest.mark.parametrize("device_pages", [1, 3, 64, 300])
def test_a_batched_fault_run_equals_one_fault_per_call(eviction, device_pages):
    rng = np.random.default_rng(device_pages)
    trace = np.concatenate([np.tile(np.arange(500), 2), rng.integers(0, 500, 2000), np.arange(499, -1, -1)])
    batched, single = (UnifiedMemory(device_pages * PS, 600 * PS, eviction=eviction) for _ in range(2))
    a, b = batched.alloc(500 * PS), single.alloc(500 * PS)
    batched.access_pages(trace + a.first_page)  # runs of faults go through _fault_run
    for p in trace + b.first_page:
        single.access_pages(np.array([p]))      # every fault through _fault
    sb, ss = batched.stats.as_dict(), single.stats.as_dict()
    assert sb.pop("time_s") == pytest.approx(ss.pop("time_s"), rel=1e-12) and sb == ss
    assert np.array_equal(batched.where(np.arange(500) + a.first_page), single.where(np.arange(500) + b.first_page))
    assert np.allclose(batched.fault_times, single.fault_times, rtol=1e-12, atol=0)
    assert np.allclose(batched.fault_busy, single.fault_busy, rtol=1e-12, atol=0)


def test_lru_victims_are_the_least_recently_used_through_queue_rebuilds():
    um = UnifiedMemory(1000 * PS, 5000 * PS)
    a = um.alloc(5000 * PS)
    rng = np.random.default_rng(0)
    um.access_pages(rng.permutation(1000) + a.first_page)  # fill the device in a random order
    for step in range(50):
        before = set(np.flatnonzero(um.where(np.arange(5000) + a.first_page) == DEVICE).tolist())
        oldest = min(before, key=lambda q: (um.last_use[q + a.first_page], q))
        um.access_pages(np.array([1000 + step]) + a.first_page)
        after = set(np.flatnonzero(um.where(np.arange(5000) + a.first_page) == DEVICE).tolist())
        assert before - after == {oldest} and after - before == {1000 + step}
        um.access_pages(rng.choice(sorted(after), 30) + a.first_page)  # refresh some pages


def test_clock_gives_a_second_chance():
    um = UnifiedMemory(3 * PS, 8 * PS, eviction="clock")
    a = um.alloc(6 * PS)
    um.access_pages(np.array([0, 1, 2, 3]) + a.first_page)  # 3 faults: all bits cleared, 0 evicted
    assert um.where([a.first_page]).tolist() == [HOST] and not um.ref[a.first_page + 1]
    um.access_pages(np.array([1, 4]) + a.first_page)        # 1 is referenced again: 2 goes, not 1
    assert um.where(np.arange(5) + a.first_page).tolist() == [HOST, DEVICE, HOST, DEVICE, DEVICE]
