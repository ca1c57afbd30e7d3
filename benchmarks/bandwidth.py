"""labkit.memory_wall.hardware.measure_bandwidth against a plain numpy measurement, in one run.

    python benchmarks/bandwidth.py

Goal: measure_bandwidth() finishes in at most 3 s, and its read and copy figures agree within 25%
with a straightforward numpy timing taken in the same run (a different, larger array, the median of a few
timings, no warm-up). Both are timed with the course's one timing helper, labkit.course.timing.measure.
Prints both and the ratios; copy the output into benchmarks/RESULTS.md.
"""

import numpy as np

from labkit.course import timing
from labkit.memory_wall.hardware import measure_bandwidth


def plain_numpy(nbytes: int = 512 * 2**20, repeats: int = 3) -> dict:
    """The baseline: sum and copy a fresh 512 MiB array, median of `repeats` timings, no warm-up."""
    a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    b[:] = 0.0

    def copy():
        b[:] = a

    t = timing.interleave({"read": a.sum, "copy": copy}, repeats, warmup=0)  # in turns, as one loop would
    return {"read": a.nbytes / t["read"].median, "copy": 2 * a.nbytes / t["copy"].median}


def main() -> None:
    ours = {}
    seconds = timing.measure(lambda: ours.update(measure_bandwidth(progress=False)), repeats=1, warmup=0).best
    base = plain_numpy()
    print(f"measure_bandwidth(): {seconds:.2f} s (goal <= 3 s), {ours['array_bytes'] / 2**20:.0f} MiB arrays")
    for key in ("read", "copy"):
        ratio = ours[key] / base[key]
        print(f"{key:<5} labkit {ours[key] / 1e9:6.1f} GB/s   plain numpy {base[key] / 1e9:6.1f} GB/s   "
              f"ratio {ratio:.2f} ({'within' if abs(ratio - 1) <= 0.25 else 'NOT within'} 25%)")
    print(f"read with {ours['threads']} torch threads: {ours['read_threads'] / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
