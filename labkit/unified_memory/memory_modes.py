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


class MemoryMode(IntEnum):
    STATIC = 1
    DYNAMIC = 2
    HYBRID = 3


@dataclass(frozen=True)
class PoolConfig:
    mode: MemoryMode
    max_gpu_mem: int          # bytes of device memory the pool may manage
    threshold: float = 0.8    # DYNAMIC/HYBRID: fill the device up to this fraction
    floor_fraction: float = 0.5  # HYBRID: share of each tenant's STATIC partition kept as its floor

    @property
    def GPU_MEM_THRESHOLD(self) -> float:  # the source material's names  # noqa: N802
        return self.threshold

    @property
    def MAX_GPU_MEM(self) -> int:  # noqa: N802
        return self.max_gpu_mem


def configure_memory(mode, max_gpu_mem: int, threshold: float = 0.8, floor_fraction: float = 0.5) -> PoolConfig:
    """A PoolConfig for `mode` (a MemoryMode, or 1/2/3, or "static"/"dynamic"/"hybrid")."""
    try:
        mode = MemoryMode[mode.upper()] if isinstance(mode, str) else MemoryMode(mode)
    except (KeyError, ValueError):
        raise ValueError(f"mode must be a MemoryMode (STATIC=1, DYNAMIC=2, HYBRID=3), got {mode!r}") from None
    if not isinstance(max_gpu_mem, int) or isinstance(max_gpu_mem, bool) or max_gpu_mem < 1:
        raise ValueError(f"max_gpu_mem must be a positive int (bytes), got {max_gpu_mem!r}")
    for name, v in (("threshold", threshold), ("floor_fraction", floor_fraction)):
        if not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError(f"{name} must be a number in (0, 1], got {v!r}")
    return PoolConfig(mode, max_gpu_mem, float(threshold), float(floor_fraction))


def make_requests(steps: int, rates: list[float], kv_bytes: list[int], mean_duration: float = 20.0,
                  seed: int = 0) -> list[tuple[int, int, int, int]]:
    """Random requests (arrival step, tenant, kv bytes, duration in steps): Poisson arrivals with
    `rates[i]` requests per step for tenant i, each holding kv_bytes[i] for an exponential duration."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(mean_duration, (int, float)) or isinstance(mean_duration, bool) \
            or not np.isfinite(mean_duration) or mean_duration <= 0:
        raise ValueError(f"mean_duration must be a positive number of steps, got {mean_duration!r}")
    if len(rates) != len(kv_bytes) or not rates or min(rates) < 0 or min(kv_bytes) < 1:
        raise ValueError(f"rates ({rates!r}) and kv_bytes ({kv_bytes!r}) must be equally long, rates >= 0, "
                         f"kv_bytes >= 1")
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        for i, rate in enumerate(rates):
            for _ in range(int(rng.poisson(rate))):
                out.append((t, i, int(kv_bytes[i]), 1 + int(rng.exponential(mean_duration))))
    return out


def simulate_tenants(config: PoolConfig, weight_bytes: list[int], shares: list[float], requests,
                     steps: int, page_size: int = 4096, link_bandwidth: float = 25e9) -> dict:
    """Run `requests` (from make_requests) for `steps` steps under `config`.

    weight_bytes[i]: tenant i's model weights; shares[i]: its fraction of the device in STATIC mode
    (they sum to at most 1). Returns utilization (mean device bytes in use / max_gpu_mem), peak,
    failed (requests whose KV went to the host), fault_pages (pages of page_size bytes read from host
    memory, summed over all steps: every step, each request on the host reads its whole KV cache over the
    link), fault_s (fault_pages * page_size / link_bandwidth: seconds the link spends on them, a lower
    bound that leaves out per-fault latency), served (requests), and per-step `used` bytes."""
    if not isinstance(config, PoolConfig):
        raise TypeError(f"config must be a PoolConfig (from configure_memory), got {type(config).__name__}")
    if len(weight_bytes) != len(shares) or sum(shares) > 1 + 1e-9 or min(shares) <= 0:
        raise ValueError(f"shares {shares!r} must be positive, one per tenant ({len(weight_bytes)}), sum <= 1")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be a positive int (bytes), got {page_size!r}")
    if not isinstance(link_bandwidth, (int, float)) or not np.isfinite(link_bandwidth) or link_bandwidth <= 0:
        raise ValueError(f"link_bandwidth must be a positive number (bytes/s), got {link_bandwidth!r}")
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
    for r in requests:
        by_step.setdefault(r[0], []).append(r)
    series, failed, faults, served = [], 0, 0, 0
    for t in range(steps):
        for end, i, b, dev in [a for a in active if a[0] == t]:
            if dev:
                used[i] -= b
        active = [a for a in active if a[0] > t]
        for _, i, b, dur in by_step.get(t, []):
            served += 1
            dev = fits(i, b)
            used[i] += b if dev else 0
            failed += not dev
            active.append((t + dur, i, b, dev))
        faults += sum(-(-b // page_size) for _, _, b, dev in active if not dev)
        series.append(sum(used))
    series = np.array(series)
    return {"mode": config.mode.name, "utilization": float(series.mean() / cap), "peak": float(series.max() / cap),
            "failed": failed, "served": served, "fault_pages": faults,
            "fault_s": faults * page_size / link_bandwidth, "used": series}
