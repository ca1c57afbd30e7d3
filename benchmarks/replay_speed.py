"""Page-access replay speed of labkit.unified_memory's paging loop, measured in one run.

    python benchmarks/replay_speed.py [--quick]        (--quick: no 70B, no fresh compile)

Goals: at least 20 M page accesses/s once compiled, on 2 cores, for random-page traces (4x
oversubscribed, LRU and clock) and for the Llama-2 7B / 70B decode traces; a 70B decode step at 4 KiB pages
(33.6 M accesses) in a few seconds; the one-time compile cost printed on its own line.

  compile   a fresh process with an empty numba cache (NUMBA_CACHE_DIR in a temporary folder) builds a pool
            and replays a few pages: numba compiles the loop; a second process finds it in that cache
  random    uniform random pages; 262,144 pages, device 65,536 pages (4x oversubscribed), 2,000,000 accesses
            (the FACTS.md prototype's case); and a small one ("small"): 4096 pages, device 1024, 200,000 accesses
  decode    TinyLM's recorded decode step scaled to the Llama-2 layouts (FP16 weights, FP16 KV cache of 4096
            positions), 4 KiB pages, replayed twice (2 tokens): the first token starts cold, the second is the
            steady state

Rates count every access of the call that replays it (checking the trace included), not pool set-up. The
"numpy engine" column quotes benchmarks/RESULTS.md's figures for the batched numpy engine, a replay without
numba (lab 02, idle machine, 2026-11-29).
"""

import os
import subprocess
import sys
import tempfile
import time

from labkit import specs
from labkit.tinylm import load_pretrained, record_decode_trace
from labkit.unified_memory import UnifiedMemory
from labkit.unified_memory.explore import synthetic_trace
from labkit.unified_memory.layouts import layout, step_pages, total_bytes

GB = 10**9
NUMPY_ENGINE = {  # M accesses/s recorded in RESULTS.md, lab 02, the numpy engine (absent: not measured)
    ("small", "lru"): 0.149, ("small", "clock"): 0.149,
    ("llama-2-7b", "fits, LRU"): 6.44, ("llama-2-7b", "half, LRU"): 3.50,
    ("llama-2-7b", "half, LRU, density"): 1.66, ("llama-2-7b", "half, clock, density"): 1.74,
    ("llama-2-7b", "half, LRU, sequential"): 7.53,
    ("llama-2-70b", "fits, LRU"): 6.05, ("llama-2-70b", "half, LRU"): 2.55, ("llama-2-70b", "half, LRU, density"): 1.25,
}
COMPILE = """
import time
t0 = time.perf_counter()
import numpy as np
from labkit.unified_memory import UnifiedMemory, density_node
t1 = time.perf_counter()
um = UnifiedMemory(4 * 4096, 64 * 4096, prefetch="density")
a = um.alloc(32 * 4096)
um.access_pages(np.arange(32) + a.first_page)
um.free(a)
density_node(np.zeros(4, bool), 1)
print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f}")
"""


def vs_numpy(key, rate: float) -> str:
    """'numpy engine 3.50 M/s: 29x' for a case RESULTS.md recorded, else ''."""
    numpy_rate = NUMPY_ENGINE.get(key)
    return f"   numpy engine {numpy_rate:5.2f} M/s: {rate / numpy_rate:4.0f}x" if numpy_rate else ""


def compile_cost() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, LABKIT_JIT="1")
        runs = [subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, check=True)
                .stdout.split() for _ in range(2)]
    (imp1, first), (imp2, cached) = [(float(a), float(b)) for a, b in runs]
    print(f"compile: {first:.2f} s in a fresh process with an empty cache (import {imp1:.2f} s); "
          f"{cached:.2f} s once cached (import {imp2:.2f} s)")


def timed_replay(pool, allocation, trace, repeat=1) -> list[float]:
    """Seconds of each access_pages call."""
    out, pages = [], trace + allocation.first_page
    for _ in range(repeat):
        t0 = time.perf_counter()
        pool.access_pages(pages)
        out.append(time.perf_counter() - t0)
    return out


def random_cases() -> None:
    for label, n_pages, device, length in (("random", 262_144, 65_536, 2_000_000), ("small", 4096, 1024, 200_000)):
        trace = synthetic_trace("random", n_pages, length, seed=0)
        print(f"{label}: {n_pages:,} pages, device {device:,} ({n_pages // device}x oversubscribed), "
              f"{length:,} random accesses")
        for eviction, settings in (("lru", {}), ("clock", {}), ("fifo", {}), ("lru", {"fault_batch": 256})):
            um = UnifiedMemory(device * 4096, n_pages * 4096, eviction=eviction, **settings)
            a = um.alloc(n_pages * 4096)
            um.access_pages(trace[:10] + a.first_page)  # not timed: the first call loads the compiled loop
            dt = timed_replay(um, a, trace)[0]
            rate = length / dt / 1e6
            tag = eviction + (" batch 256" if settings else "")
            extra = "" if settings else vs_numpy((label, eviction), rate)
            print(f"  {tag:16s} {rate:7.1f} M accesses/s (faults {um.stats.faults / um.stats.accesses:.0%}){extra}")


def decode_cases(quick: bool) -> None:
    model, tok = load_pretrained()
    steps = record_decode_trace(model, tok.encode("The memory wall"), 1)
    tiny = layout(specs.model("tinylm"), bytes_per_weight=4)
    for name in ["llama-2-7b"] if quick else ["llama-2-7b", "llama-2-70b"]:
        lay = layout(specs.model(name), kv_tokens=4096)
        pages, nbytes = step_pages(steps, specs.model(name), lay, tiny)[0], total_bytes(lay)
        print(f"{name}: {len(pages):,} page accesses per decode step (4 KiB pages), layout {nbytes / GB:.1f} GB")
        cases = [("fits, LRU", nbytes, {}), ("half, LRU", nbytes // 2, {}),
                 ("half, LRU, batch 256", nbytes // 2, {"fault_batch": 256}),
                 ("half, LRU, density", nbytes // 2, {"prefetch": "density"}),
                 ("half, clock, density", nbytes // 2, {"eviction": "clock", "prefetch": "density"}),
                 ("half, LRU, sequential", nbytes // 2, {"prefetch": "sequential"})]
        for label, device, settings in cases:
            um = UnifiedMemory(device, nbytes, **settings)
            a = um.alloc(nbytes)
            um.access_pages(pages[:1] + a.first_page)  # not timed: loads the compiled loop
            first, second = timed_replay(um, a, pages, repeat=2)
            rate = 2 * len(pages) / (first + second) / 1e6
            print(f"  {label:22s} device {device / GB:5.1f} GB: token 1 {first:5.2f} s, token 2 {second:5.2f} s = "
                  f"{rate:6.1f} M accesses/s (faults {um.stats.faults:,}){vs_numpy((name, label), rate)}")


def main(quick: bool) -> None:
    if not quick:
        compile_cost()
    random_cases()
    decode_cases(quick)


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
