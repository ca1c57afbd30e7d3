"""Measured verdicts on recorded measurements: quiet runs give a conclusion built from their numbers, noisy
runs say "unreliable", and no recorded run turns a conclusion upside down.

The numbers are milliseconds recorded on the course's 2-core machine (2026-12-01): torch's 2-thread sum
over 256 MiB and the FP32 matrix-vector sweep over 8 x 64 MiB (timed in turns by hardware.measure_memory),
and TinyLM's generate with and without the KV cache (notebook 00)."""
import math

import pytest

from labkit.course import Timing
from labkit.memory_wall import verdicts
from labkit.memory_wall.verdicts import UNRELIABLE

from ..refusals import assert_refused

MiB = 2**20
SUM_BYTES, GEMV_BYTES = 256 * MiB, 8 * 64 * MiB


def ms(*values) -> Timing:
    return Timing(tuple(v / 1e3 for v in values))


# quiet: both steady; the sum reads ~50 GB/s, the sweep ~24.7 GB/s (ratio ~0.49)
QUIET = {"sum": ms(5.3, 5.4, 5.3, 5.35, 5.4, 5.3, 5.5), "gemv": ms(21.7, 21.6, 21.8, 21.7, 22.0, 21.7, 21.6)}
# another process on one core: the sum slows (~33 GB/s) but stays steady, the sweep does not move
BUSY_STEADY = {"sum": ms(8.1, 8.0, 8.3, 8.1, 8.2, 8.0, 8.4), "gemv": ms(21.9, 22.0, 21.8, 22.1, 21.9, 22.0, 21.8)}
# a run spoiled mid-way (the first rounds of a fresh process): spreads of 180% and 67%
NOISY = {"sum": ms(13.7, 5.6, 30.2, 13.9, 8.8, 14.1, 12.0), "gemv": ms(32.8, 24.1, 46.0, 30.0, 33.1, 35.2, 29.5)}
# steady but absurd: the roof was measured at a moment when the sum alone was starved (ratio 2.4)
ROOF_LOW = {"sum": ms(55.0, 54.0, 56.0, 55.0, 54.5, 55.5, 55.0), "gemv": QUIET["gemv"]}


def roof(run) -> verdicts.Verdict:
    return verdicts.against_roof("the product", GEMV_BYTES, run["gemv"], "the sum", SUM_BYTES, run["sum"])


def test_a_quiet_run_concludes_with_the_ratio_of_its_medians():
    v = roof(QUIET)
    expected = (GEMV_BYTES / 21.7e-3) / (SUM_BYTES / 5.35e-3)  # medians 21.7 and 5.35 ms
    assert v.reliable and v.ratio == pytest.approx(expected)
    assert str(v) == v.text == (f"the product reads {GEMV_BYTES / 21.7e-3 / 1e9:.1f} GB/s, {expected:.0%} of the "
                                f"{SUM_BYTES / 5.35e-3 / 1e9:.1f} GB/s the sum reads (medians of 7 runs taken in "
                                f"turns, spreads 2%, 4%): memory-bound, within {1 / expected:.1f}x of this "
                                "machine's memory bandwidth")


def test_a_busy_but_steady_run_reaches_the_same_conclusion():
    quiet, busy = roof(QUIET), roof(BUSY_STEADY)
    assert busy.reliable and quiet.reliable
    assert verdicts.ROOF_BAND[0] <= busy.ratio <= verdicts.ROOF_BAND[1]
    assert busy.text.split(": ")[-1].split(",")[0] == quiet.text.split(": ")[-1].split(",")[0] == "memory-bound"


def test_at_80_percent_of_the_roof_the_product_runs_at_the_bandwidth():
    run = {"sum": ms(10, 10, 10), "gemv": ms(25, 25, 25)}  # 2 x the bytes in 2.5 x the time: 0.8
    v = roof(run)
    assert v.ratio == pytest.approx(0.8) and v.text.endswith("it runs at this machine's memory bandwidth")


def test_a_noisy_run_says_unreliable_and_why():
    v = roof(NOISY)
    assert not v.reliable
    assert v.text == f"{UNRELIABLE} (the product: spread 67% > 50%; the sum: spread 180% > 50%)"


def test_a_reference_far_above_the_roof_makes_the_roof_untrustworthy():
    v = roof(ROOF_LOW)
    assert not v.reliable and v.ratio == pytest.approx((GEMV_BYTES / 21.7e-3) / (SUM_BYTES / 55e-3))
    assert v.text.startswith(UNRELIABLE) and "above 125%: the roof was measured low" in v.text


def test_a_reference_far_below_the_roof_is_not_taken_for_a_conclusion():
    run = {"sum": QUIET["sum"], "gemv": ms(60, 61, 60, 60, 62, 60, 61)}  # steady, but 18% of the roof
    v = roof(run)
    assert not v.reliable and "below the 40% a memory-bound kernel reaches" in v.text


def test_the_issue_10_runs_never_contradict_each_other():
    # three runs of the old cell read 21.6, 51.3 and 17-30 GB/s: whatever a run says, it is either the one
    # conclusion or "unreliable", never "not at the bandwidth"
    runs = [QUIET, BUSY_STEADY, NOISY, ROOF_LOW]
    texts = [roof(r).text for r in runs]
    assert all(t.startswith(UNRELIABLE) or "memory-bound" in t or "runs at this machine's" in t for t in texts)
    assert [roof(r).reliable for r in runs] == [True, True, False, False]


# notebook 00: generate 56 tokens with and without the KV cache (seconds per call)
CACHE_QUIET = {"with": ms(41, 42, 41, 43, 42), "without": ms(246, 250, 248, 247, 251)}
# a busy run: one "with" repeat as slow as the "without" ones
CACHE_NOISY = {"with": ms(41, 95, 42, 250, 44), "without": ms(246, 400, 251, 260, 248)}
# steady but with a third of the repeats the rule needs
CACHE_SHORT = {"with": ms(41, 42, 41), "without": ms(246, 250, 248)}
# wide spreads that still separate: a direction holds, whatever the spreads
CACHE_WIDE = {"with": ms(41, 95, 42, 130, 44), "without": ms(246, 400, 251, 260, 248)}


def test_speedup_is_the_ratio_of_medians_from_the_same_rounds():
    v = verdicts.speedup(CACHE_QUIET, fast="with", slow="without")
    assert v.reliable and v.ratio == pytest.approx(248 / 42)
    assert v.text == "with runs 5.9x as fast as without (medians of 5 runs taken in turns, spreads 5%, 2%, no overlap)"
    slower = verdicts.speedup(CACHE_QUIET, fast="without", slow="with")
    assert slower.ratio == pytest.approx(42 / 248) and "5.9x slower than with" in slower.text


def test_speedup_refuses_to_conclude_from_a_noisy_run():
    v = verdicts.speedup(CACHE_NOISY, fast="with", slow="without")
    assert not v.reliable and v.text.startswith(UNRELIABLE) and "the repeats of with (0.041-0.25 s) and without " \
        "(0.246-0.4 s) overlap" in v.text
    assert v.ratio == pytest.approx(251 / 44)  # the ratio is still reported, for whoever wants it
    short = verdicts.speedup(CACHE_SHORT, fast="with", slow="without")
    assert not short.reliable and "3 and 3 repeats: two equal things fail to overlap 10% of the time" in short.text
    wide = verdicts.speedup(CACHE_WIDE, fast="with", slow="without")
    assert wide.reliable and "5.7x as fast as without" in wide.text


def test_against_ceiling_names_the_regime_from_the_fraction():
    decode = ms(38.7, 38.6, 39.0, 38.8, 38.7)  # 64 tokens: 1,650 tokens/s
    far = verdicts.against_ceiling("TinyLM", 64, decode, ceiling=10_287)
    assert far.reliable and far.ratio == pytest.approx(64 / 38.7e-3 / 10_287)
    assert far.text == (f"TinyLM makes {64 / 38.7e-3:,.0f} tokens/s, {far.ratio:.1%} of its memory ceiling: "
                        "overhead-bound (Python and kernel launches, not bytes, take the time) (median of 5 "
                        "runs, spread 1%)")
    near = verdicts.against_ceiling("big", 64, decode, ceiling=2000)
    assert "83% of its memory ceiling: bandwidth-bound" in near.text
    above = verdicts.against_ceiling("cached", 64, decode, ceiling=1000)
    assert "1.7x its memory ceiling: its weights come from a cache" in above.text
    noisy = verdicts.against_ceiling("TinyLM", 64, ms(38, 80, 39), ceiling=10_287)
    assert not noisy.reliable and noisy.text == f"{UNRELIABLE} (TinyLM: spread 108% > 50%)"


def test_unsteady_lists_every_wide_spread_and_honours_the_limit():
    assert verdicts.unsteady(QUIET) == []
    assert verdicts.unsteady(NOISY, max_spread=2.0) == []
    assert verdicts.unsteady(QUIET, max_spread=0.01) == ["sum: spread 4% > 1%", "gemv: spread 2% > 1%"]


def test_the_spread_limit_is_the_course_timing_definition():
    t = QUIET["sum"]
    assert math.isclose(t.spread, (max(t.times) - min(t.times)) / t.median)


@pytest.mark.parametrize("call,error,name,value,expected", [
    (lambda: verdicts.speedup({}, "a", "b"), ValueError, "timings", {}, "a non-empty dict"),
    (lambda: verdicts.speedup([1], "a", "b"), TypeError, "timings", [1], "a dict of name -> Timing"),
    (lambda: verdicts.speedup({"a": 0.1}, "a", "b"), TypeError, "timings['a']", 0.1, "a labkit.course.Timing"),
    (lambda: verdicts.speedup({"a": ms(0, 0)}, "a", "a"), ValueError, "timings['a']", ms(0, 0), "a median > 0"),
    (lambda: verdicts.speedup(CACHE_QUIET, "with", "nope"), ValueError, "slow", "nope", "one of the timed names"),
    (lambda: verdicts.speedup(CACHE_QUIET, "with", "with"), ValueError, "slow", "with", "a name other than fast"),
    (lambda: roof({"sum": QUIET["sum"], "gemv": 5}), TypeError, "timings['the product']", 5, "Timing"),
    (lambda: verdicts.against_roof("k", 0, QUIET["gemv"], "r", 1, QUIET["sum"]), ValueError, "kernel_bytes", 0,
     "a positive"),
    (lambda: verdicts.against_roof("k", 1, QUIET["gemv"], "r", 1, QUIET["sum"], band=(1, 0.5)), ValueError,
     "band", (1, 0.5), "low < high"),
    (lambda: verdicts.against_roof("k", 1, QUIET["gemv"], "r", 1, QUIET["sum"], band=0.5), TypeError, "band", 0.5,
     "a (low, high) pair"),
    (lambda: verdicts.against_roof(1, 1, QUIET["gemv"], "r", 1, QUIET["sum"]), TypeError, "kernel", 1, "str"),
    (lambda: verdicts.against_ceiling("t", 64, QUIET["sum"], ceiling=-1), ValueError, "ceiling", -1, "a positive"),
    (lambda: verdicts.against_ceiling("t", 64, QUIET["sum"], 10, overhead_below=2), ValueError, "overhead_below",
     2, "in (0, 1]"),
])
def test_bad_arguments_are_refused(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)
