"""When the link was busy, over simulated time: what UnifiedMemory.link_utilization plots (notebook 02,
section 4). The paging loop adds every fault's transfer to one float64 array:

    timeline[0]    the width of a bin, in simulated seconds
    timeline[1:]   N_BINS bins: the seconds the link was busy in [j * width, (j + 1) * width)

The number of bins is fixed whatever the length of the run (512 KiB per pool, however many faults): when a
transfer ends past the last bin, neighbouring bins merge in pairs and the width doubles, so the bins always
cover the run with a width of at most 2 x (run so far) / N_BINS. Reading it back at any other bins assumes
the busy time is spread evenly inside a bin: utilization is exact to about 4 x bins / N_BINS (6e-5 per bin
for the 1 bin of a whole run, 0.4% for 60 bins).
"""

from __future__ import annotations

import numpy as np

from .._checks import fail
from .jit import jit

N_BINS = 2**16
FIRST_WIDTH = 1e-9  # seconds: doubled as often as the run needs


def new_timeline() -> np.ndarray:
    """An empty timeline (no transfer yet)."""
    timeline = np.zeros(N_BINS + 1)
    timeline[0] = FIRST_WIDTH
    return timeline


@jit(inline=True)
def widen(timeline):
    """Merge the bins in pairs and double their width: the timeline now covers twice as long a run."""
    n_bins = len(timeline) - 1
    for j in range(n_bins // 2):
        timeline[1 + j] = timeline[1 + 2 * j] + timeline[2 + 2 * j]
    for j in range(n_bins // 2, n_bins):
        timeline[1 + j] = 0.0
    timeline[0] *= 2.0


@jit(inline=True)
def record_busy(timeline, start, end):
    """The link is busy from `start` to `end` (simulated seconds): add that to the bins it overlaps."""
    n_bins = len(timeline) - 1
    while end > timeline[0] * n_bins:
        widen(timeline)
    width = timeline[0]
    j = int(start / width)
    while j < n_bins and j * width < end:
        timeline[1 + j] += min(end, (j + 1) * width) - max(start, j * width)
        j += 1


def busy_until(timeline: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Link-busy seconds from time 0 to each of `times` (interpolated inside a bin)."""
    if not isinstance(timeline, np.ndarray) or timeline.shape != (N_BINS + 1,):
        fail("timeline", type(timeline).__name__, f"a timeline from new_timeline() (float64 [{N_BINS + 1}])", TypeError)
    times = np.asarray(times, dtype=float)
    if not np.isfinite(times).all():
        fail("times", times.tolist()[:4], "finite simulated times in seconds")
    width, busy = timeline[0], timeline[1:]
    edges = np.arange(len(busy) + 1) * width
    return np.interp(times, edges, np.concatenate([[0.0], np.cumsum(busy)]))
