"""Experiments, tables, plots and the widget of notebook 02, built on labkit.unified_memory.

Synthetic traces (page numbers within one allocation of n_pages):

    sequential  0 1 2 ... n-1 0 1 2 ...          a weight sweep, repeated each token
    strided     0 s 2s ... then 1 1+s ...         column access of a row-major matrix
    random      uniform over the n pages          a cache with no locality
    hot         90% of accesses to 10% of pages   a working set that fits, plus noise
"""

from __future__ import annotations

import numpy as np

from .engine import DEVICE, UnifiedMemory

KINDS = ("sequential", "strided", "random", "hot")


def synthetic_trace(kind: str, n_pages: int, length: int, seed: int = 0, stride: int = 16) -> np.ndarray:
    """A trace of `length` page numbers in [0, n_pages) of one of KINDS (see the module doc)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(n_pages, int) or n_pages < 1 or not isinstance(length, int) or length < 1:
        raise ValueError(f"n_pages and length must be positive ints, got {n_pages!r} and {length!r}")
    rng = np.random.default_rng(seed)
    if kind == "sequential":
        return np.arange(length) % n_pages
    if kind == "strided":
        order = np.concatenate([np.arange(r, n_pages, stride) for r in range(min(stride, n_pages))])
        return order[np.arange(length) % n_pages]
    if kind == "random":
        return rng.integers(0, n_pages, length)
    hot = max(1, n_pages // 10)
    return np.where(rng.random(length) < 0.9, rng.integers(0, hot, length), rng.integers(0, n_pages, length))


def replay(pages: np.ndarray, n_pages: int, device_pages: int, page_size: int = 4096, repeat: int = 1,
           **kw) -> UnifiedMemory:
    """A fresh pool with `device_pages` device frames (host: room for everything), one allocation of
    n_pages, `pages` replayed `repeat` times. Returns the pool (read .stats)."""
    um = UnifiedMemory(device_pages * page_size, n_pages * page_size, page_size=page_size, **kw)
    a = um.alloc(n_pages * page_size)
    for _ in range(repeat):
        um.access_pages(np.asarray(pages) + a.first_page)
    return um


def replay_summary(trace: list[int], n_frames: int, eviction: str = "lru") -> tuple[int, list[int]]:
    """(faults, sorted pages on the device at the end) for `trace` with `n_frames` device frames, every
    page starting on the host, no prefetch: the reference of the notebook's LRU exercise."""
    n = max(trace) + 1
    um = replay(np.array(trace, np.int64), n, n_frames, eviction=eviction)
    first = min(um.allocations)
    on_device = np.flatnonzero(um.where(np.arange(first, first + n)) == DEVICE)
    return um.stats.faults, on_device.tolist()


def policy_table(n_pages: int, device_pages: int, length: int, evictions=("lru", "clock", "fifo"),
                 prefetches=(None,), kinds=KINDS, seed: int = 0, **kw) -> list[dict]:
    """Faults and simulated time for every (trace kind, eviction, prefetch)."""
    rows = []
    for kind in kinds:
        trace = synthetic_trace(kind, n_pages, length, seed)
        for ev in evictions:
            for pf in prefetches:
                s = replay(trace, n_pages, device_pages, eviction=ev, prefetch=pf, **kw).stats
                rows.append({"trace": kind, "eviction": ev, "prefetch": str(pf), "faults": s.faults,
                             "fault_rate": s.faults / s.accesses, "time_ms": 1e3 * s.time_s})
    return rows


def oversubscription(pages, n_pages: int, fractions, page_size: int, tokens: int = 2,
                     prefetch=None, eviction: str = "lru", **kw) -> list[dict]:
    """For each fraction: a fresh pool whose device holds fraction * n_pages pages, replaying decode steps
    in order, then the last step's faults, GB moved and simulated time (earlier steps warm the pool up).
    `pages`: one step's page array, replayed `tokens` times, or a list of per-token arrays (a trace whose
    KV cache grows), replayed once each in order (`tokens` is then ignored)."""
    steps = [np.asarray(p) for p in pages] if isinstance(pages, (list, tuple)) else [np.asarray(pages)] * tokens
    rows = []
    for f in fractions:
        dev = max(1, int(round(f * n_pages)))
        um = UnifiedMemory(dev * page_size, n_pages * page_size, page_size=page_size, eviction=eviction,
                           prefetch=prefetch, **kw)
        a = um.alloc(n_pages * page_size)
        for step in steps:
            before = um.stats.as_dict()
            um.access_pages(step + a.first_page)
        after = um.stats.as_dict()
        rows.append({"fraction": f, "faults": after["faults"] - before["faults"],
                     "fault_rate": (after["faults"] - before["faults"]) / len(steps[-1]),
                     "GB_moved": (after["bytes_moved"] - before["bytes_moved"]) / 1e9,
                     "time_s": after["time_s"] - before["time_s"]})
    return rows


def replay_steps(steps, n_pages: int, device_pages: int, page_size: int = 4096,
                 **kw) -> tuple[UnifiedMemory, list[dict]]:
    """A fresh pool (device_pages frames, one allocation of n_pages) replaying per-token page arrays in
    order (a decode whose KV cache grows). Returns the pool and one row per token: accesses, faults,
    GB_moved, simulated time_s, and how it splits into link transfers (transfer_s), fault latency
    (latency_s) and device reads (device_s); link_busy = transfer_s / time_s."""
    um = UnifiedMemory(device_pages * page_size, n_pages * page_size, page_size=page_size, **kw)
    a = um.alloc(n_pages * page_size)
    rows = []
    for t, step in enumerate(steps):
        b = um.stats.as_dict()
        um.access_pages(np.asarray(step) + a.first_page)
        e = um.stats.as_dict()
        d = {k: e[k] - b[k] for k in e}
        transfer, latency = d["bytes_moved"] / um.link_bandwidth, d["faults"] * um.fault_latency
        rows.append({"token": t + 1, "accesses": d["hits"] + d["faults"], "faults": d["faults"],
                     "GB_moved": d["bytes_moved"] / 1e9, "time_s": d["time_s"], "transfer_s": transfer,
                     "latency_s": latency, "device_s": d["time_s"] - transfer - latency,
                     "link_busy": transfer / d["time_s"] if d["time_s"] else 0.0})
    return um, rows


def link_share(um: UnifiedMemory) -> dict:
    """Where simulated time went: hits (device reads), fault latency, link transfers (seconds, shares)."""
    s = um.stats
    transfer = s.bytes_moved / um.link_bandwidth
    latency = s.faults * um.fault_latency
    return {"time_s": s.time_s, "transfer_s": transfer, "latency_s": latency,
            "device_s": s.time_s - transfer - latency, "link_utilization": transfer / s.time_s if s.time_s else 0.0}


def table(rows: list[dict], digits: int = 3) -> str:
    """Rows of dicts as an aligned text table (floats rounded to `digits` significant digits)."""
    if not rows:
        return "(no rows)"
    fmt = lambda v: f"{v:.{digits}g}" if isinstance(v, float) else str(v)  # noqa: E731
    cols = list(rows[0])
    cells = [[fmt(r[c]) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, width))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
    return "\n".join(lines)


def explorer(n_pages: int = 2048, length: int = 20_000, static: bool = False):
    """Sliders for device capacity (% of n_pages), eviction, prefetch and trace kind; prints the counters of
    one replay. static=True (or no ipywidgets) prints the table for a fixed grid instead. Returns the
    widget, or the table's rows."""
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

    return w.interactive(show, capacity_pct=w.IntSlider(value=50, min=5, max=150, step=5),
                         eviction=w.Dropdown(options=["lru", "clock", "fifo"]),
                         prefetch=w.Dropdown(options=["None", "sequential", "density"]),
                         kind=w.Dropdown(options=list(KINDS)))
