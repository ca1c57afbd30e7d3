"""The INT4 matmul verdicts on recorded runs: a quiet run concludes from its own numbers, busy runs say
"unreliable" for exactly the figures a busy core spoils, and no recorded run turns a conclusion upside down.

Runs recorded with labkit.quant.speed.measure_matmuls on the course's 2-core machine (2026-12-01), in
milliseconds per sweep over 8 matrices of 4096 x 4096 (each roof: one sum over 256 MiB):
  QUIET    09:43, steady (its roof on 1 thread: the steady rounds of the 09:48 run, which has one)
  BUSY     09:48 while other torch jobs ran: INT4 on 2 threads collapsed in 3 of 9 rounds
  SPOILED  09:47, the same: every figure moved by 2-5x
  BROWSER  a steady run with a browser on one core: INT4 on 2 threads 0.5x FP32, on 1 thread 3.3x,
           FP32 at 19 GB/s
  ROOF_HIGH a roof read by another method (61.1 GB/s) against an FP32 that streams at 19 GB/s
"""
import pytest

from labkit.course import Timing
from labkit.quant import verdicts
from labkit.quant.speed import BF16, FP32, FP32_1, INT4, INT4_1, ROOF, ROOF_1, MatmulRun
from labkit.quant.verdicts import UNRELIABLE

N = K = 4096
INT4_BYTES = N * K // 2 + (K // 32) * N * 2 * 2  # packed codes + BF16 scale and zero per group of 32
BYTES = {FP32: 4 * N * K, BF16: 2 * N * K, INT4: INT4_BYTES, FP32_1: 4 * N * K, INT4_1: INT4_BYTES}


def ms(*values) -> Timing:
    return Timing(tuple(v / 1e3 for v in values))


QUIET = dict(FP32=(20.83, 21.20, 21.48, 21.34, 20.97, 21.20, 20.65, 21.21, 21.08),
             BF16=(11.34, 13.63, 11.51, 11.77, 11.55, 11.37, 11.37, 11.52, 11.73),
             INT4=(2.17, 2.25, 2.12, 2.23, 2.22, 2.14, 2.25, 2.27, 2.28),
             FP32_1=(20.97, 21.23, 21.45, 21.13, 20.97, 20.78, 21.14, 21.18, 20.97),
             INT4_1=(4.21, 4.34, 4.23, 4.28, 4.28, 4.16, 4.17, 4.13, 4.18),
             ROOF=(3.44, 3.50, 3.44, 3.51, 3.43, 3.42, 3.49, 3.59, 3.49),
             ROOF_1=(6.38, 6.28, 6.17, 6.31, 6.39, 6.35, 6.20, 6.30, 6.25))
BUSY = dict(FP32=(23.24, 21.8, 21.58, 21.79, 23.4, 21.38, 21.4, 21.78, 22.16),
            BF16=(59.27, 69.69, 8.61, 27.17, 63.14, 13.6, 8.6, 8.59, 8.6),
            INT4=(55.74, 67.11, 2.32, 2.23, 63.35, 2.27, 2.32, 2.23, 2.33),
            FP32_1=(29.05, 21.88, 21.56, 21.65, 28.28, 22.25, 21.74, 21.81, 21.88),
            INT4_1=(3.81, 3.75, 3.59, 3.7, 3.78, 3.71, 3.62, 3.62, 3.78),
            ROOF=(10.9, 5.46, 5.93, 8.07, 7.7, 5.47, 5.51, 5.44, 5.63),
            ROOF_1=(9.41, 6.38, 6.28, 10.33, 10.24, 6.17, 6.31, 6.39, 6.35))
SPOILED = dict(FP32=(57.86, 42.18, 49.73, 47.18, 53.73, 66.71, 45.8, 25.36, 22.18),
               BF16=(68.85, 37.32, 77.28, 103.08, 81.48, 87.5, 94.98, 17.7, 27.61),
               INT4=(21.72, 2.3, 10.76, 56.54, 29.67, 10.38, 103.82, 6.47, 57.19),
               FP32_1=(65.23, 56.14, 86.48, 69.04, 90.6, 82.17, 40.52, 26.33, 28.33),
               INT4_1=(7.38, 11.84, 8.96, 7.93, 8.62, 15.6, 5.13, 4.27, 4.35),
               ROOF=(27.36, 11.47, 9.3, 11.86, 16.27, 7.34, 9.62, 8.75, 10.28),
               ROOF_1=(10.66, 18.35, 20.17, 18.36, 23.73, 17.46, 10.48, 10.83, 6.96))
# FP32 at 19 GB/s: 8 x 64 MiB / 19e9 = 28.3 ms per sweep
BROWSER = dict(FP32=(28.3, 28.1, 28.6, 28.2, 28.4), BF16=(40.0, 40.5, 39.8, 40.2, 40.1),
               INT4=(56.6, 57.0, 56.1, 56.8, 56.4), FP32_1=(28.2, 28.4, 28.1, 28.3, 28.5),
               INT4_1=(8.6, 8.5, 8.6, 8.7, 8.5), ROOF=(4.4, 4.4, 4.5, 4.4, 4.4), ROOF_1=(6.1, 6.2, 6.1, 6.1, 6.2))
ROOF_HIGH = {**BROWSER, "ROOF_1": (4.4, 4.4, 4.5, 4.4, 4.4)}  # 61 GB/s "on one thread"
RUNS = {"quiet": QUIET, "busy": BUSY, "spoiled": SPOILED, "browser": BROWSER, "roof_high": ROOF_HIGH}


def recorded(figures: dict, threads: int = 2) -> MatmulRun:
    names = {"FP32": FP32, "BF16": BF16, "INT4": INT4, "FP32_1": FP32_1, "INT4_1": INT4_1, "ROOF": ROOF,
             "ROOF_1": ROOF_1}
    return MatmulRun({names[k]: ms(*v) for k, v in figures.items()}, BYTES, threads=threads)


def test_a_quiet_run_concludes_from_its_own_medians():
    v = verdicts.speed_verdicts(recorded(QUIET))
    assert all(x.reliable for x in v.values())
    assert v["headline"].ratio == pytest.approx(21.13 / 4.21, rel=1e-3)
    assert v["headline"].text.startswith("INT4 on 1 thread runs 5.0x as fast as FP32 on 1 thread (medians of 9")
    assert v["all threads"].text.startswith("INT4 on 2 threads runs 9.5x as fast as FP32 on 2 threads")
    share = (INT4_BYTES / 4.21) / (4 * N * K / 21.13)  # INT4's read rate over FP32's, on one thread
    assert v["memory"].ratio == pytest.approx(share, rel=1e-3)
    assert v["memory"].text.startswith("on 1 thread INT4 reads 6.4x fewer bytes than FP32 and runs 5.0x as fast: "
                                       f"it turns {share:.0%} of its byte saving into speed")
    assert v["memory"].text.endswith("limited by memory and by the work per byte both")


def test_a_busy_run_keeps_the_steady_headline_and_drops_the_rest():
    v = verdicts.speed_verdicts(recorded(BUSY))
    assert v["headline"].reliable and v["headline"].text.startswith("INT4 on 1 thread runs 5.9x as fast")
    assert v["all threads"].text.startswith(f"{UNRELIABLE} (the repeats of INT4 on 2 threads (0.00223-0.0671 s) "
                                            "and FP32 on 2 threads (0.0214-0.0234 s) overlap")
    assert v["memory"].text == f"{UNRELIABLE} (roof on 1 thread: spread 65% > 50%)"


def test_a_spoiled_run_keeps_only_the_direction_its_repeats_separate():
    v = verdicts.speed_verdicts(recorded(SPOILED))
    # every one of the 9 rounds had INT4 on 1 thread faster (4.3-15.6 ms against 26-91 ms): the direction holds
    assert v["headline"].reliable and v["headline"].text.startswith("INT4 on 1 thread runs 8.2x as fast")
    assert not v["all threads"].reliable and "overlap" in v["all threads"].text
    assert not v["memory"].reliable and v["memory"].text.startswith(UNRELIABLE)


def test_a_steady_run_with_a_core_taken_does_not_say_int4_is_slower():
    """With a browser on one core, the 2-thread ratio (0.5x) is unreliable and the 1-thread one is the headline:
    the notebook must not print "INT4 is 0.5x the speed of FP32"."""
    v = verdicts.speed_verdicts(recorded(BROWSER))
    assert v["headline"].reliable and v["headline"].text.startswith("INT4 on 1 thread runs 3.3x as fast")
    assert not v["all threads"].reliable and v["all threads"].ratio == pytest.approx(0.5, abs=0.01)
    assert v["all threads"].text == (f"{UNRELIABLE} (INT4 took 7.08 ms on 2 threads, 6.6x its 1.07 ms on 1: another "
                                     "program held a core, and a 2-thread kernel waits for its slowest thread)")


def test_a_roof_far_above_the_reference_is_not_believed():
    """A 61.1 GB/s roof while FP32 streams at 19 GB/s is unreliable: it must not give "INT4 is not memory-bound"."""
    v = verdicts.memory_bound(recorded(ROOF_HIGH))
    assert not v.reliable
    assert v.text == (f"{UNRELIABLE} (the FP32 reference read 19.0 GB/s, 31% of the 61.0 GB/s one thread reads, "
                      "outside the 40%-125% a memory-bound kernel reaches)")


@pytest.mark.parametrize("name", RUNS)
def test_no_recorded_run_says_int4_is_slower_than_fp32(name):
    v = verdicts.speed_verdicts(recorded(RUNS[name]))
    for key in ("headline", "all threads"):
        assert not v[key].reliable or (v[key].ratio > 1 and "slower" not in v[key].text), v[key].text
    assert v["headline"].reliable  # in every recorded run, INT4 on 1 thread won every round


@pytest.mark.parametrize("int4_ms, words", [(2.5, "memory-bound, like FP32"),
                                             (4.2, "limited by memory and by the work per byte both"),
                                             (8.0, "not memory-bound: the work per byte")])
def test_the_memory_verdict_has_a_wide_middle(int4_ms, words):
    figures = {**QUIET, "INT4_1": tuple(int4_ms + 0.01 * i for i in range(9))}
    v = verdicts.memory_bound(recorded(figures))
    assert v.reliable and words in v.text
    assert v.ratio == pytest.approx((INT4_BYTES / (int4_ms + 0.04)) / (4 * N * K / 21.13), rel=1e-3)


def test_one_thread_only_has_no_contention():
    run = recorded({**BROWSER, "INT4": BROWSER["INT4_1"], "FP32": BROWSER["FP32_1"]}, threads=1)
    assert verdicts.contention(run) == []
    assert verdicts.all_threads(run).text.startswith("INT4 on 1 thread runs 3.3x as fast")


def test_lines_name_the_headline_and_why():
    out = verdicts.lines(recorded(QUIET))
    assert out[0].startswith("headline, 1 thread (steady when another program uses a core): INT4 on 1 thread")
    assert out[1].startswith("all 2 threads: ") and out[2].startswith("memory: on 1 thread")


def test_only_a_run_is_judged():
    with pytest.raises(TypeError, match="run must be a labkit.quant.speed.MatmulRun, got dict"):
        verdicts.one_thread(QUIET)
