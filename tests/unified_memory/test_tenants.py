"""Section 5's experiment: each pool row is simulate_tenants' result, every pool sees the same requests, and
the burst order is counted by hand."""
import pytest

from labkit.unified_memory import memory_modes, tenants
from labkit.unified_memory.memory_modes import configure_memory

from ..refusals import assert_refused

GB = 10**9


def test_a_pool_row_is_the_simulators_result():
    requests = [(0, 0, 2 * GB, 10), (1, 1, 2 * GB, 5), (3, 0, 2 * GB, 100)]
    row = tenants.pool_row("STATIC 0.4/0.4", requests, steps=20)
    r = memory_modes.simulate_tenants(configure_memory("static", 80 * GB), [14 * GB, 14 * GB], [0.4, 0.4], requests, 20)
    assert row == {"pool": "STATIC 0.4/0.4", "utilization": r["utilization"], "peak": r["peak"], "failed": r["failed"],
                   "host_GB/step": r["fault_pages"] * 4096 / 20 / GB, "host_s/step": r["fault_s"] / 20}
    # by hand: 28 GB of weights, then 2 GB from step 0 to 9, 2 GB from 1 to 5, 2 GB from 3 on (all fit)
    used = [28 + 2 * ((t < 10) + (1 <= t < 6) + (t >= 3)) for t in range(20)]
    assert row["utilization"] == pytest.approx(sum(used) / 20 / 80) and row["failed"] == 0


def test_the_experiment_runs_every_pool_on_the_same_requests():
    results = tenants.experiment()
    assert list(results) == [tenants.BALANCED, tenants.SKEWED]
    for label, run in results.items():
        requests = memory_modes.make_requests(tenants.STEPS, list(tenants.SCENARIOS[label]), [2 * GB] * 2,
                                              mean_duration=40, seed=0)
        assert run["requests"] == len(requests)
        assert [r["pool"] for r in run["rows"]] == list(tenants.POOLS)
        assert run["rows"][0] == tenants.pool_row("STATIC", requests)
    # the shared pools never exceed their limit; STATIC halves may fill the device
    for run in results.values():
        peaks = {r["pool"]: r["peak"] for r in run["rows"]}
        assert peaks["DYNAMIC"] <= 0.8 and peaks["HYBRID"] <= 0.8 and peaks["DYNAMIC thr 1.0"] <= 1.0


def test_the_burst_by_hand():
    b = tenants.burst()
    # STATIC: model A's half is 40 GB = 14 GB of weights + the 13 short requests; the 5 long ones go to the host.
    # Step 0 holds 14 + 14 + 26 = 54 GB, steps 1..399 the 28 GB of weights.
    assert b["STATIC"]["failed"] == 5
    assert b["STATIC"]["utilization"] == pytest.approx((54 + 399 * 28) / 400 / 80)
    # DYNAMIC fills up to 64 GB: 28 + 26 + 10 at step 0, then 38 GB until the long ones end at step 399
    assert b["DYNAMIC"]["failed"] == 0
    assert b["DYNAMIC"]["utilization"] == pytest.approx((64 + 398 * 38 + 28) / 400 / 80)


def test_an_unknown_pool_is_refused():
    assert_refused(lambda: tenants.pool_row("ELASTIC", []), ValueError, "name", "ELASTIC", "one of")
    assert_refused(lambda: tenants.pool_row("STATIC", [], steps=0), ValueError, "steps", 0, "a positive int")
