"""The paging loop with a fault log (faultlog) and without one: same counters, page tables and timeline; the log
adds up, equals the page-by-page reference's fault by fault and has no seam where it is cut in chunks."""

import numpy as np
import pytest

from labkit.unified_memory import UnifiedMemory
from labkit.unified_memory.faultlog import HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT

from .reference import Reference
from .test_links import trace, pools


SETTINGS = [{}, {"fault_batch": 4}, {"prefetch": "sequential"}, {"prefetch": "density"}, {"eviction": "clock"}]


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_the_logged_loop_is_the_paging_loop_and_its_log_adds_up(kw):
    plain, logged = pools(**kw)
    plain.access_pages(trace())
    log = logged.access_pages_logged(trace())
    assert plain.stats == logged.stats
    assert np.array_equal(plain.pages, logged.pages) and np.array_equal(plain.frames, logged.frames)
    assert np.array_equal(plain.state, logged.state) and np.array_equal(plain.timeline, logged.timeline)
    rows, s = log.rows, logged.stats
    assert len(rows) == s.faults and rows[:, OPENS].sum() == s.fault_batches
    assert rows[:, PAGES_IN].sum() == s.migrations and rows[:, PAGES_OUT].sum() == s.evictions
    assert rows[:, HITS_BEFORE].sum() + log.trailing_hits == s.hits and log.bytes_moved == s.bytes_moved


def test_the_log_is_cut_in_chunks_without_a_seam(monkeypatch):
    from labkit.unified_memory import engine
    plain, logged = pools()
    whole = plain.access_pages_logged(trace(1))
    monkeypatch.setattr(engine, "CHUNK", 97)  # chunk edges fall between hits and inside runs of faults
    log = logged.access_pages_logged(trace(1))
    assert plain.stats == logged.stats and log.faults == plain.stats.faults
    assert np.array_equal(log.rows, whole.rows) and log.trailing_hits == whole.trailing_hits


@pytest.mark.parametrize("eviction", ["lru", "clock", "fifo"])
@pytest.mark.parametrize("prefetch", [None, "sequential", "density"])
@pytest.mark.parametrize("fault_batch", [1, 3])
def test_the_log_is_the_references_fault_by_fault(eviction, prefetch, fault_batch):
    um = UnifiedMemory(6 * 4096, 40 * 4096, eviction=eviction, prefetch=prefetch, prefetch_pages=3,
                       block_bytes=8 * 4096, leaf_bytes=2 * 4096, fault_batch=fault_batch)
    ref = Reference(6, 40, eviction, prefetch, 3, block_pages=8, leaf_pages=2, fault_batch=fault_batch)
    first = um.alloc(30 * 4096).first_page
    assert ref.alloc(30) == first
    pages = first + np.concatenate([np.arange(30), np.random.default_rng(5).integers(0, 30, 300), [0, 0, 1]])
    log = um.access_pages_logged(pages)
    for p in pages.tolist():
        ref.access(p)
    assert log.rows.tolist() == ref.fault_rows and log.trailing_hits == ref.hits_since_fault
    assert log.faults > 30 and log.rows[:, HITS_BEFORE].max() > 0  # faults with hits between them
    assert log.rows[:, OPENS].min() == (fault_batch == 1)  # batches of 3 hold faults that pay no latency
