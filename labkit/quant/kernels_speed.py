"""The INT4 GEMV ladder timed by lab 03's method (notebook 03, section 8; benchmarks/int4_matmul.py).

    weights  `matrices` (>= 2) distinct [n, k] INT4 matrices (asymmetric, groups of `group_size`; seeded
             N(0, 0.02^2)), each product, whichever case makes it, on the matrix after the one the product before
             it read: matrices - 1 other products come between two reads of one matrix, so that the weights
             come from memory (a case may meet the same matrix round after round)
    cases    each rung of labkit.quant.kernels.RUNGS and torch's INT4 kernel (QuantLinear's int4pack path,
             BF16 activations), each on every thread count in `threads`; the roof of each count: torch's
             a.sum() over speed.ROOF_BYTES (labkit.quant.speed's roof kernel)
    timing   labkit.course.interleave, in two groups: the slow rungs 1-2 (`slow_repeats` rounds, a product per
             sample) and the rest with the roofs (`repeats` rounds; a sample of a rung or of torch's kernel is
             `matrices` products in a row, one per matrix, divided by `matrices`), every case of a group in
             turns; medians per product. The thread count is set once per sample: setting it (tens of
             microseconds with cold caches, beside a product that streamed megabytes through them) is the
             harness's time, not the kernel's, and added 3-5% to a 4096x4096 rung 7 product in a probe
    missing  a rung that cannot run on this machine (rungs 6-7 without a C compiler: kernels.available) is
             left out of the timings, with its reason in LadderRun.missing and on its line of the table

Bytes: what a product reads of its weight as it is stored (Int4Weight.nbytes: packed codes and float32
scales and zero points; torch's kernel: its packed codes and BF16 scales and zeros). Rung 1 also writes and
reads back an FP32 copy 8x larger: its "GB/s" counts only the stored weight, like every other row.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterator, Mapping

import torch

from .._checks import check_positive_int, check_type, fail
from ..course import Timing, interleave
from ..memory_wall import verdicts as wall
from . import kernels
from .qtensor import quantize
from .speed import ROOF_BYTES, int4_weight_bytes

TORCH = "torch int4pack (BF16 x)"
ROOF = "roof (torch sum)"
SLOW = tuple(kernels.RUNGS)[:2]
FAST = tuple(kernels.RUNGS)[2:]


def case(name: str, threads: int) -> str:
    """The key of `name` on `threads` threads in LadderRun.timings."""
    return f"{name} @{threads}"


@dataclass(frozen=True)
class LadderRun:
    """One run of measure_ladder: timings {case(name, threads): Timing of one product (or one roof sum)},
    weight_bytes {name: bytes one product reads}, the shape and the thread counts; missing {rung: why it did
    not run here}."""
    timings: Mapping[str, Timing]
    weight_bytes: Mapping[str, int]
    n: int
    k: int
    threads: tuple[int, ...]
    roof_bytes: int = ROOF_BYTES
    missing: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not set(self.missing) <= set(kernels.RUNGS):
            fail("missing", sorted(self.missing), f"names of rungs ({list(kernels.RUNGS)}) with a reason each")
        names = self.rungs + [TORCH]
        wanted = {case(c, t) for c in names + [ROOF] for t in self.threads}
        if set(self.timings) != wanted:
            fail("timings", sorted(self.timings), f"a Timing for each of {sorted(wanted)}")
        if set(self.weight_bytes) != set(names):
            fail("weight_bytes", sorted(self.weight_bytes), f"bytes for each of {names}")
        object.__setattr__(self, "timings", MappingProxyType(dict(self.timings)))
        object.__setattr__(self, "weight_bytes", MappingProxyType(dict(self.weight_bytes)))
        object.__setattr__(self, "missing", MappingProxyType(dict(self.missing)))

    @property
    def rungs(self) -> list[str]:
        """The rungs this run timed, in the ladder's order."""
        return [name for name in kernels.RUNGS if name not in self.missing]

    def seconds(self, name: str, threads: int) -> float:
        return self.timings[case(name, threads)].median

    def bytes_per_s(self, name: str, threads: int) -> float:
        """Weight bytes read per second (the roof: the sum's read rate)."""
        nbytes = self.roof_bytes if name == ROOF else self.weight_bytes[name]
        return nbytes / self.seconds(name, threads)

    def roof_share(self, name: str, threads: int) -> float:
        return self.bytes_per_s(name, threads) / self.bytes_per_s(ROOF, threads)

    def roof_shares(self, name: str, threads: int) -> list[float]:
        """roof_share per round: the rung's read rate over the roof's in the same round (interleave's rounds
        line up), the repeats labkit.course.evidence.against_goal judges a goal on."""
        rung, roof = self.timings[case(name, threads)].times, self.timings[case(ROOF, threads)].times
        return [self.weight_bytes[name] / t / (self.roof_bytes / r) for t, r in zip(rung, roof)]

    def flops_per_s(self, name: str, threads: int) -> float:
        return 2 * self.n * self.k / self.seconds(name, threads)

    def best(self, threads: int) -> str:
        """The fastest exact-or-not rung on `threads` threads."""
        return min(self.rungs, key=lambda r: self.seconds(r, threads))

    def lines(self) -> list[str]:
        """One line per case and thread count: ms, GFLOP/s, GB/s of weights, share of that count's roof."""
        out = []
        for t in self.threads:
            out.append(f"{ROOF + ' @' + str(t):<38} {self.bytes_per_s(ROOF, t) / 1e9:6.1f} GB/s "
                       f"({self.timings[case(ROOF, t)].spread_words()})")
            for name in list(kernels.RUNGS) + [TORCH]:
                if name in self.missing:
                    out.append(f"{name + ' @' + str(t):<38} not run here: {self.missing[name]}")
                    continue
                out.append(f"{name + ' @' + str(t):<38} {self.seconds(name, t) * 1e3:8.2f} ms "
                           f"{self.flops_per_s(name, t) / 1e9:6.1f} GFLOP/s {self.bytes_per_s(name, t) / 1e9:6.1f} "
                           f"GB/s {self.roof_share(name, t):5.0%} of roof "
                           f"({self.timings[case(name, t)].spread_words()})")
        return out

    def verdicts(self, threads: int) -> dict[str, wall.Verdict]:
        """{"vs torch": the best rung against torch's kernel, "roof": the best rung against the roof}, on
        `threads` threads, by labkit.memory_wall.verdicts' rules."""
        best = self.best(threads)
        pair = {f"rung {best} @{threads}": self.timings[case(best, threads)],
                f"{TORCH} @{threads}": self.timings[case(TORCH, threads)]}
        return {"vs torch": wall.speedup(pair, *pair),
                "roof": wall.against_roof(f"rung {best} @{threads}", self.weight_bytes[best],
                                          self.timings[case(best, threads)], f"the sum @{threads}",
                                          self.roof_bytes, self.timings[case(ROOF, threads)])}


def _cycled(fn: Callable, args: list, threads: int, calls: Iterator[int], products: int = 1) -> Callable[[], object]:
    """`products` calls of fn, each on args[c % len(args)], c the next number of `calls` (one counter for every
    case: each product takes the matrix after the one the product before it read, whichever case made it, so no
    case finds its weights in the cache; in a probe, rung 7 after rung 6 on the same 4096x4096 matrix took 11%
    less time), all on `threads` threads."""
    block = kernels.threads(threads)

    def run():
        with block:
            for _ in range(products):
                fn(*args[next(calls) % len(args)])
    return run


def measure_ladder(n: int = 4096, k: int = 4096, matrices: int = 8, repeats: int = 15, slow_repeats: int = 3,
                   threads: tuple[int, ...] = (1, 2), group_size: int = 32, roof_bytes: int = ROOF_BYTES) -> LadderRun:
    """Time the ladder as the module docstring says."""
    for name, v in (("n", n), ("k", k), ("matrices", matrices), ("repeats", repeats),
                    ("slow_repeats", slow_repeats), ("group_size", group_size), ("roof_bytes", roof_bytes)):
        check_positive_int(name, v)
    if matrices < 2:
        fail("matrices", matrices, "at least 2 (each product reads another matrix than the one before it)")
    check_type("threads", threads, tuple, "a tuple of thread counts")
    for t in threads:
        kernels.threads(t)  # refuses counts this machine cannot run
    missing = {}  # rung -> why it cannot run here
    for name in kernels.RUNGS:
        ok, why = kernels.available(name)
        if not ok:
            missing[name] = why
    gen = torch.Generator().manual_seed(0)
    qs = [quantize(torch.randn(n, k, generator=gen) * 0.02, 4, "asym", group_size) for _ in range(matrices)]
    x = torch.randn(1, k, generator=gen)
    weights = [kernels.pack_weight(q) for q in qs]
    if weights[0].lanes is None:
        for name in kernels.C_RUNGS:
            missing.setdefault(name, f"groups of {group_size} inputs (rungs 6-7 take a multiple of 8)")
    layers = [w.reference for w in weights]  # rung 2's QuantLinear also holds torch's packed copy
    if layers[0].int4pack is None:
        raise RuntimeError("torch's INT4 kernel is not available for this shape or torch build")
    roof = torch.ones(roof_bytes // 4)
    slow, fast = {}, {}
    calls = itertools.count()  # every product, in the order they run (the roof's sums read no matrix)
    for t in threads:
        for name in SLOW:
            slow[case(name, t)] = _cycled(kernels.RUNGS[name], [(x, w) for w in weights], t, calls)
        for name in (r for r in FAST if r not in missing):
            fast[case(name, t)] = _cycled(kernels.RUNGS[name], [(x, w) for w in weights], t, calls, matrices)
        fast[case(TORCH, t)] = _cycled(lambda m: m.forward_int4pack(x), [(m,) for m in layers], t, calls, matrices)
        fast[case(ROOF, t)] = _cycled(lambda r: r.sum(), [(roof,)], t, itertools.count())
    timings = interleave(slow, repeats=slow_repeats, warmup=1)
    roofs = {case(ROOF, t) for t in threads}  # a roof's sample is one sum, every other fast case's `matrices` products
    for name, timing in interleave(fast, repeats=repeats, warmup=2).items():
        timings[name] = timing if name in roofs else Timing(tuple(s / matrices for s in timing.times))
    nbytes = {name: weights[0].nbytes for name in kernels.RUNGS if name not in missing}
    nbytes[TORCH] = int4_weight_bytes(layers[0])
    return LadderRun(timings, nbytes, n, k, tuple(threads), roof.nbytes, missing)
