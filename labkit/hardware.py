"""Measure this machine: memory bandwidth, matmul FLOP/s and, on a GPU, the host-to-device link.

Used by notebook 01_memory_wall (the roofline of *this* machine) and 03_int4_quantization (the effective
bandwidth of the INT4 matmul). Results are in bytes/s and FLOP/s; they move by about +-20% between runs,
so notebooks print them rounded and never compare them.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm.auto import tqdm


def _best_time(fn, repeats: int, bar=None) -> float:
    """Shortest of `repeats` timed calls (seconds): the run least disturbed by other work."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if bar is not None:
            bar.update(1)
    return best


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def measure_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, progress: bool = True) -> dict:
    """Main-memory bandwidth of one core, in bytes/s, with numpy on float32 arrays of `nbytes` bytes
    (default 256 MiB, far larger than any CPU cache):

      read: `np.sum(a)`, bytes read / time
      copy: `np.copyto(b, a)`, (bytes read + bytes written) / time, the STREAM convention

    Both arrays are written once before timing, so first-touch page faults are not counted. Each figure is
    the best of `repeats` runs. Returns {"read", "copy", "array_bytes", "repeats"}."""
    _check_count("nbytes", nbytes, 2**20)
    _check_count("repeats", repeats, 1)
    n = nbytes // 4
    a = np.ones(n, dtype=np.float32)
    b = np.zeros(n, dtype=np.float32)
    with tqdm(total=2 * repeats, desc="bandwidth", disable=not progress) as bar:
        read_s = _best_time(lambda: np.sum(a), repeats, bar)
        copy_s = _best_time(lambda: np.copyto(b, a), repeats, bar)
    return {"read": a.nbytes / read_s, "copy": 2 * a.nbytes / copy_s, "array_bytes": a.nbytes,
            "repeats": repeats}


def measure_flops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5,
                  progress: bool = True, device: str = "cpu") -> float:
    """Peak matmul throughput in FLOP/s: an n x n by n x n product counts 2 n^3 FLOP; best of `repeats`,
    after one warm-up, with torch's default thread count. `dtype` is torch.float32 or torch.bfloat16
    (or torch.float16 on a GPU)."""
    allowed = (torch.float32, torch.bfloat16, torch.float16)
    if dtype not in allowed:
        raise ValueError(f"dtype must be one of {allowed}, got {dtype!r}")
    _check_count("n", n, 16)
    _check_count("repeats", repeats, 1)
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device must be 'cpu' when no GPU is available, got {device!r}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    y = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)

    def run():
        torch.mm(x, y)
        if device != "cpu":
            torch.cuda.synchronize()

    run()
    with tqdm(total=repeats, desc=f"matmul {str(dtype).removeprefix('torch.')}", disable=not progress) as bar:
        return 2 * n**3 / _best_time(run, repeats, bar)


def measure_link_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, progress: bool = True) -> dict | None:
    """Host-to-device copy bandwidth in bytes/s, from pinned and from pageable host memory, or None when
    there is no GPU. Pinned memory can be copied by DMA directly; pageable memory is first staged through a
    pinned buffer by the driver, which is why it is slower."""
    _check_count("nbytes", nbytes, 2**20)
    _check_count("repeats", repeats, 1)
    if not torch.cuda.is_available():
        return None
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {"array_bytes": nbytes}
    with tqdm(total=2 * repeats, desc="host->device", disable=not progress) as bar:
        for kind, pinned in (("pageable", False), ("pinned", True)):
            src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)

            def copy():
                dst.copy_(src, non_blocking=pinned)
                torch.cuda.synchronize()

            copy()
            out[kind] = nbytes / _best_time(copy, repeats, bar)
    return out
