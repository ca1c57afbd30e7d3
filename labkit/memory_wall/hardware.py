"""Measure this machine: memory bandwidth, matmul FLOP/s and, on a GPU, the host-to-device link.

Used by notebook 01_memory_wall (the roofline of *this* machine) and 03_int4_quantization (the effective
bandwidth of the INT4 matmul). Results are in bytes/s and FLOP/s; they move by about +-20% between runs,
so notebooks print them rounded and never compare them. Every figure is timed with the course's one timing
helper, labkit.course.timing.measure, and is the best of its repeats: the run least disturbed by other work.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from .._checks import check_bool, check_choice, check_int, check_positive_int, check_type, fail
from ..course import measure
from ..tinylm import KVCache, TinyLM

MIN_BYTES = 2**20  # below a MiB an array sits in cache, and the figure says nothing about memory


def _sizes(nbytes, repeats, progress) -> None:
    check_int("nbytes", nbytes, low=MIN_BYTES, unit="bytes")
    check_positive_int("repeats", repeats)
    check_bool("progress", progress)


def _dtype(dtype, allowed: tuple) -> torch.dtype:
    check_type("dtype", dtype, torch.dtype, "a torch.dtype")
    return check_choice("dtype", dtype, allowed)


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
    _sizes(nbytes, repeats, progress)
    n = nbytes // 4
    a = np.ones(n, dtype=np.float32)
    b = np.zeros(n, dtype=np.float32)
    t = torch.from_numpy(a)  # the same memory, no copy
    with tqdm(total=3 * repeats, desc="bandwidth", disable=not progress) as bar:
        read_s = measure(lambda: np.sum(a), repeats, warmup=0, bar=bar).best
        copy_s = measure(lambda: np.copyto(b, a), repeats, warmup=0, bar=bar).best
        threads_s = measure(lambda: t.sum(), repeats, warmup=0, bar=bar).best
    return {"read": a.nbytes / read_s, "copy": 2 * a.nbytes / copy_s, "read_threads": a.nbytes / threads_s,
            "threads": torch.get_num_threads(), "array_bytes": a.nbytes, "repeats": repeats}


def measure_flops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5,
                  progress: bool = True, device: str = "cpu") -> float:
    """Peak matmul throughput in FLOP/s: an n x n by n x n product counts 2 n^3 FLOP; best of `repeats`,
    after one warm-up, with torch's default thread count. `dtype` is torch.float32 or torch.bfloat16
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
        return 2 * n**3 / measure(run, repeats, warmup=1, bar=bar).best


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

            out[kind] = nbytes / measure(copy, repeats, warmup=1, bar=bar).best
    return out


def measure_gemv(rows: int = 4096, cols: int = 4096, n_matrices: int = 8, dtype: torch.dtype = torch.float32,
                 repeats: int = 5, progress: bool = True) -> dict:
    """Batch-1 decoding in miniature: y = W x for `n_matrices` distinct [rows, cols] weights in turn (by
    default 8 x 64 MiB in FP32, more than common CPU caches hold, so every weight comes from memory).
    Returns seconds per matrix-vector product and the effective rates: {"seconds", "bytes_per_s"
    (weight bytes / time), "flops_per_s" (2 rows cols / time), "intensity" (FLOP/byte), "weight_bytes"}."""
    for name, v in (("rows", rows), ("cols", cols), ("n_matrices", n_matrices), ("repeats", repeats)):
        check_positive_int(name, v)
    _dtype(dtype, (torch.float32, torch.bfloat16))
    check_bool("progress", progress)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(n_matrices)]
    x = torch.randn(1, cols, generator=g).to(dtype)

    def sweep():
        for w in weights:
            torch.nn.functional.linear(x, w)

    with tqdm(total=repeats, desc="matrix-vector", disable=not progress) as bar:
        seconds = measure(sweep, repeats, warmup=1, bar=bar).best / n_matrices
    nbytes = weights[0].nbytes
    return {"seconds": seconds, "bytes_per_s": nbytes / seconds, "flops_per_s": 2 * rows * cols / seconds,
            "intensity": 2 * rows * cols / nbytes, "weight_bytes": nbytes}


@torch.no_grad()
def measure_decode(model: TinyLM, prompt_len: int = 64, new_tokens: int = 64, repeats: int = 3) -> dict:
    """Time a TinyLM here: one prefill of `prompt_len` tokens, then `new_tokens` batch-1 decode steps with the
    KV cache. Returns {"prefill_s", "decode_s_per_token", "tokens_per_s"}, each the best of `repeats` after
    one warm-up. Every repeat starts from the same state: the cache is rewound to empty (prefill) or to the
    prompt (decode), whose keys and values stay in place, so each decode repeat attends to the same context."""
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

    prefill_s = measure(prefill, repeats, warmup=1).best
    decode_s = measure(decode, repeats, warmup=1).best / new_tokens  # the cache holds the prompt now
    return {"prefill_s": prefill_s, "decode_s_per_token": decode_s, "tokens_per_s": 1 / decode_s}
