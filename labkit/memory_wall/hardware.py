"""Measure this machine: memory bandwidth, matmul FLOP/s and, on a GPU, the host-to-device link.

Used by notebook 01_memory_wall (the roofline of *this* machine) and 03_int4_quantization (the effective
bandwidth of the INT4 matmul). Results are in bytes/s and FLOP/s; they move by about +-20% between runs,
so notebooks print them rounded and never compare them with fixed numbers. Every figure is timed with the
course's one timing helper (labkit.course.timing: measure, or interleave where figures are compared with
each other) and is the MEDIAN of its repeats, the typical run; each result keeps its Timing (median, best,
spread), from which labkit.memory_wall.verdicts decides whether a measurement can carry a conclusion.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from .._checks import check_bool, check_choice, check_int, check_positive_int, check_type, fail
from ..course import Timing, interleave, measure
from ..tinylm import KVCache, TinyLM

MIN_BYTES = 2**20  # below a MiB an array sits in cache, and the figure says nothing about memory
WARMUP_ROUNDS = 3  # untimed rounds first: freshly allocated memory reads slowly for a while


def _sizes(nbytes, repeats, progress) -> None:
    check_int("nbytes", nbytes, low=MIN_BYTES, unit="bytes")
    check_positive_int("repeats", repeats)
    check_bool("progress", progress)


def _dtype(dtype, allowed: tuple) -> torch.dtype:
    check_type("dtype", dtype, torch.dtype, "a torch.dtype")
    return check_choice("dtype", dtype, allowed)


READS = ("read", "copy", "read_threads")  # measure_bandwidth's figures


def _read_kernels(nbytes: int) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (kernel, bytes it moves per call) on float32 arrays of `nbytes` bytes, each written once
    first, so that first-touch page faults are not timed."""
    n = nbytes // 4
    a = np.ones(n, dtype=np.float32)
    b = np.zeros(n, dtype=np.float32)
    t = torch.from_numpy(a)  # the same memory, no copy
    return {"read_threads": (lambda: t.sum(), a.nbytes),    # torch, every thread it uses: THE roof
            "read": (lambda: np.sum(a), a.nbytes),          # numpy, one core
            "copy": (lambda: np.copyto(b, a), 2 * a.nbytes)}  # numpy, one core, read + write


def _gemv_kernel(rows: int, cols: int, n_matrices: int, dtype: torch.dtype) -> tuple[Callable[[], object], int]:
    """(y = W x for each of `n_matrices` distinct [rows, cols] weights in turn, weight bytes per sweep)."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(n_matrices)]
    x = torch.randn(1, cols, generator=g).to(dtype)

    def sweep():
        for w in weights:
            torch.nn.functional.linear(x, w)

    return sweep, n_matrices * weights[0].nbytes


def _gemv_rates(sweep: Timing, rows: int, cols: int, n_matrices: int, weight_bytes: int) -> dict:
    seconds = sweep.median / n_matrices
    return {"seconds": seconds, "bytes_per_s": weight_bytes / seconds, "flops_per_s": 2 * rows * cols / seconds,
            "intensity": 2 * rows * cols / weight_bytes, "weight_bytes": weight_bytes, "n_matrices": n_matrices}


def _in_turns(groups: list[dict[str, Callable[[], object]]], repeats: int, progress: bool,
              desc: str) -> dict[str, Timing]:
    """timing.interleave for each group of kernels in turn, one round at a time (WARMUP_ROUNDS untimed
    rounds first; a progress bar advances per round). Kernels of one group share the same moments of the
    machine's load. numpy's one-core kernels and torch's threaded ones go in separate groups: torch's
    worker threads keep spinning for a while after a kernel ends, which slows a one-core numpy loop that
    runs right after it by about a third on a 2-core machine."""
    times: dict[str, list[float]] = {name: [] for kernels in groups for name in kernels}
    with tqdm(total=repeats * len(groups), desc=desc, disable=not progress) as bar:
        for kernels in groups:
            for r in range(repeats):
                for name, t in interleave(kernels, repeats=1, warmup=WARMUP_ROUNDS if r == 0 else 0).items():
                    times[name] += t.times
                bar.update(1)
    return {name: Timing(tuple(v)) for name, v in times.items()}


def _groups(kernels: dict, extra: dict | None = None) -> list[dict[str, Callable[[], object]]]:
    """[numpy's one-core reads, torch's threaded kernels (the roof, plus `extra`)]."""
    return [{k: kernels[k][0] for k in ("read", "copy")}, {"read_threads": kernels["read_threads"][0], **(extra or {})}]


def _bandwidths(kernels: dict, timings: dict[str, Timing], nbytes: int, repeats: int) -> dict:
    out = {name: moved / timings[name].median for name, (_, moved) in kernels.items() if name in READS}
    return {**out, "threads": torch.get_num_threads(), "array_bytes": nbytes // 4 * 4, "repeats": repeats,
            "timings": {name: timings[name] for name in READS}}


def measure_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, progress: bool = True) -> dict:
    """Main-memory bandwidth in bytes/s, on float32 arrays of `nbytes` bytes (default 256 MiB, larger than
    the caches of laptop, desktop and most server CPUs), three ways:

      read_threads:  torch's `a.sum()` with every thread torch uses: what a model's forward pass can draw,
                     and the one figure notebooks use as this machine's roof
      read:          `np.sum(a)` on one core, bytes read / time (one core often cannot fill the memory bus)
      copy:          `np.copyto(b, a)` on one core, (bytes read + bytes written) / time (STREAM's convention)

    Each figure is the median of `repeats` rounds (the two numpy kernels timed in turns, then torch's);
    "timings" holds every Timing (median, best, spread), so a caller can tell a steady measurement from a
    disturbed one (labkit.memory_wall.verdicts). Returns
    {"read", "copy", "read_threads", "threads", "array_bytes", "repeats", "timings"}."""
    _sizes(nbytes, repeats, progress)
    kernels = _read_kernels(nbytes)
    timings = _in_turns(_groups(kernels), repeats, progress, "bandwidth")
    return _bandwidths(kernels, timings, nbytes, repeats)


def measure_memory(nbytes: int = 256 * 2**20, rows: int = 4096, cols: int = 4096, n_matrices: int = 8,
                   repeats: int = 7, progress: bool = True) -> dict:
    """measure_bandwidth's three reads and measure_gemv's matrix-vector sweep (FP32), the sweep timed in turns
    with torch's sum, so that the ratio of the product's read rate to the roof comes from the same moments
    of the machine's load (notebook 01, section 2). Returns measure_bandwidth's dict plus "gemv" (measure_gemv's dict,
    from the median sweep) and timings["gemv"], the Timing of one sweep over the `n_matrices` weights."""
    _sizes(nbytes, repeats, progress)
    for name, v in (("rows", rows), ("cols", cols), ("n_matrices", n_matrices)):
        check_positive_int(name, v)
    kernels = _read_kernels(nbytes)
    sweep, sweep_bytes = _gemv_kernel(rows, cols, n_matrices, torch.float32)
    timings = _in_turns(_groups(kernels, {"gemv": sweep}), repeats, progress, "bandwidth and matrix-vector")
    out = _bandwidths(kernels, timings, nbytes, repeats)
    out["timings"]["gemv"] = timings["gemv"]
    out["gemv"] = _gemv_rates(timings["gemv"], rows, cols, n_matrices, sweep_bytes // n_matrices)
    return out


def measure_flops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5,
                  progress: bool = True, device: str = "cpu") -> float:
    """Peak matmul throughput in FLOP/s: an n x n by n x n product counts 2 n^3 FLOP; the median of
    `repeats`, after one warm-up, with torch's default thread count. `dtype` is torch.float32 or torch.bfloat16
    (or torch.float16 on a GPU)."""
    _dtype(dtype, (torch.float32, torch.bfloat16, torch.float16))
    check_int("n", n, low=16)
    check_positive_int("repeats", repeats)
    check_bool("progress", progress)
    check_type("device", device, str)
    if device != "cpu" and not torch.cuda.is_available():
        fail("device", device, "'cpu' when no GPU is available")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    y = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)

    def run():
        torch.mm(x, y)
        if device != "cpu":
            torch.cuda.synchronize()

    with tqdm(total=repeats, desc=f"matmul {str(dtype).removeprefix('torch.')}", disable=not progress) as bar:
        return 2 * n**3 / measure(run, repeats, warmup=1, bar=bar).median


def measure_link_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, progress: bool = True) -> dict | None:
    """Host-to-device copy bandwidth in bytes/s, from pinned and from pageable host memory, or None when
    there is no GPU. Pinned memory can be copied by DMA directly; pageable memory is first staged through a
    pinned buffer by the driver, which is why it is slower."""
    _sizes(nbytes, repeats, progress)
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

            out[kind] = nbytes / measure(copy, repeats, warmup=1, bar=bar).median
    return out


def measure_gemv(rows: int = 4096, cols: int = 4096, n_matrices: int = 8, dtype: torch.dtype = torch.float32,
                 repeats: int = 5, progress: bool = True) -> dict:
    """Batch-1 decoding in miniature: y = W x for `n_matrices` distinct [rows, cols] weights in turn (by
    default 8 x 64 MiB in FP32, more than common CPU caches hold, so every weight comes from memory).
    Returns seconds per matrix-vector product (the median sweep of `repeats`) and the effective rates:
    {"seconds", "bytes_per_s" (weight bytes / time), "flops_per_s" (2 rows cols / time), "intensity"
    (FLOP/byte), "weight_bytes" (one matrix), "n_matrices", "timing" (the Timing of one sweep)}."""
    for name, v in (("rows", rows), ("cols", cols), ("n_matrices", n_matrices), ("repeats", repeats)):
        check_positive_int(name, v)
    _dtype(dtype, (torch.float32, torch.bfloat16))
    check_bool("progress", progress)
    sweep, sweep_bytes = _gemv_kernel(rows, cols, n_matrices, dtype)
    with tqdm(total=repeats, desc="matrix-vector", disable=not progress) as bar:
        timing = measure(sweep, repeats, warmup=1, bar=bar)
    return {**_gemv_rates(timing, rows, cols, n_matrices, sweep_bytes // n_matrices), "timing": timing}


@torch.no_grad()
def measure_decode(model: TinyLM, prompt_len: int = 64, new_tokens: int = 64, repeats: int = 5) -> dict:
    """Time a TinyLM here: one prefill of `prompt_len` tokens, then `new_tokens` batch-1 decode steps with the
    KV cache. Returns {"prefill_s", "decode_s_per_token", "tokens_per_s"}, each from the median of `repeats`
    after one warm-up, and "timings": {"prefill": Timing of one prefill, "decode": Timing of the
    `new_tokens` steps} (labkit.memory_wall.verdicts.against_ceiling reads the latter). Every repeat starts from
    the same state: the cache is rewound to empty (prefill) or to the prompt (decode), whose keys and values stay
    in place, so each decode repeat attends to the same context."""
    check_type("model", model, TinyLM, "a labkit.tinylm.TinyLM")
    check_positive_int("prompt_len", prompt_len, unit="tokens")
    check_positive_int("new_tokens", new_tokens, unit="tokens")
    check_positive_int("repeats", repeats)
    if prompt_len + new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"prompt_len + new_tokens must be <= {model.cfg.max_seq_len}, "
                         f"got {prompt_len} + {new_tokens}")
    device = next(model.parameters()).device
    prompt = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
    one = torch.zeros(1, 1, dtype=torch.long, device=device)
    cache = KVCache(model.cfg, 1, prompt_len + new_tokens, device=device)

    def prefill():
        cache.rewind(0)
        model(prompt, cache)  # the forward pass advances cache.length

    def decode():
        cache.rewind(prompt_len)
        for _ in range(new_tokens):
            model(one, cache)

    timings = {"prefill": measure(prefill, repeats, warmup=1),
               "decode": measure(decode, repeats, warmup=1)}  # the cache holds the prompt now
    decode_s = timings["decode"].median / new_tokens
    return {"prefill_s": timings["prefill"].median, "decode_s_per_token": decode_s, "tokens_per_s": 1 / decode_s,
            "timings": timings}
