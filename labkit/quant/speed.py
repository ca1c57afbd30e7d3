"""The batch-1 INT4 matmul against FP32 and BF16, timed in turns with a memory-roof kernel (notebook 03,
section 8; benchmarks/int4_matmul.py). One method, the one the notebook names:

  weights  `matrices` distinct [n, k] matrices (default 8 of 4096 x 4096: 512 MiB in FP32, 80 MiB in
           torch's INT4 layout: BF16 scales per 32, beyond the last-level cache), cycled, so that every call
           reads its weights from memory
  cases    FP32 and BF16 F.linear and INT4 QuantLinear (torch's INT4 kernel where it exists) on all of
           torch's threads; FP32 and INT4 again on one thread
  roofs    torch's a.sum() over a 256 MiB float32 array, on all threads (the kernel that lab 01's
           hardware.measure_bandwidth reports as "read_threads") and on one thread: what one and all cores
           can read, timed here with the matmuls
  timing   every case and the roof in turns (labkit.course.timing.interleave): round r runs each once, so
           that their ratios come from the same moments of the machine's load; each figure is the median
           of `repeats` rounds and keeps its Timing (median, best, spread)

The verdicts drawn from a run are in labkit.quant.verdicts. Units: seconds, bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from .._checks import check_int, check_positive_int, check_type, fail
from ..course import Timing, interleave
from ..memory_wall import hardware
from .linear import QuantLinear
from .qtensor import check_word, quantize, quantized_bytes
from .threads import torch_threads

FP32, BF16, INT4 = "FP32", "BF16", "INT4"
FP32_1, INT4_1 = "FP32 on 1 thread", "INT4 on 1 thread"
ROOF, ROOF_1 = "roof", "roof on 1 thread"
CASES = (FP32, BF16, INT4, FP32_1, INT4_1)  # the matmuls, in the order they are timed and printed
ROOFS = (ROOF, ROOF_1)
ROOF_BYTES = 256 * 2**20


@dataclass(frozen=True)
class MatmulRun:
    """One run of measure_matmuls (or recorded figures): `timings` {case: Timing of one sweep over the
    `matrices` weights} for every name in CASES, plus ROOF and ROOF_1: the Timing of one sum over `roof_bytes`;
    `weight_bytes` {case: bytes of one matrix as that case reads it}; `threads`: torch's thread count for
    the cases not marked "on 1 thread"; `path`: the INT4 layers' QuantLinear path."""
    timings: Mapping[str, Timing]
    weight_bytes: Mapping[str, int]
    n: int = 4096
    k: int = 4096
    matrices: int = 8
    roof_bytes: int = ROOF_BYTES
    threads: int = 2
    path: str = "int4pack"

    def __post_init__(self):
        for name in ("n", "k", "matrices", "roof_bytes", "threads"):
            check_positive_int(name, getattr(self, name))
        check_word("path", self.path, ("int4pack", "reference"))
        check_type("timings", self.timings, Mapping, "a dict of case -> Timing")
        check_type("weight_bytes", self.weight_bytes, Mapping, "a dict of case -> bytes")
        if set(self.timings) != set(CASES + ROOFS):
            fail("timings", sorted(self.timings), f"a Timing for each of {list(CASES + ROOFS)}")
        if set(self.weight_bytes) != set(CASES):
            fail("weight_bytes", sorted(self.weight_bytes), f"bytes for each of {list(CASES)}")
        for name, t in self.timings.items():
            check_type(f"timings[{name!r}]", t, Timing, "a labkit.course.Timing")
            if t.median <= 0:
                fail(f"timings[{name!r}]", t, "a Timing with a median > 0 seconds")
        for name, b in self.weight_bytes.items():
            check_positive_int(f"weight_bytes[{name!r}]", b, unit="bytes")
        object.__setattr__(self, "timings", MappingProxyType(dict(self.timings)))
        object.__setattr__(self, "weight_bytes", MappingProxyType(dict(self.weight_bytes)))

    def _case(self, case: str) -> str:
        if case not in self.weight_bytes:
            fail("case", case, f"one of {list(CASES)}")
        return case

    def seconds(self, case: str) -> float:
        """Median seconds of one matrix-vector product."""
        return self.timings[self._case(case)].median / self.matrices

    def bytes_per_s(self, case: str) -> float:
        """Weight bytes read per second (ROOF, ROOF_1: the sum's read rate, the memory roof)."""
        if case in ROOFS:
            return self.roof_bytes / self.timings[case].median
        return self.weight_bytes[self._case(case)] / self.seconds(case)

    @staticmethod
    def roof_of(case: str) -> str:
        """The roof measured on the same number of threads as `case`."""
        return ROOF_1 if case in (FP32_1, INT4_1) else ROOF

    def roof_share(self, case: str) -> float:
        """bytes_per_s(case) over the roof measured on the same number of threads."""
        return self.bytes_per_s(case) / self.bytes_per_s(self.roof_of(case))

    def flops_per_s(self, case: str) -> float:
        """2 n k FLOP per product over its median time."""
        return 2 * self.n * self.k / self.seconds(case)

    def intensity(self, case: str) -> float:
        """FLOP per weight byte: 0.5 for FP32, 1 for BF16, about 3.2 for INT4 with BF16 scales and zeros."""
        return 2 * self.n * self.k / self.weight_bytes[self._case(case)]

    def lines(self) -> list[str]:
        """One line per roof and per case: time, GFLOP/s, GB/s of weights read and its share of the roof on
        the same number of threads, spread."""
        rows = [f"{r:<17} torch sum over {self.roof_bytes / 2**20:.0f} MiB on {n}: {self.bytes_per_s(r) / 1e9:5.1f} "
                f"GB/s (spread {self.timings[r].spread:.0%})"
                for r, n in ((ROOF, f"{self.threads} threads"), (ROOF_1, "1 thread"))]
        return rows + [f"{c:<17} {self.seconds(c) * 1e3:7.2f} ms {self.flops_per_s(c) / 1e9:6.1f} GFLOP/s "
                       f"{self.bytes_per_s(c) / 1e9:5.1f} GB/s of weights = {self.roof_share(c):4.0%} of its roof "
                       f"(spread {self.timings[c].spread:.0%})" for c in CASES]


def int4_weight_bytes(layer: QuantLinear) -> int:
    """Bytes an INT4 forward reads for one layer: the kernel's packed codes and its BF16 scales and zeros
    (about 5 bits per weight in groups of 32), or on the reference path the packed codes with fp16 scales
    and zero points."""
    check_type("layer", layer, QuantLinear, "a labkit.quant.QuantLinear")
    if layer.int4pack is not None:
        return (layer.int4pack.numel() * layer.int4pack.element_size()
                + layer.scales_and_zeros.numel() * layer.scales_and_zeros.element_size())
    return quantized_bytes(layer.out_features * layer.in_features, layer.bits, layer.group_len, layer.scheme)


def _one_thread(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with torch_threads(1):
            fn()
    return run


def measure_matmuls(n: int = 4096, k: int = 4096, matrices: int = 8, repeats: int = 9,
                    roof_bytes: int = ROOF_BYTES, group_size: int = 32) -> MatmulRun:
    """Time the cases and the roof of the module docstring in turns (one warm-up round, then `repeats`
    rounds). The weights are seeded (torch.Generator, seed 0): N(0, 0.02^2), INT4 asymmetric in groups of
    `group_size`."""
    for name, v in (("n", n), ("k", k), ("matrices", matrices), ("repeats", repeats), ("group_size", group_size)):
        check_positive_int(name, v)
    check_int("roof_bytes", roof_bytes, 4, unit="bytes (one float32 at least)")
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(matrices)]
    layers = [QuantLinear(quantize(w, 4, "asym", group_size)) for w in weights]
    bf16 = [w.bfloat16() for w in weights]
    x = torch.randn(1, k, generator=gen)
    x16 = x.bfloat16()
    roof = torch.ones(roof_bytes // 4)
    fp32 = lambda: [F.linear(x, w) for w in weights]  # noqa: E731
    int4 = lambda: [m(x) for m in layers]  # noqa: E731
    cases = {FP32: fp32, BF16: lambda: [F.linear(x16, w) for w in bf16], INT4: int4,
             FP32_1: _one_thread(fp32), INT4_1: _one_thread(int4), ROOF: lambda: roof.sum(),
             ROOF_1: _one_thread(lambda: roof.sum())}
    timings = interleave(cases, repeats=repeats, warmup=1)
    nbytes = {FP32: 4 * n * k, BF16: 2 * n * k, INT4: int4_weight_bytes(layers[0])}
    nbytes.update({FP32_1: nbytes[FP32], INT4_1: nbytes[INT4]})
    return MatmulRun(timings, nbytes, n, k, matrices, roof.nbytes, torch.get_num_threads(), layers[0].path(x))


def measure_peaks(n: int = 1024, repeats: int = 5) -> tuple[float, float]:
    """(FP32 matmul FLOP/s on all of torch's threads, on one thread): lab 01's hardware.measure_flops,
    the compute ceilings of the rooflines the run is drawn on."""
    peak_all = hardware.measure_flops(torch.float32, n=n, repeats=repeats, progress=False)
    with torch_threads(1):
        peak_one = hardware.measure_flops(torch.float32, n=n, repeats=repeats, progress=False)
    return peak_all, peak_one
