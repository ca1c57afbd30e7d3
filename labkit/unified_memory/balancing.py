"""Notebook 02's load-balancing experiment: the 70B replay's steady token over one link, two links with a
static split and two links with the monitor-driven balancer (links.py).

The two links are PCIe 4.0 x16 at the simulator's 25 GB/s each, and each carries other traffic (another
device's DMA, a NIC, storage) in turns: link A is busy `busy` of its bandwidth during the first half of every
`period_s`, link B during the second half. Nothing in the paging changes: the same FaultLog is replayed
over each arrangement. monitor_phases says what the monitor read while each link carried other traffic and
right after each switch; improvement judges the "+40%" claim with the balancer's measured gain.
Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import numpy as np

from . import factcheck
from .._checks import check_number, check_positive, check_type, fail
from ..course import FactCheck
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


def compare(log: FaultLog, links: list[Link], window_s: float = 0.05) -> tuple[list[dict], dict[str, dict]]:
    """(rows, runs): one row per arrangement (links[0] alone, the static 50/50 split over all links, the balancer),
    each with time_s, transfer_s, latency_s, the share of pages on link A and each link's busy share (migrations
    alone); and simulate()'s full result per arrangement, by the row's label."""
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


def _phase_on(t: float, link: Link) -> bool:
    """Whether the other traffic of `link` is on at time t (s)."""
    return link.busy > 0 and link.on_start <= t % link.period_s < link.on_end


def monitor_phases(run: dict, links: list[Link]) -> dict:
    """What the monitor read in `run` (a result of links.simulate over `links`), per link: the median of its
    windows while the link's other traffic was on ("with_traffic") and while it was off ("without"), leaving
    out the first window after each switch of the other traffic and the run's last, partial window; and the
    readings of all links in those first windows after a switch ("after_switch"), where the balancer still
    splits by the window before the switch. Each window is classed by its midpoint."""
    check_type("run", run, dict, "a result of links.simulate")
    if not isinstance(links, (list, tuple)) or not links:
        fail("links", links, "the non-empty list of Link that run was simulated over")
    util, window = np.asarray(run["utilization"]), run["window_s"]
    if util.shape[0] != len(links):
        fail("links", links, f"{util.shape[0]} Link, one per row of run['utilization']")
    n = util.shape[1] - 1  # the last window is partial
    phase = np.array([[_phase_on((w + 0.5) * window, link) for w in range(n)] for link in links])
    first = np.zeros(n, bool)
    first[1:] = np.any(phase[:, 1:] != phase[:, :-1], axis=0)
    steady = ~first
    with_traffic, without = [], []
    for i in range(len(links)):
        on, off = util[i, :n][steady & phase[i]], util[i, :n][steady & ~phase[i]]
        with_traffic.append(float(np.median(on)) if on.size else float("nan"))
        without.append(float(np.median(off)) if off.size else float("nan"))
    return {"with_traffic": with_traffic, "without": without, "after_switch": util[:, :n][:, first],
            "switches": int(first.sum())}


def monitored(run: dict) -> float:
    """The mean of what the monitor read over every link and every window but the last, partial one (0..1)."""
    check_type("run", run, dict, "a result of links.simulate")
    util = np.asarray(run["utilization"])
    return float(util[:, :-1].mean()) if util.shape[1] > 1 else float(util.mean())


def improvement(busy, latency: float, bandwidth: float, runs: dict, claimed: float = 0.92,
                gain: float = 0.40) -> FactCheck:
    """"92% bandwidth utilization, a 40% improvement over traditional architectures", with the balancer's own
    gain: factcheck.improvement on the single-link settings `busy` {label: link busy share}, plus what the
    monitor read for compare()'s `runs` (one link, static 50/50, balanced; monitored()): the balancer's gain
    over the static split against the claimed `gain`, and the time each arrangement took."""
    base = factcheck.improvement(busy, latency, bandwidth, claimed, gain)
    check_type("runs", runs, dict, "compare()'s runs: {arrangement: simulate's result}")
    missing = [k for k in ("one link", "static 50/50", "balanced") if k not in runs]
    if missing:
        fail("runs", sorted(runs), f"compare()'s runs, with {missing}")
    read = {label: monitored(run) for label, run in runs.items()}
    measured = read["balanced"] / read["static 50/50"] - 1
    faster = runs["static 50/50"]["time_s"] / runs["balanced"]["time_s"]
    arithmetic = base.arithmetic + [
        "two links with other traffic, the monitor's mean reading (both links, every window): "
        + ", ".join(f"{label} {u:.1%}" for label, u in read.items()),
        f"the balancer against the static split: {measured:+.0%} in what the monitor reads ({gain:+.0%} would "
        f"need {read['static 50/50'] * (1 + gain):.1%}), {faster:.2f}x less time per token; one link alone reads "
        f"{read['one link']:.1%} and takes {runs['one link']['time_s'] / runs['balanced']['time_s']:.2f}x the "
        "balancer's time"]
    reached = "reaches" if measured >= gain else "falls short of"
    judgement = (f"{base.judgement} Load balancing over two busy links {reached} the {gain:.0%}: it raises what the "
                 f"monitor reads from {read['static 50/50']:.0%} (a static split) to {read['balanced']:.0%}, "
                 f"{measured:+.0%}, and the busiest reading ({read['one link']:.0%}) belongs to one link alone, the "
                 "slowest arrangement: utilization is not speed.")
    holds_if = (f"{base.holds_if} With load balancing, the gain depends on how unevenly other traffic loads the "
                "links; here it is measured, not assumed.")
    return FactCheck(base.claim, arithmetic, judgement, holds_if,
                     {**base.numbers, "monitored": read, "balancer_gain": measured, "balancer_speedup": faster})
