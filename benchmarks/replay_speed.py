"""Page-access replay speed of labkit.unified_memory, measured in one run.

    python benchmarks/replay_speed.py [--quick]

Goal (issue 5): at least 1,000,000 page accesses per second on 2 cores, so that one decode step of a
70B model at 4 KiB pages (about 34 million page accesses) replays in seconds. The traces are TinyLM's
recorded decode steps scaled to the Llama-2 7B / 70B layouts (FP16 weights, FP16 KV cache of 4096
positions). Baseline: the same simulator fed one page per call (a Python loop per page), on the first
pages of the same trace. Prints accesses/s per scenario and the ratio; copy the output into RESULTS.md.

Then the cases that do not take a batched path, on synthetic traces (labkit.unified_memory.explore.synthetic_trace,
4096 pages of 4 KiB, device = 1024 pages, 200,000 accesses): clock without prefetch on a sweep (batched
since _clock_run), LRU on random pages (every fault alone), density prefetch on a sweep (every fault
alone), each against the same pool fed one page per call on the first 20,000 accesses.
"""

import sys
import time

import numpy as np

from labkit import specs
from labkit.tinylm import load_pretrained
from labkit.tinylm import record_decode_trace
from labkit.unified_memory.layouts import layout, scale_trace, total_bytes, trace_pages
from labkit.unified_memory import UnifiedMemory

GB = 10**9


def step_trace(spec, tiny_events, tiny_layout):
    lay = layout(spec, kv_tokens=4096)
    return trace_pages(scale_trace(tiny_events, spec, tiny_layout), lay), total_bytes(lay)


def replay(pages, nbytes, device_bytes, tokens, **kw):
    um = UnifiedMemory(device_bytes, 2 * nbytes, **kw)
    a = um.alloc(nbytes)
    per_token = []
    for _ in range(tokens):
        t0 = time.perf_counter()
        um.access_pages(pages + a.first_page)
        per_token.append(time.perf_counter() - t0)
    dt = sum(per_token)
    replay.last_token_rate = len(pages) / per_token[-1]
    return um, len(pages) * tokens / dt, dt


def synthetic_cases() -> None:
    from labkit.unified_memory.explore import synthetic_trace
    n_pages, dev, length = 4096, 1024, 200_000
    cases = [("sweep, clock, no prefetch", "sequential", {"eviction": "clock"}),
             ("sweep, LRU, no prefetch", "sequential", {}),
             ("random, LRU, no prefetch", "random", {}),
             ("random, clock, no prefetch", "random", {"eviction": "clock"}),
             ("sweep, LRU, density prefetch", "sequential", {"prefetch": "density"}),
             ("sweep, clock, density prefetch", "sequential", {"eviction": "clock", "prefetch": "density"}),
             ("sweep, LRU, sequential prefetch", "sequential", {"prefetch": "sequential"})]
    print(f"synthetic traces: {n_pages} pages, device {dev} pages, {length:,} accesses")
    for label, kind, kw in cases:
        trace = synthetic_trace(kind, n_pages, length)
        rates = []
        for per_call in (False, True):
            um = UnifiedMemory(dev * 4096, n_pages * 4096, **kw)
            a = um.alloc(n_pages * 4096)
            t = trace[:20_000] if per_call else trace
            t0 = time.perf_counter()
            if per_call:
                for p in (t + a.first_page).tolist():
                    um.access_pages(np.array([p]))
            else:
                um.access_pages(t + a.first_page)
            rates.append(len(t) / (time.perf_counter() - t0))
        print(f"  {label:34s} {rates[0] / 1e6:6.3f} M accesses/s (faults {um.stats.faults / len(t):.0%} of accesses); "
              f"one page per call {rates[1] / 1e6:.3f} M/s = {rates[0] / rates[1]:.1f}x")


def main(quick: bool) -> None:
    synthetic_cases()
    model, tok = load_pretrained()
    events = record_decode_trace(model, tok.encode("The memory wall"), 1)[0]
    tiny = layout(specs.model("tinylm"), bytes_per_weight=4)
    names = ["llama-2-7b"] if quick else ["llama-2-7b", "llama-2-70b"]
    for name in names:
        pages, nbytes = step_trace(specs.model(name), events, tiny)
        print(f"{name}: {len(pages):,} page accesses per decode step (4 KiB pages), layout {nbytes / GB:.1f} GB")
        small = nbytes // 2  # oversubscribed: the device holds half of the layout
        cases = [("fits (device = 2x the layout), LRU", 2 * nbytes, {}),
                 ("oversubscribed, LRU, no prefetch", small, {}),
                 ("oversubscribed, LRU, density prefetch", small, {"prefetch": "density"})]
        if name == "llama-2-7b":
            cases += [("oversubscribed, clock, density prefetch", small, {"eviction": "clock", "prefetch": "density"}),
                      ("oversubscribed, LRU, sequential prefetch", small, {"prefetch": "sequential"})]
        for label, dev, kw in cases:
            um, rate, dt = replay(pages, nbytes, dev, 2, **kw)
            s = um.stats
            print(f"  {label:42s} device {dev / GB:5.1f} GB: 2 tokens in {dt:5.2f} s = {rate / 1e6:5.2f} M "
                  f"accesses/s (faults {s.faults:,}, hits {s.hits:,})")
            if dev == 2 * nbytes:
                print(f"  {'  second token alone (all hits)':42s} {replay.last_token_rate / 1e6:6.1f} M accesses/s")
    pages, nbytes = step_trace(specs.model("llama-2-7b"), events, tiny)
    n = 20_000
    um = UnifiedMemory(nbytes // 2, 2 * nbytes)
    a = um.alloc(nbytes)
    t0 = time.perf_counter()
    for p in (pages[:n] + a.first_page).tolist():
        um.access_pages(np.array([p]))
    loop_rate = n / (time.perf_counter() - t0)
    _, rate, _ = replay(pages, nbytes, nbytes // 2, 1)
    print(f"baseline, one page per call: {loop_rate / 1e6:.3f} M accesses/s; vectorized on the same kind of "
          f"replay (7B, half fits, LRU): {rate / 1e6:.2f} M/s = {rate / loop_rate:.0f}x")


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
