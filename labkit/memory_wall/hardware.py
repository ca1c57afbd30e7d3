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

from ..tinylm import KVCache


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
    """Main-memory bandwidth in bytes/s, on float32 arrays of `nbytes` bytes (default 256 MiB, larger than
    the caches of laptop, desktop and most server CPUs):

      read:          `np.sum(a)` on one core, bytes read / time
      copy:          `np.copyto(b, a)` on one core, (bytes read + bytes written) / time (STREAM's convention)
      read_threads:  torch's `a.sum()` with every thread torch uses: what a model's forward pass can draw

    One core often cannot saturate the memory bus; `read_threads` is the figure for decode ceilings.
    Both arrays are written once before timing, so first-touch page faults are not counted. Each figure is
    the best of `repeats` runs. Returns {"read", "copy", "read_threads", "threads", "array_bytes",
    "repeats"}."""
    _check_count("nbytes", nbytes, 2**20)
    _check_count("repeats", repeats, 1)
    n = nbytes // 4
    a = np.ones(n, dtype=np.float32)
    b = np.zeros(n, dtype=np.float32)
    t = torch.from_numpy(a)  # the same memory, no copy
    with tqdm(total=3 * repeats, desc="bandwidth", disable=not progress) as bar:
        read_s = _best_time(lambda: np.sum(a), repeats, bar)
        copy_s = _best_time(lambda: np.copyto(b, a), repeats, bar)
        threads_s = _best_time(lambda: t.sum(), repeats, bar)
    return {"read": a.nbytes / read_s, "copy": 2 * a.nbytes / copy_s, "read_threads": a.nbytes / threads_s,
            "threads": torch.get_num_threads(), "array_bytes": a.nbytes, "repeats": repeats}


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


def measure_gemv(rows: int = 4096, cols: int = 4096, n_matrices: int = 8, dtype: torch.dtype = torch.float32,
                 repeats: int = 5, progress: bool = True) -> dict:
    """Batch-1 decoding in miniature: y = W x for `n_matrices` distinct [rows, cols] weights in turn (by
    default 8 x 64 MiB in FP32, more than common CPU caches hold, so every weight comes from memory).
    Returns seconds per matrix-vector product and the effective rates: {"seconds", "bytes_per_s"
    (weight bytes / time), "flops_per_s" (2 rows cols / time), "intensity" (FLOP/byte), "weight_bytes"}."""
    for name, v, lo in (("rows", rows, 1), ("cols", cols, 1), ("n_matrices", n_matrices, 1),
                        ("repeats", repeats, 1)):
        _check_count(name, v, lo)
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype!r}")
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(n_matrices)]
    x = torch.randn(1, cols, generator=g).to(dtype)

    def sweep():
        for w in weights:
            torch.nn.functional.linear(x, w)

    sweep()
    with tqdm(total=repeats, desc="matrix-vector", disable=not progress) as bar:
        seconds = _best_time(sweep, repeats, bar) / n_matrices
    nbytes = weights[0].nbytes
    return {"seconds": seconds, "bytes_per_s": nbytes / seconds, "flops_per_s": 2 * rows * cols / seconds,
            "intensity": 2 * rows * cols / nbytes, "weight_bytes": nbytes}


@torch.no_grad()
def measure_decode(model, prompt_len: int = 64, new_tokens: int = 64, repeats: int = 3) -> dict:
    """Time a TinyLM (labkit.model) here: one prefill of `prompt_len` tokens, then `new_tokens` batch-1 decode
    steps with the KV cache. Returns {"prefill_s", "decode_s_per_token", "tokens_per_s"} (best of
    `repeats`)."""
    _check_count("prompt_len", prompt_len, 1)
    _check_count("new_tokens", new_tokens, 1)
    _check_count("repeats", repeats, 1)
    if prompt_len + new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"prompt_len + new_tokens must be <= {model.cfg.max_seq_len}, "
                         f"got {prompt_len} + {new_tokens}")
    device = next(model.parameters()).device
    prompt = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
    one = torch.zeros(1, 1, dtype=torch.long, device=device)
    best_prefill = best_decode = float("inf")
    for _ in range(repeats):
        cache = KVCache(model.cfg, 1, prompt_len + new_tokens, device=device)
        t0 = time.perf_counter()
        model(prompt, cache)  # the forward pass advances cache.length
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            model(one, cache)
        t2 = time.perf_counter()
        best_prefill, best_decode = min(best_prefill, t1 - t0), min(best_decode, (t2 - t1) / new_tokens)
    return {"prefill_s": best_prefill, "decode_s_per_token": best_decode, "tokens_per_s": 1 / best_decode}
