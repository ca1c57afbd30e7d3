"""labkit.memory_wall.hardware.measure_bandwidth against a plain numpy measurement, in one run.

    python benchmarks/bandwidth.py

Goal (issue 3): measure_bandwidth() finishes in at most 3 s, and its read and copy figures agree within 25%
with a straightforward numpy timing taken in the same run (a different array, timed with one loop, no
warm-up tricks). Prints both and the ratios; copy the output into benchmarks/RESULTS.md.
"""

import time

import numpy as np

from labkit.memory_wall.hardware import measure_bandwidth


def plain_numpy(nbytes: int = 512 * 2**20, repeats: int = 3) -> dict:
    """The baseline: sum and copy a fresh 512 MiB array, median of `repeats` timings."""
    a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    b[:] = 0.0
    sums, copies = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.sum()
        t1 = time.perf_counter()
        b[:] = a
        t2 = time.perf_counter()
        sums.append(t1 - t0)
        copies.append(t2 - t1)
    return {"read": a.nbytes / np.median(sums), "copy": 2 * a.nbytes / np.median(copies)}


def main() -> None:
    t0 = time.perf_counter()
    ours = measure_bandwidth(progress=False)
    seconds = time.perf_counter() - t0
    base = plain_numpy()
    print(f"measure_bandwidth(): {seconds:.2f} s (goal <= 3 s), {ours['array_bytes'] / 2**20:.0f} MiB arrays")
    for key in ("read", "copy"):
        ratio = ours[key] / base[key]
        print(f"{key:<5} labkit {ours[key] / 1e9:6.1f} GB/s   plain numpy {base[key] / 1e9:6.1f} GB/s   "
              f"ratio {ratio:.2f} ({'within' if abs(ratio - 1) <= 0.25 else 'NOT within'} 25%)")
    print(f"read with {ours['threads']} torch threads: {ours['read_threads'] / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
