"""The course's one timing helper: every measurement cell, benchmark and `labkit.memory_wall.hardware`
function times code with it (notebooks 00-03 and benchmarks/).

On a shared 2-core laptop a single timing says little: `measure` takes the median (the typical run) and
the best (the run least disturbed by other work) of several, after a warm-up; `interleave` times several
candidates in turns, so that a change in the machine's load hits all of them alike and their ratio,
taken in the same run, stays meaningful. Seconds throughout.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from .._checks import check_positive_int


@dataclass(frozen=True)
class Timing:
    """Seconds per call of each timed repeat."""
    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: above ~0.5 the machine was busy while it measured."""
        return (max(self.times) - min(self.times)) / self.median if self.median > 0 else 0.0

    def spread_words(self) -> str:
        """"spread 12%" for a line of figures, or "1 sample" where there is no spread to tell."""
        return f"spread {self.spread:.0%}" if len(self.times) > 1 else "1 sample"


def measure(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, calls: int = 1, bar=None) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `repeats` timings of `calls` calls each (seconds per call).
    `bar`, a tqdm bar, is advanced once per repeat."""
    check_positive_int("repeats", repeats)
    check_positive_int("warmup", warmup, allow_zero=True)
    check_positive_int("calls", calls)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
        if bar is not None:
            bar.update(1)
    return Timing(tuple(times))


def interleave(fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
               calls: int = 1) -> dict[str, Timing]:
    """Time several functions in turns (round r times each of them once), so that their ratios come from
    the same moments of the machine's load. Returns {name: Timing}."""
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise TypeError(f"fns must be a non-empty dict of name -> callable, got {type(fns).__name__}")
    check_positive_int("repeats", repeats)
    check_positive_int("warmup", warmup, allow_zero=True)
    check_positive_int("calls", calls)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if r >= warmup:
                samples[name].append((time.perf_counter() - t0) / calls)
    return {name: Timing(tuple(v)) for name, v in samples.items()}
