"""The balancer on the 70B replay's log: balanced beats a static split, which beats one link, when the other traffic
alternates; what the monitor reads by phase of the other traffic (monitor_phases, monitored) against readings
written out by hand, and the "+40%" fact-check built on factcheck.improvement with the balancer's measured gain."""

import numpy as np
import pytest

from labkit.unified_memory import factcheck
from labkit.unified_memory.balancing import (compare, improvement, last_token_log, monitor_phases, monitored,
                                             two_links)

from ..refusals import assert_refused
from .test_links import pools, trace


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


def hand_run() -> tuple[dict, list]:
    """Two links whose other traffic alternates every second, windows of 0.5 s: link A carries it in windows 0, 1,
    4, 5, link B in 2, 3, 6, 7; the switches open windows 2, 4 and 6; window 8 is the run's partial last one."""
    links = two_links(1.0, busy=0.6, period_s=2.0)
    util = np.array([[0.90, 0.92, 0.10, 0.80, 0.15, 0.93, 0.79, 0.81, 0.30],
                     [0.70, 0.78, 0.96, 0.91, 0.97, 0.79, 0.95, 0.90, 0.20]])
    return {"utilization": util, "window_s": 0.5, "time_s": 4.3, "transfer_s": 3.0}, links


def test_the_monitors_readings_by_phase_leave_out_the_windows_after_a_switch_and_the_last():
    run, links = hand_run()
    phases = monitor_phases(run, links)
    assert phases["switches"] == 3
    assert phases["with_traffic"] == [pytest.approx(np.median([0.90, 0.92, 0.93])),
                                      pytest.approx(np.median([0.91, 0.90]))]
    assert phases["without"] == [pytest.approx(np.median([0.80, 0.81])), pytest.approx(np.median([0.70, 0.78, 0.79]))]
    assert phases["after_switch"].tolist() == [[0.10, 0.15, 0.79], [0.96, 0.97, 0.95]]
    assert monitored(run) == pytest.approx(run["utilization"][:, :8].mean())


def test_on_a_real_replay_a_link_reads_at_least_its_other_traffic_while_it_is_on():
    _, pool = pools(prefetch="sequential")
    links = two_links(25e9, 0.6, period_s=2e-4)
    _, runs = compare(pool.access_pages_logged(trace(4)), links, window_s=1e-5)
    phases = monitor_phases(runs["balanced"], links)
    assert all(0.6 - 1e-9 <= u <= 1 + 1e-9 for u in phases["with_traffic"])
    assert all(-1e-9 <= u <= 1 + 1e-9 for u in phases["without"])
    assert phases["switches"] > 0


def test_the_improvement_check_adds_the_balancers_gain_to_factchecks_verdict():
    _, pool = pools(prefetch="sequential")
    _, runs = compare(pool.access_pages_logged(trace(4)), two_links(25e9, 0.6, period_s=2e-4), window_s=1e-5)
    busy = {"none": 0.01, "sequential": 0.8}
    check = improvement(busy, 30e-6, 25e9, runs)
    base = factcheck.improvement(busy, 30e-6, 25e9)
    assert check.claim == base.claim and check.judgement.startswith(base.judgement)
    assert check.arithmetic[:len(base.arithmetic)] == base.arithmetic
    read = {k: r["utilization"][:, :-1].mean() for k, r in runs.items()}
    gain = read["balanced"] / read["static 50/50"] - 1
    assert check.numbers["balancer_gain"] == pytest.approx(gain)
    assert check.numbers["balancer_speedup"] == runs["static 50/50"]["time_s"] / runs["balanced"]["time_s"]
    word = "reaches" if gain >= 0.4 else "falls short of"
    assert f"Load balancing over two busy links {word} the 40%" in check.judgement
    small = improvement(busy, 30e-6, 25e9, runs, gain=gain / 2).judgement  # a claimed gain below the measured one
    assert f"Load balancing over two busy links reaches the {gain / 2:.0%}" in small


def test_bad_runs_are_refused_by_name():
    run, links = hand_run()
    assert_refused(lambda: improvement({"x": 0.5}, 30e-6, 25e9, {"balanced": run}), ValueError, "runs",
                   ["balanced"], "'one link'")
    assert_refused(lambda: monitor_phases(run, links[:1]), ValueError, "links", links[:1], "one per row")
    assert_refused(lambda: monitor_phases([], links), TypeError, "run", [], "links.simulate")
