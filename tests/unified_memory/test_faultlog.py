"""The logged paging loop (faultlog) is the paging loop: same counters, page tables and timeline, and its log adds
up."""

import numpy as np
import pytest

from labkit.unified_memory.faultlog import HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT

from .test_links import trace, pools


SETTINGS = [{}, {"fault_batch": 4}, {"prefetch": "sequential"}, {"prefetch": "density"}, {"eviction": "clock"}]


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_the_logged_loop_is_the_paging_loop_and_its_log_adds_up(kw):
    plain, logged = pools(**kw)
    plain.access_pages(trace())
    log = logged.access_pages_logged(trace())
    assert plain.stats == logged.stats
    assert np.array_equal(plain.pages, logged.pages) and np.array_equal(plain.frames, logged.frames)
    assert np.array_equal(plain.timeline, logged.timeline)
    rows, s = log.rows, logged.stats
    assert len(rows) == s.faults and rows[:, OPENS].sum() == s.fault_batches
    assert rows[:, PAGES_IN].sum() == s.migrations and rows[:, PAGES_OUT].sum() == s.evictions
    assert rows[:, HITS_BEFORE].sum() + log.trailing_hits == s.hits and log.bytes_moved == s.bytes_moved


def test_the_log_is_cut_in_chunks_without_a_seam(monkeypatch):
    from labkit.unified_memory import engine
    plain, logged = pools()
    monkeypatch.setattr(engine, "CHUNK", 97)  # chunk edges fall between hits and inside runs of faults
    log = logged.access_pages_logged(trace(1))
    plain.access_pages(trace(1))
    assert plain.stats == logged.stats and log.faults == plain.stats.faults
