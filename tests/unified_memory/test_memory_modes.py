"""STATIC / DYNAMIC / HYBRID pools: limits hold, counts agree with a recount, the modes differ as designed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory.memory_modes import MemoryMode, PoolConfig, configure_memory, make_requests, simulate_tenants

from ..refusals import assert_refused

GB = 10**9


def test_configure_memory():
    c = configure_memory(MemoryMode.DYNAMIC, 80 * GB)
    assert (c.mode, c.GPU_MEM_THRESHOLD, c.MAX_GPU_MEM) == (MemoryMode.DYNAMIC, 0.8, 80 * GB)
    assert configure_memory("hybrid", 1).mode == MemoryMode.HYBRID == 3 and configure_memory(1, 1).mode == 1
    for bad, word in (((4, 1), "mode"), (("elastic", 1), "mode"), ((1, 0), "max_gpu_mem"), ((1, 10, 1.5), "threshold"),
                      ((1, 10, 0.8, 0), "floor_fraction")):
        with pytest.raises(ValueError, match=word):
            configure_memory(*bad)
    for bad, word in (((1.0, 1), "mode"), ((None, 1), "mode"), ((1, 10.0), "max_gpu_mem"),
                      ((1, 10, "0.8"), "threshold")):
        with pytest.raises(TypeError, match=word):
            configure_memory(*bad)
    with pytest.raises(TypeError, match="mode must be a MemoryMode"):  # the dataclass checks itself too
        PoolConfig(1, 10)
    with pytest.raises(ValueError, match="threshold"):
        PoolConfig(MemoryMode.HYBRID, 10, threshold=0)
    assert PoolConfig(MemoryMode.HYBRID, 10) == configure_memory("hybrid", 10)


def recount(reqs, steps, placed_on_device, weights):
    """Device bytes per step and tenant, recounted from the requests and where each one went."""
    out = np.tile(np.array(weights, float), (steps, 1))
    for (t, tenant, size, duration), on_device in zip(reqs, placed_on_device):
        if on_device:
            out[t:t + duration, tenant] += size
    return out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(list(MemoryMode)), st.floats(0.05, 1.5), st.floats(0.05, 1.5), st.integers(0, 2**16),
       st.sampled_from([(0.5, 0.5), (0.3, 0.6), (0.7, 0.3)]))
def test_each_tenant_stays_within_its_bound(mode, rate_a, rate_b, seed, shares):
    cap, steps, weights = 100 * GB, 60, [20 * GB, 10 * GB]
    reqs = make_requests(steps, [rate_a, rate_b], [3 * GB, 2 * GB], mean_duration=8, seed=seed)
    cfg = configure_memory(mode, cap)
    r = simulate_tenants(cfg, weights, list(shares), reqs, steps)
    by_tenant = r["used_by_tenant"]
    assert by_tenant.shape == (steps, 2) and np.allclose(by_tenant.sum(axis=1), r["used"])
    assert r["served"] == len(reqs) and 0 <= r["failed"] <= r["served"]
    assert (by_tenant >= np.array(weights)).all()  # weights always stay on the device
    if mode == MemoryMode.STATIC:  # each tenant within its own partition, whatever the other one does
        assert (by_tenant <= np.array(shares) * cap + 1).all()
    else:  # the pool fills at most threshold * max_gpu_mem
        assert (r["used"] <= cfg.threshold * cap + 1).all() and r["peak"] <= cfg.threshold + 1e-9
    if mode == MemoryMode.HYBRID:  # above its floor a tenant draws on the shared headroom, which all share
        floors = cfg.floor_fraction * np.array(shares) * cap
        headroom = cfg.threshold * cap - floors.sum()
        assert (np.maximum(by_tenant - floors, 0).sum(axis=1) <= headroom + 1).all()
    # the series is a recount: every request placed on the device holds its bytes for its duration
    assert np.array_equal(by_tenant, recount(reqs, steps, r["on_device"], weights))
    assert r["on_device"].count(False) == r["failed"] and None not in r["on_device"]


def test_hand_counted_example():
    # device 10 bytes, two tenants with 1 byte of weights each, halves of 5; page size 1 byte.
    # t=0: tenant 0 asks 3 bytes for 2 steps, twice; t=1: tenant 1 asks 3 bytes for 1 step.
    reqs = [(0, 0, 3, 2), (0, 0, 3, 2), (1, 1, 3, 1)]
    want = {  # used bytes per step (3 steps), failed requests, host pages read
        MemoryMode.STATIC: ([5, 8, 2], 1, 6),       # the second 3-byte request does not fit 5 - 1 - 3
        MemoryMode.DYNAMIC: ([8, 8, 2], 1, 3),      # 2 + 3 + 3 = 8 = 0.8 * 10; tenant 1 fails at t=1
        # floors 2.5 each, shared headroom 8 - 5 = 3: tenant 0 at 4 uses 1.5 of it, 7 would need 4.5;
        # at t=1 tenant 1 at 4 takes the other 1.5
        MemoryMode.HYBRID: ([5, 8, 2], 1, 6),
    }
    for mode, (used, failed, pages) in want.items():
        r = simulate_tenants(configure_memory(mode, 10), [1, 1], [0.5, 0.5], reqs, 3, page_size=1,
                             link_bandwidth=2.0)
        assert r["used"].tolist() == used and r["failed"] == failed and r["fault_pages"] == pages
        assert r["utilization"] == pytest.approx(sum(used) / 3 / 10) and r["peak"] == max(used) / 10
        assert r["fault_s"] == pytest.approx(pages / 2.0)


def test_history_dependence_beats_the_steady_state_bound():
    # A counterexample to the steady-state bound: 13 short then 5 long 2 GB requests at t=0, 80 GB, two 14 GB models.
    # STATIC: tenant 0 has 40 - 14 = 26 GB: the 13 short ones fit, the 5 long ones go to the host.
    # DYNAMIC: 64 - 28 = 36 GB: all 18 fit. Utilization by hand:
    cap, steps = 80 * GB, 400
    reqs = [(0, 0, 2 * GB, 1)] * 13 + [(0, 0, 2 * GB, 399)] * 5
    st_ = simulate_tenants(configure_memory("static", cap), [14 * GB] * 2, [0.5, 0.5], reqs, steps)
    dy = simulate_tenants(configure_memory("dynamic", cap), [14 * GB] * 2, [0.5, 0.5], reqs, steps)
    assert st_["utilization"] == pytest.approx((54 + 28 * 399) / 400 / 80)
    assert dy["utilization"] == pytest.approx((64 + 38 * 398 + 28) / 400 / 80)
    assert (st_["failed"], dy["failed"]) == (5, 0)
    assert dy["utilization"] / st_["utilization"] - 1 > 0.35


def test_dynamic_lends_an_idle_tenants_memory_and_static_does_not():
    cap, steps = 100 * GB, 200
    reqs = make_requests(steps, [1.0, 0.0], [4 * GB, 1 * GB], mean_duration=20, seed=1)  # tenant B idle
    res = {m: simulate_tenants(configure_memory(m, cap), [10 * GB, 10 * GB], [0.5, 0.5], reqs, steps)
           for m in MemoryMode}
    assert res[MemoryMode.STATIC]["peak"] <= 0.5 + 0.1 + 1e-9  # A never gets more than its half (+ B's weights)
    assert res[MemoryMode.DYNAMIC]["failed"] < res[MemoryMode.STATIC]["failed"]
    assert res[MemoryMode.DYNAMIC]["utilization"] > res[MemoryMode.STATIC]["utilization"]
    assert res[MemoryMode.STATIC]["failed"] >= res[MemoryMode.HYBRID]["failed"] >= res[MemoryMode.DYNAMIC]["failed"]


def test_bad_input():
    with pytest.raises(TypeError, match="PoolConfig"):
        simulate_tenants("static", [1], [1.0], [], 1)
    with pytest.raises(ValueError, match="shares"):
        simulate_tenants(configure_memory(1, 10), [1, 1], [0.8, 0.8], [], 1)
    with pytest.raises(ValueError, match="do not fit"):
        simulate_tenants(configure_memory(1, 10), [6, 1], [0.5, 0.5], [], 1)
    with pytest.raises(ValueError, match="steps"):
        make_requests(0, [1.0], [1])
    with pytest.raises(ValueError, match="mean_duration"):
        make_requests(5, [1.0], [1], mean_duration=0)
    with pytest.raises(ValueError, match="mean_duration"):
        make_requests(5, [1.0], [1], mean_duration=float("nan"))
    cfg = configure_memory(1, 10)
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        simulate_tenants(cfg, [1], [1.0], [], 0)
    with pytest.raises(ValueError, match="page_size"):
        simulate_tenants(cfg, [1], [1.0], [], 2, page_size=0)
    with pytest.raises(ValueError, match="link_bandwidth"):
        simulate_tenants(cfg, [1], [1.0], [], 2, link_bandwidth=-1.0)
    with pytest.raises(TypeError, match="steps must be a positive int"):
        simulate_tenants(cfg, [1], [1.0], [], 2.0)
    with pytest.raises(TypeError, match=r"shares\[0\]"):
        simulate_tenants(cfg, [1], ["1"], [], 2)
    with pytest.raises(ValueError, match="shared headroom"):  # HYBRID: 4 bytes above the floor of 2.5, headroom 3
        simulate_tenants(configure_memory("hybrid", 10), [6.5, 1], [0.5, 0.5], [], 2)
    with pytest.raises(TypeError, match=r"kv_bytes\[1\]"):
        make_requests(5, [1.0, 1.0], [1, 2.5])
    with pytest.raises(ValueError, match="one per tenant"):
        make_requests(5, [1.0, 1.0], [1])
    with pytest.raises(ValueError, match=r"rates\[0\]"):
        make_requests(5, [-1.0], [1])
    assert simulate_tenants(cfg, [1], [1.0], [(0, 0, 2, 1)], 2)["served"] == 1  # still usable


@pytest.mark.parametrize("mode", ["static", "dynamic", "hybrid"])
def test_every_request_gives_back_what_it_took(mode):
    """After the last request has ended, every pool holds exactly the weights again (a request of zero or
    negative duration must not keep its memory forever)."""
    requests = make_requests(60, [0.5, 0.3], [2, 3], mean_duration=5, seed=1)
    r = simulate_tenants(configure_memory(mode, 100), [10, 10], [0.5, 0.5], requests, 200)
    last_end = max(t + d for t, _, _, d in requests)
    assert last_end < 200 and r["used"][last_end:].tolist() == [20.0] * (200 - last_end)
    assert r["used_by_tenant"][-1].tolist() == [10.0, 10.0]


def test_requests_that_would_corrupt_the_accounting_are_refused():
    cfg = configure_memory("dynamic", 80)
    run = lambda requests: simulate_tenants(cfg, [1, 1], [0.5, 0.5], requests, 5)  # noqa: E731
    for duration in (0, -3):
        assert_refused(lambda: run([(0, 0, 2, duration)]), ValueError, "requests[0] duration", duration,
                       "a positive int (steps)")
    assert_refused(lambda: run([(0, 0, 2, 1), (0, 0, -8, 10)]), ValueError, "requests[1] kv bytes", -8,
                   "a positive int (bytes)")
    assert_refused(lambda: run([(0, 0, 1.5, 3)]), TypeError, "requests[0] kv bytes", 1.5, "a positive int")
    assert_refused(lambda: run([(0, 2, 2, 3)]), ValueError, "requests[0] tenant", 2, "an int in [0, 1]")
    assert_refused(lambda: run([(0, -1, 2, 3)]), ValueError, "requests[0] tenant", -1, "an int in [0, 1]")
    assert_refused(lambda: run([(-1, 0, 2, 3)]), ValueError, "requests[0] arrival step", -1, "an int >= 0")
    assert_refused(lambda: run([(0, 0, 2)]), ValueError, "requests[0]", (0, 0, 2), "a tuple (arrival step")
    assert_refused(lambda: run(None), TypeError, "requests", None, "a list of (arrival step")
    assert_refused(lambda: simulate_tenants(cfg, [1, 1], [float("nan"), 0.5], [], 5), ValueError, "shares[0]",
                   float("nan"), "a finite number in (0, 1]")
    assert_refused(lambda: simulate_tenants(cfg, None, [0.5], [], 5), TypeError, "weight_bytes", None, "a list")
    assert run([(0, 0, 2, 1)])["served"] == 1  # still usable


def test_make_requests_refuses_what_numpy_would_choke_on():
    nan = float("nan")
    assert_refused(lambda: make_requests(5, [nan], [1]), ValueError, "rates[0]", nan, "a non-negative finite number")
    assert_refused(lambda: make_requests(5, [1.0], [1.5]), TypeError, "kv_bytes[0]", 1.5, "a positive int (bytes)")
    assert_refused(lambda: make_requests(5, [1.0], [1], seed=-1), ValueError, "seed", -1, "a non-negative int")
    assert_refused(lambda: make_requests(5, [1.0], [1], seed=1.5), TypeError, "seed", 1.5, "a non-negative int")
    assert_refused(lambda: make_requests(5, "a", [1]), TypeError, "rates", "a", "a list")
    assert_refused(lambda: make_requests(5, [1e12], [1]), ValueError, "rates", [1e12], "at most 10,000,000")
