"""Several links between host and device, a monitor that measures each link's utilization over windows, and a
balancer that routes migrations by it (notebook 02, section 4: the source material's "bandwidth monitoring with
load balancing"). It replays a FaultLog (faultlog.py): the paging loop decides what moves, this decides when.

    fault i:  hits before it (device reads) -> latency if it opens a batch -> its pages, split over the links
              link 0  |=====pages a=====|                 each link moves its share at the bandwidth left
              link 1  |===pages b===|   .                 over by its other traffic; the fault ends when
                                        ^ next access     the last share arrives (no overlap, as in loop.py)

A Link may carry other traffic (another GPU, a NIC, storage): during [on_start, on_end) of every period_s it
takes `busy` of the link's bandwidth, and migrations get the rest. Routes:
  * "single":   every page over links[0] (the others idle);
  * "static":   a fixed share of each fault's pages per link (`shares`; default: by nominal bandwidth);
  * "balanced": the monitor counts the bytes each link carried in every window of `window_s`; at a fault the
                balancer takes the last complete window, subtracts its own bytes to estimate the other traffic,
                and splits the pages in proportion to the bandwidth left: B * (1 - other traffic's share), that share
                rounded to 1e-9 (a counter's precision: equal links stay exactly equal).
Pages are whole: a share of n pages is rounded by largest remainder. With one link and no other traffic
the time equals UnifiedMemory's (tests check it). Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_choice, check_number, check_positive, check_type, fail
from .jit import jit
from .faultlog import HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT, FaultLog

ROUTES = ("single", "static", "balanced")
MAX_WINDOWS = 1_000_000
"""The most monitor windows `simulate` keeps (its bound on the run's time over window_s): 8 MB of counters per link."""


@jit(inline=True)
def _on_time(t, period, on_start, on_end):
    """Seconds of the other traffic's on-phase in [0, t)."""
    whole = math.floor(t / period)
    rest = t - whole * period
    return whole * (on_end - on_start) + min(max(rest - on_start, 0.0), on_end - on_start)


@jit(inline=True)
def _background(a, b, bandwidth, busy, period, on_start, on_end):
    """Bytes the other traffic moves in [a, b)."""
    if busy == 0.0 or on_end == on_start:
        return 0.0
    return bandwidth * busy * (_on_time(b, period, on_start, on_end) - _on_time(a, period, on_start, on_end))


@jit(inline=True)
def _finish(start, nbytes, bandwidth, busy, period, on_start, on_end):
    """When a transfer of nbytes starting at `start` ends, taking all the bandwidth the other traffic leaves."""
    if nbytes <= 0:
        return start
    if busy == 0.0 or on_end == on_start:
        return start + nbytes / bandwidth
    whole = math.floor(start / period)
    target = bandwidth * (start - whole * period) - _background(whole * period, start, bandwidth, busy, period,
                                                                 on_start, on_end) + nbytes
    per_period = bandwidth * period - bandwidth * busy * (on_end - on_start)
    extra = math.floor(target / per_period)
    rest = target - extra * per_period                    # bytes into period whole + extra
    before_on, during_on = bandwidth * on_start, bandwidth * (1 - busy) * (on_end - on_start)
    if rest <= before_on:
        local = rest / bandwidth
    elif rest <= before_on + during_on:
        local = on_start + (rest - before_on) / (bandwidth * (1 - busy))
    else:
        local = on_end + (rest - before_on - during_on) / bandwidth
    return (whole + extra) * period + local


@dataclass(frozen=True)
class Link:
    """A link of `bandwidth` bytes/s; other traffic takes `busy` of it during [on_start, on_end) s of every
    period_s seconds (busy=0: the link is the pool's alone)."""
    name: str
    bandwidth: float
    busy: float = 0.0
    period_s: float = 1.0
    on_start: float = 0.0
    on_end: float = 0.0

    def __post_init__(self):
        check_type("name", self.name, str)
        check_positive("bandwidth", self.bandwidth, unit="bytes/s")
        check_number("busy", self.busy, 0.0, 1.0, high_open=True)
        period = check_positive("period_s", self.period_s, unit="s")
        check_number("on_start", self.on_start, 0.0, period, unit="s")
        check_number("on_end", self.on_end, self.on_start, period, unit="s")

    def _params(self) -> tuple:
        return self.bandwidth, self.busy, self.period_s, self.on_start, self.on_end

    def background_bytes(self, a: float, b: float) -> float:
        """Bytes the other traffic moves in [a, b) (seconds)."""
        return float(_background(float(a), float(b), *self._params()))

    def free_bytes(self, a: float, b: float) -> float:
        """Bytes migrations can move in [a, b): the bandwidth minus the other traffic's."""
        return self.bandwidth * (b - a) - self.background_bytes(a, b)

    def finish(self, start: float, nbytes: float) -> float:
        """When a transfer of `nbytes` that starts at `start` (s) ends (it takes all the bandwidth left over)."""
        return float(_finish(float(start), float(nbytes), *self._params()))


@jit(inline=True)
def _split(n, weights, out):
    """n whole pages in proportion to `weights` into `out`, by largest remainder (ties to the lower link)."""
    total = weights.sum()
    short = n
    for i in range(len(weights)):
        out[i] = int(math.floor(n * weights[i] / total))
        short -= out[i]
    for _ in range(short):
        best, best_rest = 0, -1.0
        for i in range(len(weights)):
            rest = n * weights[i] / total - out[i]
            if rest > best_rest + 1e-12:
                best, best_rest = i, rest
        out[best] += 1


@jit
def _run(rows, trailing_hits, hit_s, fault_latency, page, params, route, fixed, window, own, moved, counts, weights):
    """The loop of `simulate` over the log's rows: params float [links, 5] (bandwidth, busy, period, on_start,
    on_end); route 0 single, 1 static (fixed shares), 2 balanced; own [links, windows]: the monitor's counters
    of migration bytes; moved (bytes per link, out), counts and weights: scratch [links]. Returns (time_s,
    transfer_s, latency_s). Compiled without allocations (jit.py), so the caller owns every array."""
    n_links = params.shape[0]
    t = transfer = latency = 0.0
    for f in range(rows.shape[0]):
        t += rows[f, 0] * hit_s
        if rows[f, 1]:
            t += fault_latency
            latency += fault_latency
        n = rows[f, 2] + rows[f, 3]
        if route == 0:
            counts[:] = 0
            counts[0] = n
        elif route == 1:
            _split(n, fixed, counts)
        else:
            last = int(math.floor(t / window)) - 1               # the last complete window
            for i in range(n_links):
                bw = params[i, 0]
                weights[i] = bw
                if last >= 0:                                    # measured share - own share = other traffic
                    a = last * window
                    measured = (own[i, last] + _background(a, a + window, bw, params[i, 1], params[i, 2],
                                                           params[i, 3], params[i, 4])) / (bw * window)
                    other = round((measured - own[i, last] / (bw * window)) * 1e9) / 1e9  # counters' precision
                    weights[i] = bw * max(1.0 - other, 0.0)
            if weights.sum() <= 0:
                for i in range(n_links):
                    weights[i] = params[i, 0]
            _split(n, weights, counts)
        end = t
        for i in range(n_links):
            if counts[i] == 0:
                continue
            bw, busy, period, on_start, on_end = params[i, 0], params[i, 1], params[i, 2], params[i, 3], params[i, 4]
            finish = _finish(t, counts[i] * page, bw, busy, period, on_start, on_end)
            moved[i] += counts[i] * page
            w = int(math.floor(t / window))
            while w * window < finish and w < own.shape[1]:      # the monitor's byte counters, window by window
                a, b = max(t, w * window), min(finish, (w + 1) * window)
                if b > a:
                    own[i, w] += bw * (b - a) - _background(a, b, bw, busy, period, on_start, on_end)
                w += 1
            end = max(end, finish)
        transfer += end - t
        t = end
    t += trailing_hits * hit_s
    return t, transfer, latency


def _links(links) -> tuple:
    if not isinstance(links, (list, tuple)) or not links:
        fail("links", links, "a non-empty list of Link")
    for i, link in enumerate(links):
        check_type(f"links[{i}]", link, Link)
    return tuple(links)


def simulate(log: FaultLog, links, route: str = "balanced", shares=None, window_s: float = 0.05) -> dict:
    """Replay `log` over `links` with a route of ROUTES; `window_s` is refused when the replay's bound on its
    time spans more than MAX_WINDOWS windows. Returns {"time_s", "transfer_s" (time spent moving
    pages), "latency_s", "bytes" (per link), "utilization" (float [links, windows]: each link's bytes, its
    other traffic's included, over bandwidth x window_s), "window_s", "link_busy" (per link: migration bytes
    / bandwidth / time_s), "shares" (the fraction of pages each link carried)}."""
    check_type("log", log, FaultLog)
    links = _links(links)
    route = check_choice("route", route, ROUTES)
    window = check_positive("window_s", window_s, unit="s")
    nominal = np.array([link.bandwidth for link in links])
    if shares is None:
        fixed = nominal / nominal.sum()
    else:
        fixed = np.asarray(shares, dtype=float)
        if fixed.shape != (len(links),) or not np.all(np.isfinite(fixed)) or fixed.min() < 0 or fixed.sum() <= 0:
            fail("shares", shares, f"{len(links)} non-negative numbers, not all 0 (one per link)")
        if route != "static":
            fail("shares", shares, "None unless route='static'")
    params = np.array([link._params() for link in links], dtype=np.float64)
    rows = np.ascontiguousarray(log.rows, dtype=np.int64)
    pages = int(rows[:, PAGES_IN].sum() + rows[:, PAGES_OUT].sum())
    spare = min(b * (1 - busy) for b, busy, *_ in params[:1 if route == "single" else len(links)])
    bound = (int(rows[:, HITS_BEFORE].sum()) + log.trailing_hits) * log.hit_s \
        + int(rows[:, OPENS].sum()) * log.fault_latency + pages * log.page_size / spare  # no run takes longer
    n_own = math.ceil(bound * (1 + 1e-9) / window) + 2
    if n_own > MAX_WINDOWS:
        fail("window_s", window_s, f"at least {bound * (1 + 1e-9) / (MAX_WINDOWS - 2):.3g} s for this log: at most "
             f"{MAX_WINDOWS:,} windows of the monitor over the {bound:.3g} s the replay can take")
    own = np.zeros((len(links), n_own))
    moved, counts, weights = np.zeros(len(links)), np.zeros(len(links), np.int64), np.zeros(len(links))
    t, transfer, latency = _run(rows, log.trailing_hits, log.hit_s, log.fault_latency, log.page_size, params,
                                ROUTES.index(route), np.ascontiguousarray(fixed), window, own, moved, counts, weights)
    n_windows = max(1, int(math.ceil(t / window)))
    background = np.array([[link.background_bytes(w * window, (w + 1) * window) for w in range(n_windows)]
                           for link in links])
    util = (own[:, :n_windows] + background) / (nominal[:, None] * window)  # what the monitor reads
    total = moved.sum()
    return {"time_s": t, "transfer_s": transfer, "latency_s": latency, "bytes": moved, "utilization": util,
            "window_s": window, "link_busy": moved / nominal / t if t > 0 else np.zeros(len(links)),
            "shares": moved / total if total else np.zeros(len(links))}
