"""Notebook 02, section 5's experiment: two models sharing one 80 GB device, each request holding a 2 GB KV
cache, under each allocation mode (memory_modes), in two scenarios; labkit.unified_memory.factcheck judges
the "+35%" claim from its results.

    POOLS       STATIC halves, DYNAMIC and HYBRID at the source material's 0.8 threshold, and two pools with
                the other mode's budget: STATIC 0.4/0.4 (at most 80% in all, like DYNAMIC) and DYNAMIC with
                threshold 1.0 (up to 100%, like STATIC)
    SCENARIOS   arrival rates (requests per step) of the two models: both busy; model B mostly idle
    burst       a request order chosen to favour DYNAMIC: short requests fill model A's STATIC half just
                before long ones arrive (a request is placed once and never retried)

Units: bytes (GB = 1e9), steps.
"""

from __future__ import annotations

from .._checks import check_choice, check_positive_int
from .memory_modes import configure_memory, make_requests, simulate_tenants

GB = 10**9
CAPACITY, WEIGHTS, KV_BYTES, STEPS, MEAN_DURATION = 80 * GB, 14 * GB, 2 * GB, 400, 40
BALANCED, SKEWED = "balanced (both models busy)", "imbalanced (model B mostly idle)"
SCENARIOS = {BALANCED: (0.5, 0.5), SKEWED: (1.0, 0.05)}
POOLS = {  # name -> (mode, threshold, STATIC shares)
    "STATIC": ("static", 0.8, (0.5, 0.5)),
    "DYNAMIC": ("dynamic", 0.8, (0.5, 0.5)),
    "HYBRID": ("hybrid", 0.8, (0.5, 0.5)),
    "STATIC 0.4/0.4": ("static", 0.8, (0.4, 0.4)),
    "DYNAMIC thr 1.0": ("dynamic", 1.0, (0.5, 0.5)),
}


def pool_row(name: str, requests, steps: int = STEPS) -> dict:
    """One pool of POOLS running `requests` (memory_modes.make_requests) for `steps` steps: its utilization
    (mean bytes in use / capacity), peak, failed requests (KV cache sent to the host), host_GB/step (what
    those requests read from host memory per step, on average) and host_s/step (the same bytes over the
    25 GB/s link: a lower bound without fault latency)."""
    mode, threshold, shares = POOLS[check_choice("name", name, tuple(POOLS))]
    steps = check_positive_int("steps", steps)
    r = simulate_tenants(configure_memory(mode, CAPACITY, threshold=threshold), [WEIGHTS, WEIGHTS], list(shares),
                         requests, steps)
    return {"pool": name, "utilization": r["utilization"], "peak": r["peak"], "failed": r["failed"],
            "host_GB/step": r["fault_pages"] * 4096 / steps / GB, "host_s/step": r["fault_s"] / steps}


def experiment(seed: int = 0) -> dict[str, dict]:
    """Every pool of POOLS in every scenario of SCENARIOS: {scenario: {"requests": how many, "rows": one
    pool_row per pool}}. Random arrivals and durations from `seed` (the same requests for every pool)."""
    out = {}
    for label, rates in SCENARIOS.items():
        requests = make_requests(STEPS, list(rates), [KV_BYTES, KV_BYTES], mean_duration=MEAN_DURATION, seed=seed)
        out[label] = {"requests": len(requests), "rows": [pool_row(name, requests) for name in POOLS]}
    return out


def burst() -> dict[str, dict]:
    """13 one-step requests, then 5 requests of 399 steps, all of model A at step 0: {"STATIC": ...,
    "DYNAMIC": ...} simulate_tenants results. The short ones fill model A's STATIC half (14 + 13 x 2 = 40 GB),
    so STATIC sends the long ones to the host for good, while DYNAMIC, with 64 GB to fill, keeps them."""
    requests = [(0, 0, KV_BYTES, 1)] * 13 + [(0, 0, KV_BYTES, STEPS - 1)] * 5
    return {mode.upper(): simulate_tenants(configure_memory(mode, CAPACITY), [WEIGHTS, WEIGHTS], [0.5, 0.5],
                                           requests, STEPS)
            for mode in ("static", "dynamic")}
