"""STATIC / DYNAMIC / HYBRID pools: limits hold, counts agree with a recount, the modes differ as designed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory.memory_modes import MemoryMode, configure_memory, make_requests, simulate_tenants
from labkit.unified_memory import configure_memory as exported

GB = 10**9


def test_configure_memory():
    c = configure_memory(MemoryMode.DYNAMIC, 80 * GB)
    assert (c.mode, c.GPU_MEM_THRESHOLD, c.MAX_GPU_MEM) == (MemoryMode.DYNAMIC, 0.8, 80 * GB)
    assert configure_memory("hybrid", 1).mode == MemoryMode.HYBRID == 3 and configure_memory(1, 1).mode == 1
    assert exported is configure_memory
    for bad, word in (((4, 1), "mode"), ((1, 0), "max_gpu_mem"), ((1, 10, 1.5), "threshold")):
        with pytest.raises(ValueError, match=word):
            configure_memory(*bad)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(list(MemoryMode)), st.floats(0.05, 1.5), st.floats(0.05, 1.5), st.integers(0, 2**16))
def test_limits_hold(mode, rate_a, rate_b, seed):
    cap, steps = 100 * GB, 60
    reqs = make_requests(steps, [rate_a, rate_b], [3 * GB, 2 * GB], mean_duration=8, seed=seed)
    r = simulate_tenants(configure_memory(mode, cap), [20 * GB, 10 * GB], [0.5, 0.5], reqs, steps)
    limit = cap if mode == MemoryMode.STATIC else 0.8 * cap
    assert r["used"].max() <= limit + 1 and r["peak"] <= limit / cap + 1e-9
    assert r["served"] == len(reqs) and 0 <= r["failed"] <= r["served"]
    if mode == MemoryMode.STATIC:  # tenant A alone never exceeds its half: 20 GB weights + 10 requests of 3 GB
        assert r["used"].max() <= 50 * GB + 50 * GB


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
    # The review's counterexample: 13 short then 5 long 2 GB requests at t=0, 80 GB, two 14 GB models.
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
    res = {m: simulate_tenants(configure_memory(m, cap), [10 * GB, 10 * GB], [0.5, 0.5], reqs, steps) for m in MemoryMode}
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
    assert simulate_tenants(cfg, [1], [1.0], [(0, 0, 2, 1)], 2)["served"] == 1  # still usable
