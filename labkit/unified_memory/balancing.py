"""Notebook 02's load-balancing experiment: the 70B replay's steady token over one link, two links with a
static split and two links with the monitor-driven balancer (links.py).

The two links are PCIe 4.0 x16 at the simulator's 25 GB/s each, and each carries other traffic (another
device's DMA, a NIC, storage) in turns: link A is busy `busy` of its bandwidth during the first half of every
`period_s`, link B during the second half. Nothing in the paging changes: the same FaultLog is replayed
over each arrangement. Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_number, check_positive, fail
from .explore import fresh_pool
from .faultlog import FaultLog
from .links import Link, simulate


def last_token_log(steps, n_pages: int, device_pages: int, page_size: int = 4096, **settings) -> FaultLog:
    """Replay the per-token page arrays `steps` on a fresh pool (explore.fresh_pool), and return the fault log
    of the last token (the steady state; the earlier tokens warm the pool)."""
    if isinstance(steps, (str, bytes, np.ndarray)) or not hasattr(steps, "__len__") or not len(steps):
        fail("steps", steps, "a non-empty list of per-token page arrays", TypeError)
    um, allocation = fresh_pool(n_pages, device_pages, page_size, **settings)
    for step in steps[:-1]:
        um.access_pages(np.asarray(step) + allocation.first_page)
    return um.access_pages_logged(np.asarray(steps[-1]) + allocation.first_page)


def two_links(bandwidth: float = 25e9, busy: float = 0.6, period_s: float = 2.0) -> list[Link]:
    """Two equal links whose other traffic takes `busy` of one of them at a time, in turns every period_s / 2."""
    bandwidth = check_positive("bandwidth", bandwidth, unit="bytes/s")
    busy = check_number("busy", busy, 0.0, 1.0, high_open=True)
    period = check_positive("period_s", period_s, unit="s")
    return [Link("PCIe A", bandwidth, busy, period, 0.0, period / 2),
            Link("PCIe B", bandwidth, busy, period, period / 2, period)]


def compare(log: FaultLog, links: list[Link], window_s: float = 0.05) -> list[dict]:
    """One row per arrangement: links[0] alone, the static 50/50 split over all links, the balancer. Each row:
    time_s, transfer_s, latency_s, the share of pages per link and each link's busy share (migrations alone)."""
    arrangements = {"one link": (links[:1], "single", None),
                    "static 50/50": (links, "static", [1.0] * len(links)),
                    "balanced": (links, "balanced", None)}
    rows, runs = [], {}
    for label, (used, route, shares) in arrangements.items():
        r = runs[label] = simulate(log, used, route, shares, window_s)
        rows.append({"links": label, "time_s": r["time_s"], "transfer_s": r["transfer_s"],
                     "latency_s": r["latency_s"],
                     "pages_A": r["shares"][0], "busy_A": r["link_busy"][0],
                     "busy_B": r["link_busy"][1] if len(r["link_busy"]) > 1 else 0.0})
    return rows, runs
