"""The paging loop with a log of its faults (notebook 02, section 4's links): what moves at each fault, so
that another time model (links.py: several links, a monitor, a balancer) can replay the same migrations.

The paging decisions (which page faults, what the prefetcher adds, which victim goes) depend only on the order
of the accesses, never on time: so the log of one replay holds everything a link model needs.

    log row (int64 [faults, 4]):  HITS_BEFORE  hits since the previous fault (or the start of the log)
                                  OPENS        1 if the fault opened a batch (it paid the fault latency)
                                  PAGES_IN     pages migrated host -> device (the faulted page + prefetched)
                                  PAGES_OUT    victims written back device -> host

`replay_logged` is loop.replay with the log written: the same helpers (load_page, prefetch_candidates), the
same counters and simulated time, the same link timeline; UnifiedMemory.access_pages_logged calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .jit import jit
from .loop import load_page
from .policies import touch
from .prefetch import prefetch_candidates
from .state import DEVICE, FAULT_ID, FRAME, IN_BATCH, TICK, TIER
from .timeline import record_busy

HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT = range(4)


@dataclass(frozen=True)
class FaultLog:
    """One replay's faults: `rows` int64 [faults, 4] (columns HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT),
    `trailing_hits` after the last fault, and the pool's page_size (bytes), hit_s and fault_latency (s)."""
    rows: np.ndarray
    trailing_hits: int
    page_size: int
    hit_s: float
    fault_latency: float

    @property
    def faults(self) -> int:
        return len(self.rows)

    @property
    def bytes_moved(self) -> int:
        """Bytes over the link(s): every page in and every page out."""
        return int(self.rows[:, PAGES_IN].sum() + self.rows[:, PAGES_OUT].sum()) * self.page_size


@jit
def replay_logged(trace, pages, frames, block_end, state, rules, costs, time_s, timeline, prefetched, counts,
                  log, hits_before):
    """loop.replay, and one row of `log` per fault (as many rows as `trace` has accesses, at most).
    hits_before: hits since the last fault before this trace. Returns (hits, faults, fault batches, migrations,
    evictions, time_s at the end, hits after the last fault)."""
    hits = faults = batches = migrations = evictions = 0
    n_frames = len(frames)
    for page in trace:
        state[TICK] += 1
        tick = state[TICK]
        if pages[page, TIER] == DEVICE:                      # a hit
            hits += 1
            hits_before += 1
            touch(pages[page, FRAME], tick, rules.eviction, frames, state)
            time_s += costs.hit_s
            state[IN_BATCH] = 0
            continue
        opens = 0                                            # a fault
        if state[IN_BATCH] % rules.fault_batch == 0:
            opens = 1
            batches += 1
            time_s += costs.fault_latency
        state[IN_BATCH] += 1
        n_prefetched = prefetch_candidates(page, pages, block_end, rules, n_frames - 1, counts, prefetched)
        state[FAULT_ID] += 1
        evicted = load_page(page, tick, pages, frames, state, rules.eviction)
        for extra_page in prefetched[:n_prefetched]:
            evicted += load_page(extra_page, tick, pages, frames, state, rules.eviction)
        log[faults, 0] = hits_before
        log[faults, 1] = opens
        log[faults, 2] = 1 + n_prefetched
        log[faults, 3] = evicted
        hits_before = 0
        faults += 1
        migrations += 1 + n_prefetched
        evictions += evicted
        busy = (1 + n_prefetched + evicted) * costs.page_size / costs.link_bandwidth
        record_busy(timeline, time_s, time_s + busy)
        time_s += busy
    return hits, faults, batches, migrations, evictions, time_s, hits_before


CHUNK = 1 << 20  # accesses per call of replay_logged: the log buffer is CHUNK rows (32 MiB)


def log_buffer(n: int) -> np.ndarray:
    """Scratch rows for replay_logged on a chunk of n accesses."""
    return np.empty((min(n, CHUNK), 4), np.int64)
