"""The fault log of the paging loop (notebook 02, section 4's links): what moves at each fault, so that another
time model (links.py: several links, a monitor, a balancer) can replay the same migrations.

The paging decisions (which page faults, what the prefetcher adds, which victim goes) depend only on the order
of the accesses, never on time: so the log of one replay holds everything a link model needs.

    log row (int64 [faults, 4]):  HITS_BEFORE  hits since the previous fault (or the start of the log)
                                  OPENS        1 if the fault opened a batch (it paid the fault latency)
                                  PAGES_IN     pages migrated host -> device (the faulted page + prefetched)
                                  PAGES_OUT    victims written back device -> host

loop.replay, given a log_buffer, writes one row per fault into it; UnifiedMemory.access_pages_logged calls it
chunk by chunk (CHUNK accesses) and keeps the rows in a FaultLog.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS = 4  # a log row's values, by name:
HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT = range(COLUMNS)
CHUNK = 1 << 20  # accesses per call of loop.replay with a log: the log buffer is CHUNK rows (32 MiB)


@dataclass(frozen=True)
class FaultLog:
    """One replay's faults: `rows` int64 [faults, COLUMNS] (columns HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT),
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


def log_buffer(n: int) -> np.ndarray:
    """Rows for loop.replay's log of a chunk of n accesses (at most CHUNK): int64 [min(n, CHUNK), COLUMNS], room for
    one row per access."""
    return np.empty((min(n, CHUNK), COLUMNS), np.int64)
