"""Allocation modes for a device shared by several models (notebook 02, section 5).

    STATIC   each tenant owns a fixed partition of the device (share * max_gpu_mem), used or not
    DYNAMIC  one shared pool; any tenant takes device memory on demand until the pool holds
             threshold * max_gpu_mem bytes (the source material's GPU_MEM_THRESHOLD = 0.8)
    HYBRID   each tenant keeps a static floor (floor_fraction of its STATIC partition); above its floor it
             takes from a shared headroom of threshold * max_gpu_mem - sum(floors) bytes

    |<-------------------------- max_gpu_mem ------------------------->|
    STATIC   [ tenant A partition          | tenant B partition        ]
    DYNAMIC  [ shared, first come first served ............|  20% kept free ]
    HYBRID   [ A floor  | B floor | shared headroom ........|  20% kept free ]

A request whose KV cache does not get device memory is not refused: it lives in host memory (a failed
device allocation) and every decode step pulls its pages over the link (counted as page faults), as
CUDA Unified Memory would. Weights are placed first and always stay on the device. A request is placed
once, when it arrives, and never retried or moved back: utilization therefore depends on the order of
past requests (a burst of short requests that fills STATIC's partition makes later long ones fail even
after the burst has gone), not only on the average demand.
Units: bytes, steps (one decode step of every active request).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .._checks import (check_fraction, check_int, check_number, check_positive, check_positive_int, check_type, fail,
                       is_int)

MAX_REQUESTS = 10**7  # make_requests refuses rates that would draw more (memory, and hours of simulation)


class MemoryMode(IntEnum):
    STATIC = 1
    DYNAMIC = 2
    HYBRID = 3


@dataclass(frozen=True)
class PoolConfig:
    """The settings of a shared pool, checked when it is made (configure_memory builds one from looser input)."""
    mode: MemoryMode
    max_gpu_mem: int          # bytes of device memory the pool may manage
    threshold: float = 0.8    # DYNAMIC/HYBRID: fill the device up to this fraction
    floor_fraction: float = 0.5  # HYBRID: share of each tenant's STATIC partition kept as its floor

    def __post_init__(self):
        check_type("mode", self.mode, MemoryMode, "a MemoryMode (configure_memory also takes 1, 2, 3 or a name)")
        object.__setattr__(self, "max_gpu_mem", check_positive_int("max_gpu_mem", self.max_gpu_mem, unit="bytes"))
        object.__setattr__(self, "threshold", check_fraction("threshold", self.threshold))
        object.__setattr__(self, "floor_fraction", check_fraction("floor_fraction", self.floor_fraction))

    @property
    def GPU_MEM_THRESHOLD(self) -> float:  # the source material's names  # noqa: N802
        return self.threshold

    @property
    def MAX_GPU_MEM(self) -> int:  # noqa: N802
        return self.max_gpu_mem


def configure_memory(mode, max_gpu_mem: int, threshold: float = 0.8, floor_fraction: float = 0.5) -> PoolConfig:
    """A PoolConfig for `mode` (a MemoryMode, or 1/2/3, or "static"/"dynamic"/"hybrid")."""
    expected = "a MemoryMode (STATIC=1, DYNAMIC=2, HYBRID=3) or its name"
    if not isinstance(mode, (MemoryMode, str)) and not is_int(mode):
        fail("mode", mode, expected, TypeError)
    try:
        mode = MemoryMode[mode.upper()] if isinstance(mode, str) else MemoryMode(mode)
    except (KeyError, ValueError):
        fail("mode", mode, expected)
    return PoolConfig(mode, max_gpu_mem, threshold, floor_fraction)


def make_requests(steps: int, rates: list[float], kv_bytes: list[int], mean_duration: float = 20.0,
                  seed: int = 0) -> list[tuple[int, int, int, int]]:
    """Random requests (arrival step, tenant, kv bytes, duration in steps): Poisson arrivals with
    `rates[i]` requests per step for tenant i, each holding kv_bytes[i] for an exponential duration."""
    check_positive_int("steps", steps)
    check_positive("mean_duration", mean_duration, unit="steps")
    check_positive_int("seed", seed, allow_zero=True)
    for name, value in (("rates", rates), ("kv_bytes", kv_bytes)):
        check_type(name, value, (list, tuple), "a list (one entry per tenant)")
    if not rates or len(rates) != len(kv_bytes):
        fail("rates and kv_bytes", (rates, kv_bytes), "two non-empty lists of the same length (one per tenant)")
    for i, (rate, size) in enumerate(zip(rates, kv_bytes)):
        check_positive(f"rates[{i}]", rate, unit="requests per step", allow_zero=True)
        check_positive_int(f"kv_bytes[{i}]", size, unit="bytes")
    if steps * sum(rates) > MAX_REQUESTS:
        fail("rates", rates, f"rates whose requests over {steps} steps number at most {MAX_REQUESTS:,} on average")
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        for i, rate in enumerate(rates):
            for _ in range(int(rng.poisson(rate))):
                out.append((t, i, int(kv_bytes[i]), 1 + int(rng.exponential(mean_duration))))
    return out


def check_requests(requests, n_tenants: int) -> list[tuple[int, int, int, int]]:
    """`requests` as a list of (arrival step >= 0, tenant in [0, n_tenants), kv bytes >= 1, duration >= 1 steps),
    or the error naming the first bad one: a request of zero duration would never end, negative bytes would
    give memory back that was never taken."""
    if isinstance(requests, (str, bytes)) or not hasattr(requests, "__iter__"):
        fail("requests", requests, "a list of (arrival step, tenant, kv bytes, duration) tuples", TypeError)
    out = []
    for index, r in enumerate(requests):
        if not isinstance(r, (tuple, list)) or len(r) != 4:
            fail(f"requests[{index}]", r, "a tuple (arrival step, tenant, kv bytes, duration in steps)",
                 TypeError if not isinstance(r, (tuple, list)) else ValueError)
        out.append((check_int(f"requests[{index}] arrival step", r[0], 0),
                    check_int(f"requests[{index}] tenant", r[1], 0, n_tenants - 1),
                    check_positive_int(f"requests[{index}] kv bytes", r[2], unit="bytes"),
                    check_positive_int(f"requests[{index}] duration", r[3], unit="steps")))
    return out


def simulate_tenants(config: PoolConfig, weight_bytes: list[int], shares: list[float], requests,
                     steps: int, page_size: int = 4096, link_bandwidth: float = 25e9) -> dict:
    """Run `requests` (from make_requests) for `steps` steps under `config`.

    weight_bytes[i]: tenant i's model weights; shares[i]: its fraction of the device in STATIC mode
    (they sum to at most 1). Returns utilization (mean device bytes in use / max_gpu_mem), peak,
    failed (requests whose KV went to the host), fault_pages (pages of page_size bytes read from host
    memory, summed over all steps: every step, each request on the host reads its whole KV cache over the
    link), fault_s (fault_pages * page_size / link_bandwidth: seconds the link spends on them, a lower
    bound that leaves out per-fault latency), served (requests), per-step `used` bytes (all tenants) and
    `used_by_tenant` bytes (an array [steps, tenants]: weights plus the KV caches placed on the device), and
    `on_device`: for each request, in order, whether its KV cache got device memory (None: it arrives after
    the last step).
    Bounds: STATIC keeps tenant i within shares[i] * max_gpu_mem; DYNAMIC keeps the total within
    threshold * max_gpu_mem; HYBRID keeps the total within it too, and the tenants' bytes above their
    floors within the shared headroom threshold * max_gpu_mem - sum(floors)."""
    check_type("config", config, PoolConfig, "a PoolConfig (from configure_memory)")
    for name, value in (("weight_bytes", weight_bytes), ("shares", shares)):
        check_type(name, value, (list, tuple), "a list (one entry per tenant)")
    for i, w in enumerate(weight_bytes):
        check_number(f"weight_bytes[{i}]", w, low=0, unit="bytes")
    for i, share in enumerate(shares):
        check_fraction(f"shares[{i}]", share)
    if not shares or len(weight_bytes) != len(shares) or sum(shares) > 1 + 1e-9:
        fail("shares", shares, f"one fraction per tenant ({len(weight_bytes)}), summing to at most 1")
    check_positive_int("steps", steps)
    check_positive_int("page_size", page_size, unit="bytes")
    check_positive("link_bandwidth", link_bandwidth, unit="bytes/s")
    requests = check_requests(requests, len(shares))
    cap, n = config.max_gpu_mem, len(shares)
    part = [s * cap for s in shares]
    floor = [config.floor_fraction * p for p in part]
    limit = {MemoryMode.STATIC: cap, MemoryMode.DYNAMIC: config.threshold * cap,
             MemoryMode.HYBRID: config.threshold * cap}[config.mode]
    used = list(map(float, weight_bytes))
    if config.mode == MemoryMode.STATIC and any(u > p for u, p in zip(used, part)):
        raise ValueError(f"weights {weight_bytes} do not fit the STATIC partitions {part}")
    if sum(used) > limit:
        raise ValueError(f"weights ({sum(used):.0f} bytes) do not fit under the pool limit ({limit:.0f} bytes)")
    if config.mode == MemoryMode.HYBRID and sum(max(u - f, 0.0) for u, f in zip(used, floor)) > limit - sum(floor):
        raise ValueError(f"weights {weight_bytes} above the HYBRID floors {floor} do not fit the shared headroom "
                         f"({limit - sum(floor):.0f} bytes)")

    def fits(i: int, b: float) -> bool:
        if config.mode == MemoryMode.STATIC:
            return used[i] + b <= part[i]
        if config.mode == MemoryMode.DYNAMIC:
            return sum(used) + b <= limit
        above = sum(max(u - f, 0.0) for u, f in zip(used, floor))  # HYBRID: floors, then shared headroom
        head = max(limit - sum(floor), 0.0)
        return used[i] + b <= floor[i] or above - max(used[i] - floor[i], 0) + max(used[i] + b - floor[i], 0) <= head

    active: list[tuple[int, int, int, bool]] = []  # (end step, tenant, bytes, on device)
    by_step: dict[int, list] = {}
    for index, r in enumerate(requests):
        by_step.setdefault(r[0], []).append((index, *r))
    on_device: list[bool | None] = [None] * len(requests)
    series, failed, faults, served = [], 0, 0, 0  # series: device bytes of each tenant, per step
    for t in range(steps):
        for end, i, b, dev in [a for a in active if a[0] == t]:
            if dev:
                used[i] -= b
        active = [a for a in active if a[0] > t]
        for index, _, i, b, dur in by_step.get(t, []):
            served += 1
            dev = on_device[index] = fits(i, b)
            used[i] += b if dev else 0
            failed += not dev
            active.append((t + dur, i, b, dev))
        faults += sum(-(-b // page_size) for _, _, b, dev in active if not dev)
        series.append(list(used))
    by_tenant = np.array(series).reshape(steps, n)
    total = by_tenant.sum(axis=1)
    return {"mode": config.mode.name, "utilization": float(total.mean() / cap), "peak": float(total.max() / cap),
            "failed": failed, "served": served, "fault_pages": faults,
            "fault_s": faults * page_size / link_bandwidth, "used": total, "used_by_tenant": by_tenant,
            "on_device": on_device}
