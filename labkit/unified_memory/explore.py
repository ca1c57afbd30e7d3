"""Experiments, tables, plots and the widget of notebook 02, built on labkit.unified_memory.

Synthetic traces (page numbers within one allocation of n_pages):

    sequential  0 1 2 ... n-1 0 1 2 ...          a weight sweep, repeated each token
    strided     0 s 2s ... then 1 1+s ...         column access of a row-major matrix
    random      uniform over the n pages          a cache with no locality
    hot         90% of accesses to 10% of pages   a working set that fits, plus noise

Tables print through labkit.course.table, which writes every number in fixed point (2,217 and 0.0000403, never
2.22e+03).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_bool, check_choice, check_positive, check_positive_int, check_type, fail
from ..course import table  # noqa: F401  (fixed-point tables; notebook 02 calls ux.table)
from .engine import UnifiedMemory
from .state import DEVICE

KINDS = ("sequential", "strided", "random", "hot")
# section 4's replays of one decode step: label -> UMConfig settings (the 70B table and the loop's timing)
PAGING_SETTINGS = {"none": {}, "none, batches of 256": {"fault_batch": 256},
                   "sequential, 2 MiB": {"prefetch": "sequential", "prefetch_pages": 511},
                   "density": {"prefetch": "density"}}


def ngl_table(curves: dict[str, list], ns, share_of: str) -> list[dict]:
    """Rows for -ngl N in `ns`: ms per token of each curve of `curves` ({label: ngl_curve}) and the transfer
    share (%) of curves[share_of]."""
    if share_of not in curves:
        fail("share_of", share_of, f"one of {sorted(curves)}")
    rows = []
    for n in ns:
        row = {"-ngl": n, **{f"{label} ms": 1e3 * c[n]["time_s"] for label, c in curves.items()}}
        rows.append({**row, f"{share_of} transfer %": 100 * curves[share_of][n]["transfer_share"]})
    return rows


def synthetic_trace(kind: str, n_pages: int, length: int, seed: int = 0, stride: int = 16) -> np.ndarray:
    """A trace of `length` page numbers in [0, n_pages) of one of KINDS (see the module doc)."""
    check_choice("kind", kind, KINDS)
    check_positive_int("n_pages", n_pages, unit="pages")
    check_positive_int("length", length, unit="accesses")
    check_positive_int("stride", stride, unit="pages")
    rng = np.random.default_rng(check_positive_int("seed", seed, allow_zero=True))
    if kind == "sequential":
        return np.arange(length) % n_pages
    if kind == "strided":
        order = np.concatenate([np.arange(r, n_pages, stride) for r in range(min(stride, n_pages))])
        return order[np.arange(length) % n_pages]
    if kind == "random":
        return rng.integers(0, n_pages, length)
    hot = max(1, n_pages // 10)
    return np.where(rng.random(length) < 0.9, rng.integers(0, hot, length), rng.integers(0, n_pages, length))


def distinct_pages(pages) -> int:
    """How many different pages `pages` (numbers >= 0) touches: the working set of a trace. A bitmap, O(n):
    np.unique sorts, which takes half a minute on a 70B step."""
    pages = np.asarray(pages)
    if pages.ndim == 1 and not len(pages):
        return 0
    if pages.ndim != 1 or not np.issubdtype(pages.dtype, np.integer) or pages.min() < 0:
        fail("pages", f"an array of {pages.dtype}, shape {pages.shape}", "a 1-D array of page numbers >= 0")
    seen = np.zeros(int(pages.max()) + 1, bool)
    seen[pages] = True
    return int(seen.sum())


def fresh_pool(n_pages: int, device_pages: int, page_size: int = 4096, **settings):
    """(pool, allocation): a pool of `device_pages` device frames whose host holds all n_pages, and one
    allocation of n_pages on it, every page starting on the host. `settings`: UMConfig's."""
    n_pages = check_positive_int("n_pages", n_pages, unit="pages")
    device_pages = check_positive_int("device_pages", device_pages, unit="pages")
    page_size = check_positive_int("page_size", page_size, unit="bytes")
    um = UnifiedMemory(device_pages * page_size, n_pages * page_size, page_size=page_size, **settings)
    return um, um.alloc(n_pages * page_size)


def replay(pages, n_pages: int, device_pages: int, page_size: int = 4096, repeat: int = 1,
           **settings) -> UnifiedMemory:
    """A fresh pool (fresh_pool), `pages` (numbers within the allocation) replayed `repeat` times. Returns
    the pool (read .stats)."""
    repeat = check_positive_int("repeat", repeat)
    um, allocation = fresh_pool(n_pages, device_pages, page_size, **settings)
    for _ in range(repeat):
        um.access_pages(np.asarray(pages) + allocation.first_page)
    return um


def replay_summary(trace: list[int], n_frames: int, eviction: str = "lru") -> tuple[int, list[int]]:
    """(faults, sorted pages on the device at the end) for `trace` (page numbers >= 0) with `n_frames` device
    frames, every page starting on the host, no prefetch: the reference of the notebook's LRU exercise."""
    pages = np.asarray(trace)
    if pages.ndim != 1 or not len(pages):
        fail("trace", trace, "a non-empty list of page numbers")
    n = int(pages.max()) + 1
    um = replay(pages, n, n_frames, eviction=eviction)
    on_device = np.flatnonzero(um.where(np.arange(n) + min(um.allocations)) == DEVICE)
    return um.stats.faults, on_device.tolist()


def policy_table(n_pages: int, device_pages: int, length: int, evictions=("lru", "clock", "fifo"),
                 prefetches=(None,), kinds=KINDS, seed: int = 0, **settings) -> list[dict]:
    """Faults and simulated time for every (trace kind, eviction, prefetch)."""
    rows = []
    for kind in kinds:
        trace = synthetic_trace(kind, n_pages, length, seed)
        for ev in evictions:
            for pf in prefetches:
                s = replay(trace, n_pages, device_pages, eviction=ev, prefetch=pf, **settings).stats
                rows.append({"trace": kind, "eviction": ev, "prefetch": str(pf), "faults": s.faults,
                             "fault_rate": s.faults / s.accesses, "time_ms": 1e3 * s.time_s})
    return rows


def replay_steps(steps, n_pages: int, device_pages: int, page_size: int = 4096,
                 **settings) -> tuple[UnifiedMemory, list[dict]]:
    """A fresh pool (fresh_pool) replaying per-token page arrays in order (a decode whose KV cache grows).
    Returns the pool and one row per token: accesses, faults, fault batches, GB_moved, simulated time_s,
    and how it splits into link transfers (transfer_s), fault latency (latency_s, once per batch of faults)
    and device reads (device_s); link_busy = transfer_s / time_s."""
    if isinstance(steps, (str, bytes, np.ndarray)) or not hasattr(steps, "__iter__"):
        fail("steps", steps, "a list of per-token page arrays", TypeError)
    um, allocation = fresh_pool(n_pages, device_pages, page_size, **settings)
    rows = []
    for token, step in enumerate(steps):
        before = um.stats.as_dict()
        um.access_pages(np.asarray(step) + allocation.first_page)
        d = {k: v - before[k] for k, v in um.stats.as_dict().items()}
        transfer = d["bytes_moved"] / um.config.link_bandwidth
        latency = d["fault_batches"] * um.config.fault_latency
        rows.append({"token": token + 1, "accesses": d["hits"] + d["faults"], "faults": d["faults"],
                     "batches": d["fault_batches"], "GB_moved": d["bytes_moved"] / 1e9, "time_s": d["time_s"],
                     "transfer_s": transfer, "latency_s": latency, "device_s": d["time_s"] - transfer - latency,
                     "link_busy": transfer / d["time_s"] if d["time_s"] else 0.0})
    return um, rows


def oversubscription(pages, n_pages: int, fractions, page_size: int, tokens: int = 2, **settings) -> list[dict]:
    """For each fraction: a fresh pool whose device holds fraction * n_pages pages replays the decode steps
    in order (replay_steps; earlier steps warm the pool up); one row with the last step's faults,
    fault_rate, GB moved and simulated time. `pages`: one step's page array, replayed `tokens` times, or a
    list of per-token arrays (a trace whose KV cache grows), replayed once each (`tokens` is then ignored)."""
    check_positive_int("n_pages", n_pages, unit="pages")
    steps = list(pages) if isinstance(pages, (list, tuple)) else [np.asarray(pages)] * check_positive_int(
        "tokens", tokens)
    if not steps or any(np.asarray(step).size == 0 for step in steps):
        fail("pages", pages, "one step's non-empty page array, or a non-empty list of them")
    if isinstance(fractions, (str, bytes)) or not hasattr(fractions, "__iter__"):
        fail("fractions", fractions, "a list of device sizes as fractions of n_pages", TypeError)
    fractions = list(fractions)
    if not fractions:
        fail("fractions", fractions, "a non-empty list of device sizes as fractions of n_pages")
    rows = []
    for i, fraction in enumerate(fractions):
        device_pages = max(1, int(round(check_positive(f"fractions[{i}]", fraction) * n_pages)))
        last = replay_steps(steps, n_pages, device_pages, page_size, **settings)[1][-1]
        rows.append({"fraction": fraction, "faults": last["faults"], "fault_rate": last["faults"] / last["accesses"],
                     "GB_moved": last["GB_moved"], "time_s": last["time_s"]})
    return rows


def link_share(um: UnifiedMemory) -> dict:
    """Where simulated time went: hits (device reads), fault latency (once per batch), link transfers
    (seconds, shares)."""
    s = check_type("um", um, UnifiedMemory, "a UnifiedMemory").stats
    transfer = s.bytes_moved / um.config.link_bandwidth
    latency = s.fault_batches * um.config.fault_latency
    return {"time_s": s.time_s, "transfer_s": transfer, "latency_s": latency,
            "device_s": s.time_s - transfer - latency, "link_utilization": transfer / s.time_s if s.time_s else 0.0}


def explorer(n_pages: int = 2048, length: int = 20_000, static: bool = False):
    """Sliders for device capacity (% of n_pages), eviction, prefetch and trace kind; prints the counters of
    one replay. static=True (or no ipywidgets) prints the table for a fixed grid instead. Returns the
    widget, or the table's rows."""
    check_positive_int("n_pages", n_pages, unit="pages")
    check_positive_int("length", length, unit="accesses")
    check_bool("static", static)
    def run(capacity_pct=50, eviction="lru", prefetch="None", kind="sequential"):
        trace = synthetic_trace(kind, n_pages, length)
        dev = max(1, n_pages * capacity_pct // 100)
        s = replay(trace, n_pages, dev, eviction=eviction, prefetch=None if prefetch == "None" else prefetch).stats
        return {"capacity_pct": capacity_pct, "eviction": eviction, "prefetch": prefetch, "trace": kind,
                "hits": s.hits, "faults": s.faults, "GB_moved": s.bytes_moved / 1e9, "time_ms": 1e3 * s.time_s}

    if not static:
        try:
            import ipywidgets as w
        except ImportError:
            static = True
    if static:
        rows = [run(c, "lru", p, k) for k in ("sequential", "random") for c in (50, 100)
                for p in ("None", "density")]
        print(table(rows))
        return rows

    def show(**kw):
        print(table([run(**kw)]))

    wide = {"description_width": "initial"}  # the whole label, not "capacity_..."
    return w.interactive(show, capacity_pct=w.IntSlider(value=50, min=5, max=150, step=5,
                                                        description="device capacity (% of the pages)", style=wide),
                         eviction=w.Dropdown(options=["lru", "clock", "fifo"], description="eviction", style=wide),
                         prefetch=w.Dropdown(options=["None", "sequential", "density"], description="prefetch",
                                             style=wide),
                         kind=w.Dropdown(options=list(KINDS), description="trace", style=wide))
