"""MatmulRun's figures against hand arithmetic on recorded timings, its refusals, and a small real run of
measure_matmuls (sizes only: timings are never asserted)."""
import pytest
import torch

from labkit.course import Timing
from labkit.quant import QuantLinear, quantize, quantized_bytes, speed
from labkit.quant.speed import BF16, CASES, FP32, FP32_1, INT4, INT4_1, ROOF, ROOF_1, ROOFS, MatmulRun

from ..refusals import assert_refused

N = K = 4096
BYTES = {FP32: 4 * N * K, BF16: 2 * N * K, INT4: 10_485_760, FP32_1: 4 * N * K, INT4_1: 10_485_760}
MS = {FP32: 21.2, BF16: 11.5, INT4: 2.2, FP32_1: 21.1, INT4_1: 4.2, ROOF: 3.5, ROOF_1: 6.25}  # per sweep / sum


def run(**changes) -> MatmulRun:
    timings = {k: Timing((v / 1e3,) * 3) for k, v in MS.items()}
    return MatmulRun(**{"timings": timings, "weight_bytes": BYTES, **changes})


def test_figures_are_per_product_from_the_medians():
    r = run()
    assert r.seconds(FP32) == pytest.approx(21.2e-3 / 8)
    assert r.bytes_per_s(INT4_1) == pytest.approx(10_485_760 / (4.2e-3 / 8))
    assert r.bytes_per_s(ROOF) == pytest.approx(256 * 2**20 / 3.5e-3)
    assert r.roof_share(FP32_1) == pytest.approx((4 * N * K / (21.1e-3 / 8)) / (256 * 2**20 / 6.25e-3))
    assert r.roof_share(BF16) == pytest.approx((2 * N * K / (11.5e-3 / 8)) / (256 * 2**20 / 3.5e-3))
    assert r.flops_per_s(INT4) == pytest.approx(2 * N * K / (2.2e-3 / 8))
    assert [r.intensity(c) for c in (FP32, BF16)] == [0.5, 1.0]
    assert r.intensity(INT4) == pytest.approx(3.2)


def test_lines_show_every_roof_and_case():
    lines = run().lines()
    assert len(lines) == len(ROOFS) + len(CASES)
    assert lines[0] == "roof              torch sum over 256 MiB on 2 threads:  76.7 GB/s (spread 0%)"
    assert lines[2].startswith("FP32                 2.65 ms   12.7 GFLOP/s  25.3 GB/s of weights =  33% of its roof")


def test_bad_runs_are_refused():
    timings = {k: Timing((v / 1e3,)) for k, v in MS.items()}
    del timings[ROOF_1]
    with pytest.raises(ValueError, match=r"timings must be a Timing for each of \['FP32', 'BF16'"):
        MatmulRun(timings, BYTES)
    with pytest.raises(TypeError, match=r"timings\['roof on 1 thread'\] must be a labkit.course.Timing, got float"):
        MatmulRun({**timings, ROOF_1: 0.006}, BYTES)
    assert_refused(lambda: run(weight_bytes={**BYTES, INT4: 0}), ValueError, "weight_bytes['INT4']", 0,
                   "a positive int (bytes)")
    assert_refused(lambda: run(threads=0), ValueError, "threads", 0, "a positive int")
    assert_refused(lambda: run(path="cuda"), ValueError, "path", "cuda", "one of ('int4pack', 'reference')")
    with pytest.raises(ValueError, match="case must be one of"):
        run().seconds("FP16")


def test_int4_bytes_are_what_each_path_reads():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    kernel = QuantLinear(quantize(w, 4, "asym", 32))
    if kernel.int4pack is not None:  # packed codes, then a BF16 (scale, zero) per group of 32
        assert speed.int4_weight_bytes(kernel) == 64 * 128 // 2 + (128 // 32) * 64 * 2 * 2
    narrow = QuantLinear(quantize(w[:8], 4, "asym", 32))  # 8 outputs: the kernel needs a multiple of 16
    assert narrow.int4pack is None
    assert speed.int4_weight_bytes(narrow) == quantized_bytes(8 * 128, 4, 32, "asym")
    with pytest.raises(TypeError, match="layer must be a labkit.quant.QuantLinear"):
        speed.int4_weight_bytes(torch.nn.Linear(4, 4))


def test_a_small_real_run_has_every_figure():
    threads = torch.get_num_threads()
    r = speed.measure_matmuls(n=64, k=128, matrices=2, repeats=2, roof_bytes=2**20)
    assert set(r.timings) == set(CASES + ROOFS) and all(len(t.times) == 2 for t in r.timings.values())
    assert (r.n, r.k, r.matrices, r.roof_bytes, r.threads) == (64, 128, 2, 2**20, threads)
    assert r.weight_bytes[FP32] == 4 * 64 * 128 and r.weight_bytes[BF16] == 2 * 64 * 128
    assert r.path in ("int4pack", "reference") and torch.get_num_threads() == threads
    assert_refused(lambda: speed.measure_matmuls(repeats=0), ValueError, "repeats", 0, "a positive int")
    assert_refused(lambda: speed.measure_matmuls(roof_bytes=3), ValueError, "roof_bytes", 3, "an int >= 4")


def test_peaks_are_measured_on_all_threads_and_one():
    peak_all, peak_one = speed.measure_peaks(n=64, repeats=1)
    assert peak_all > 0 and peak_one > 0
