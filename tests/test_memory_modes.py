"""STATIC / DYNAMIC / HYBRID pools: limits hold, counts agree with a recount, the modes differ as designed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.memory_modes import MemoryMode, configure_memory, make_requests, simulate_tenants
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
def test_limits_and_recount(mode, rate_a, rate_b, seed):
    cap, steps = 100 * GB, 60
    reqs = make_requests(steps, [rate_a, rate_b], [3 * GB, 2 * GB], mean_duration=8, seed=seed)
    cfg = configure_memory(mode, cap)
    r = simulate_tenants(cfg, [20 * GB, 10 * GB], [0.5, 0.5], reqs, steps)
    limit = cap if mode == MemoryMode.STATIC else 0.8 * cap
    assert r["used"].max() <= limit + 1 and r["peak"] <= limit / cap + 1e-9
    assert r["served"] == len(reqs) and 0 <= r["failed"] <= r["served"]
    assert np.isclose(r["utilization"], r["used"].mean() / cap)
    # pages read from the host: every failed request, every step it is active within the run
    if r["failed"] == 0:
        assert r["fault_pages"] == 0
    else:
        assert r["fault_pages"] >= r["failed"] * (2 * GB // 4096)


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
