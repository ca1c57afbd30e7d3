"""labkit.kv_cache.BlockManager appends per second, measured in one run (goal: at least 500,000/s).

    python benchmarks/kv_cache_blocks.py [--repeats N]

Cases: 64 sequences appended round-robin to 4096 tokens each, block size 16, with prefix caching (each append
is followed by mark_computed, as PagedKVCache.advance does after the forward; every 16th one hashes a full
block) and without; and 1,000 forked children of one prompt appending 64 tokens each
(copy-on-write of the shared last block on each child's first append). Rates count append calls only (the
allocation of the prompts is outside the timed part); the median of `repeats` runs (timing.measure).
"""

import argparse

from labkit.course import timing
from labkit.kv_cache import BlockManager

GOAL = 500_000


def round_robin(caching: bool, n_seqs: int = 64, n_tokens: int = 4096):
    def setup():
        bm = BlockManager(n_seqs * (n_tokens // 16 + 1), 16, caching, vocab_size=256)
        for s in range(n_seqs):
            bm.allocate(s, [s % 256])
        return bm

    def run(bm):
        for i in range(n_tokens - 1):
            t = i % 256
            for s in range(n_seqs):
                bm.append(s, t)
                if caching:
                    bm.mark_computed(s, i + 2)
    return setup, run, n_seqs * (n_tokens - 1)


def forks(n_children: int = 1000, n_tokens: int = 64):
    def setup():
        bm = BlockManager(n_children * (n_tokens // 16 + 2) + 8, 16, vocab_size=256)
        bm.allocate("p", list(range(40)))
        for c in range(n_children):
            bm.fork("p", c)
        return bm

    def run(bm):
        for c in range(n_children):
            for t in range(n_tokens):
                bm.append(c, t)
    return setup, run, n_children * n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cases = {"round robin, prefix caching": round_robin(True), "round robin, no caching": round_robin(False),
             "1000 forks (copy-on-write)": forks()}
    for name, (setup, run, n) in cases.items():
        managers = iter([setup() for _ in range(args.repeats + 1)])
        t = timing.measure(lambda: run(next(managers)), repeats=args.repeats, warmup=1)
        rate = n / t.median
        verdict = "unreliable on this run (spread > 0.5)" if t.spread > 0.5 else ("met" if rate >= GOAL else "NOT met")
        print(f"{name:<30} {rate:>12,.0f} appends/s (spread {t.spread:.2f}; goal >= {GOAL:,}: {verdict})")


if __name__ == "__main__":
    main()
