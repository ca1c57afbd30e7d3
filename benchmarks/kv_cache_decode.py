"""TinyLM batch-1 decoding with labkit.kv_cache.PagedKVCache against the contiguous KVCache, at a 256-token
context, measured in one run (goal: paged at least 70% of the contiguous tokens/s).

    python benchmarks/kv_cache_decode.py [--repeats N]

Each timed call rewinds both caches to the same 224-token prompt and decodes 32 teacher-forced tokens
(positions 224..255), the paged cache's 16-token blocks shuffled across the pool; the two are timed in turns
(labkit.course.timing.interleave), at 1 torch thread and at torch's default, and the ratio of medians is
printed with the spread. The simulated INT8 and FP8 caches (labkit.kv_cache.quantized: a quantize-dequantize
round trip of the whole history per step, no fused kernel) are timed beside them for notebook 05's honest
CPU figure.
"""

import argparse

import torch

from labkit.course import timing
from labkit.kv_cache import speed
from labkit.tinylm import load_pretrained

STEPS, CONTEXT, GOAL = 32, 256, 0.70


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    model, _ = load_pretrained()
    default_threads = torch.get_num_threads()
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        runs = speed.decode_runs(model, CONTEXT, STEPS, quantized=("int8", "fp8-e4m3"))
        t = timing.interleave(runs, repeats=args.repeats, warmup=2)
        rate = {name: STEPS / x.median for name, x in t.items()}
        ratio = rate["paged"] / rate["contiguous"]
        busy = max(x.spread for x in t.values()) > 0.5
        print(f"threads {threads}: " + ", ".join(f"{n} {r:,.0f} tokens/s (spread {t[n].spread:.2f})"
                                                for n, r in rate.items()))
        verdict = "unreliable on this run (spread > 0.5)" if busy else ("met" if ratio >= GOAL else "NOT met")
        print(f"  paged / contiguous = {ratio:.2f} (goal >= {GOAL}): {verdict}; "
              f"int8 / contiguous = {rate['int8'] / rate['contiguous']:.2f}, "
              f"fp8 / contiguous = {rate['fp8-e4m3'] / rate['contiguous']:.2f}")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
