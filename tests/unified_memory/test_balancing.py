"""The balancer on the 70B replay's log: balanced beats a static split, which beats one link, when the other traffic
alternates."""

import numpy as np
import pytest

from labkit.unified_memory.balancing import compare, last_token_log, two_links

from .test_links import trace, pools


def test_the_balancer_beats_the_static_split_which_beats_one_link_when_the_traffic_alternates():
    _, pool = pools(prefetch="sequential")
    log = pool.access_pages_logged(trace(4))
    rows, runs = compare(log, two_links(25e9, 0.6, period_s=2e-4), window_s=1e-5)
    t = {r["links"]: r["time_s"] for r in rows}
    assert t["balanced"] < t["static 50/50"] < t["one link"]
    assert all(r["latency_s"] == rows[0]["latency_s"] for r in rows)  # the same faults, the same latencies
    u = runs["balanced"]["utilization"]
    assert u.shape[0] == 2 and np.all((u >= -1e-9) & (u <= 1 + 1e-9))  # float noise of the counters


def test_last_token_log_is_the_last_steps_faults():
    steps = [np.tile(np.arange(300), 2), trace(6)]
    log = last_token_log(steps, 300, 64, prefetch="density")
    a, _ = pools(prefetch="density")
    a.access_pages(steps[0])
    before = a.stats.faults
    a.access_pages(steps[1])
    assert log.faults == a.stats.faults - before


def test_each_links_busy_share_and_the_monitors_utilization_by_hand():
    """busy_A / busy_B: each link's migration bytes over its bandwidth and the run's time; the monitor's
    utilization: each window's bytes, the other traffic's included, over bandwidth x window."""
    _, pool = pools(prefetch="sequential")
    log = pool.access_pages_logged(trace(4))
    links = two_links(25e9, 0.6, period_s=2e-4)
    rows, runs = compare(log, links, window_s=1e-5)
    for row in rows:
        r = runs[row["links"]]
        assert row["busy_A"] == r["bytes"][0] / 25e9 / r["time_s"]
        assert row["busy_B"] == (r["bytes"][1] / 25e9 / r["time_s"] if len(r["bytes"]) > 1 else 0.0)
        assert row["pages_A"] == r["bytes"][0] / r["bytes"].sum()
    r = runs["balanced"]
    assert 0 < rows[2]["busy_B"] < 1 and rows[2]["busy_A"] != rows[2]["busy_B"]
    u, w = r["utilization"], r["window_s"]
    for i, link in enumerate(links):  # over the whole run: the migrations' bytes plus the other traffic's
        background = link.background_bytes(0.0, u.shape[1] * w)
        assert u[i].sum() * 25e9 * w == pytest.approx(r["bytes"][i] + background, rel=1e-9)
