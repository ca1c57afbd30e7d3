"""The course's ring all-reduce (gloo point-to-point sends) against gloo's own all_reduce.

    python benchmarks/parallel_collectives.py [repeats]

Goal: at 16 MB, on 2 and on 4 ranks, the course's ring reaches at least 50% of gloo's all_reduce bus
bandwidth (nccl-tests' definition: S / t x 2(N-1)/N), both measured in the same run by
labkit.parallel.gloo.time_worker (the slowest rank's time, median of `repeats`, the two methods in turns).
Run it alone: other jobs on the 2 cores move these numbers by 2x. Copy the output into benchmarks/RESULTS.md.
"""

import statistics
import sys

from labkit.parallel import Pool, bus_bandwidth, gloo

SIZE = 16 << 20


def main(repeats: int = 10) -> None:
    for world in (2, 4):
        with Pool(world) as pool:
            times = {"all_reduce": [], "ring_all_reduce": []}
            for _ in range(3):  # rounds in turns, so that a busy moment hits both methods alike
                for op in times:
                    times[op].append(pool.run(gloo.time_worker, op, [SIZE], repeats)[0][0])
        bw = {op: bus_bandwidth("all_reduce", SIZE, statistics.median(t), world) for op, t in times.items()}
        ratio = bw["ring_all_reduce"] / bw["all_reduce"]
        print(f"{world} ranks, 16 MB: gloo all_reduce {bw['all_reduce'] / 1e9:.2f} GB/s bus bandwidth, "
              f"course ring {bw['ring_all_reduce'] / 1e9:.2f} GB/s: ratio {ratio:.2f} "
              f"({'meets' if ratio >= 0.5 else 'misses'} the 0.5 goal)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
