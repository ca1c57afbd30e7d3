"""Several links, a monitor and a balancer (links.py) over the fault log (faultlog.py): the log against the
plain paging loop, one link against UnifiedMemory's own time, a transfer's end against a brute-force
integration of the bandwidth left over, and the whole balancer against a plain re-implementation."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.unified_memory import UnifiedMemory
from labkit.unified_memory.balancing import two_links
from labkit.unified_memory.faultlog import FaultLog
from labkit.unified_memory.links import Link, simulate

from ..refusals import assert_refused

SETTINGS = [{}, {"fault_batch": 4}, {"prefetch": "sequential"}, {"prefetch": "density"}, {"eviction": "clock"}]


def trace(seed=0, n=300):
    rng = np.random.default_rng(seed)
    return np.concatenate([np.tile(np.arange(n), 2), rng.integers(0, n, 500), np.arange(n)])


def pools(**kw):
    a, b = (UnifiedMemory(64 * 4096, 512 * 4096, **kw) for _ in range(2))
    a.alloc(300 * 4096), b.alloc(300 * 4096)
    return a, b


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_one_link_without_other_traffic_is_the_pools_own_time(kw):
    plain, logged = pools(**kw)
    log = logged.access_pages_logged(trace(2))
    r = simulate(log, [Link("pcie", plain.config.link_bandwidth)], "single")
    assert r["time_s"] == pytest.approx(logged.stats.time_s, rel=1e-12)
    assert r["transfer_s"] == pytest.approx(logged.stats.bytes_moved / plain.config.link_bandwidth, rel=1e-12)
    assert r["latency_s"] == pytest.approx(logged.stats.fault_batches * plain.config.fault_latency)


def test_background_bytes_by_hand():
    link = Link("a", 10.0, busy=0.6, period_s=2.0, on_start=0.0, on_end=1.0)
    assert link.background_bytes(0.5, 2.5) == pytest.approx(10 * 0.6 * (0.5 + 0.5))  # [0.5, 1) and [2, 2.5)
    assert link.free_bytes(0.0, 2.0) == pytest.approx(20 - 6)
    assert link.finish(0.0, 4.0) == pytest.approx(1.0)   # 4 bytes at 4 bytes/s during the on-phase
    assert link.finish(0.0, 9.0) == pytest.approx(1.5)   # then 5 bytes at 10 bytes/s
    assert Link("b", 10.0).finish(3.0, 5.0) == 3.5


@settings(max_examples=60, deadline=None)
@given(start=st.floats(0, 7), nbytes=st.floats(0.01, 40), busy=st.floats(0, 0.95), on=st.tuples(
    st.floats(0, 1.5), st.floats(0, 1.5)))
def test_a_transfer_ends_where_a_brute_force_integration_says(start, nbytes, busy, on):
    s, e = sorted(on)
    link = Link("x", 10.0, busy, 1.5, s, e)
    end = link.finish(start, nbytes)
    assert link.free_bytes(start, end) == pytest.approx(nbytes, rel=1e-9, abs=1e-9)
    dt, t, got = 1e-3, start, 0.0  # step the clock: the bytes delivered reach nbytes at the same time
    while got < nbytes:
        mid = t + dt / 2
        rate = 10.0 * (1 - busy * (s <= mid % 1.5 < e))
        got, t = got + rate * dt, t + dt
    # a step across a phase edge: dt x full rate at the slow rate
    assert t == pytest.approx(end, abs=2 * dt / (1 - busy))


def reference(log: FaultLog, links, route, shares=None, window=0.05):
    """The balancer written plainly: Python floats, Link's own methods, a dict of counters."""
    own, moved, t = {}, [0.0] * len(links), 0.0
    for hits, opens, n_in, n_out in log.rows.tolist():
        t += hits * log.hit_s
        t += log.fault_latency if opens else 0.0  # added apart, as simulate does: the same float, the same window
        n = n_in + n_out
        if route == "single":
            weights = [1.0] + [0.0] * (len(links) - 1)
        elif route == "static":
            weights = list(shares)
        else:
            last = math.floor(t / window) - 1
            weights = [link.bandwidth * (1 - (round(link.background_bytes(last * window, (last + 1) * window)
                                                    / link.bandwidth / window * 1e9) / 1e9 if last >= 0 else 0))
                       for link in links]
        exact = [n * w / sum(weights) for w in weights]
        counts = [math.floor(x) for x in exact]
        for i in sorted(range(len(links)), key=lambda i: (-(exact[i] - counts[i]), i))[:n - sum(counts)]:
            counts[i] += 1
        end = t
        for i, c in enumerate(counts):
            if c:
                finish = links[i].finish(t, c * log.page_size)
                moved[i] += c * log.page_size
                for w in range(math.floor(t / window), math.ceil(finish / window)):
                    a, b = max(t, w * window), min(finish, (w + 1) * window)
                    own[i, w] = own.get((i, w), 0.0) + links[i].free_bytes(a, b)
                end = max(end, finish)
        t = end
    return t + log.trailing_hits * log.hit_s, moved, own


@pytest.mark.parametrize("route", ["single", "static", "balanced"])
def test_every_route_matches_the_plain_reference(route):
    _, pool = pools(prefetch="sequential")
    log = pool.access_pages_logged(trace(3))
    links = two_links(25e9, 0.7, period_s=2e-4)  # phases far shorter than the run, windows of 20 us
    shares = [1.0, 1.0] if route == "static" else None
    r = simulate(log, links if route != "single" else links[:1], route, shares, window_s=2e-5)
    t, moved, own = reference(log, links if route != "single" else links[:1], route, shares, window=2e-5)
    assert r["time_s"] == pytest.approx(t, rel=1e-9)
    assert r["bytes"].tolist() == moved
    for (i, w), v in own.items():
        if w < r["utilization"].shape[1]:
            bg = links[i].background_bytes(w * 2e-5, (w + 1) * 2e-5)
            assert r["utilization"][i, w] == pytest.approx((v + bg) / (25e9 * 2e-5), rel=1e-6, abs=1e-9)


def test_without_other_traffic_two_equal_links_halve_the_transfers():
    _, pool = pools(prefetch="sequential")
    log = pool.access_pages_logged(trace(5))
    one = simulate(log, [Link("a", 25e9)], "single")
    links = [Link("a", 25e9), Link("b", 25e9)]
    static, balanced = simulate(log, links, "static"), simulate(log, links, "balanced")
    halves = sum(math.ceil((i + o) / 2) for _, _, i, o in log.rows.tolist()) * 4096 / 25e9
    assert static["transfer_s"] == pytest.approx(halves) == pytest.approx(balanced["transfer_s"])
    assert static["transfer_s"] < 0.55 * one["transfer_s"]


def test_bad_links_routes_and_shares_are_refused():
    _, pool = pools()
    log = pool.access_pages_logged(trace())
    assert_refused(lambda: simulate(log, [], "single"), ValueError, "links", [], "non-empty list of Link")
    assert_refused(lambda: simulate(log, [Link("a", 1e9)], "fastest"), ValueError, "route", "fastest", "one of")
    assert_refused(lambda: simulate(log, [Link("a", 1e9)], "static", [1, 2]), ValueError, "shares", [1, 2], "1 non")
    assert_refused(lambda: simulate(log, [Link("a", 1e9)], "balanced", [1]), ValueError, "shares", [1], "None unless")
    assert_refused(lambda: Link("a", 1e9, busy=1.0), ValueError, "busy", 1.0, "")
    assert_refused(lambda: Link("a", 1e9, period_s=1.0, on_start=0.5, on_end=0.2), ValueError, "on_end", 0.2, "")
    assert_refused(lambda: simulate("log", [Link("a", 1e9)]), TypeError, "log", "log", "FaultLog")


def test_a_window_too_small_for_the_run_is_refused_by_name_at_once():
    """The monitor keeps a counter per window: past MAX_WINDOWS windows over the replay's bound on its time
    (1e-11 s would take minutes, 1e-13 s hundreds of GiB) window_s is refused, naming the least it accepts."""
    from labkit.unified_memory.links import MAX_WINDOWS
    _, pool = pools(prefetch="sequential")
    log = pool.access_pages_logged(trace(3))
    links = [Link("a", 25e9), Link("b", 25e9)]
    rows = log.rows
    bound = (int(rows[:, 0].sum()) + log.trailing_hits) * log.hit_s + int(rows[:, 1].sum()) * log.fault_latency \
        + int(rows[:, 2:].sum()) * log.page_size / 25e9
    least = bound / (MAX_WINDOWS - 2)
    for w in (least / 2, 1e-13, 1e-11):
        assert_refused(lambda: simulate(log, links, "balanced", window_s=w), ValueError, "window_s", w,
                       f"at least {least * (1 + 1e-9):.3g} s")
    r = simulate(log, links, "balanced", window_s=least * 1.01)  # just inside the limit: runs, in well under a second
    assert 0.9 * MAX_WINDOWS < r["utilization"].shape[1] * bound / r["time_s"] <= MAX_WINDOWS
