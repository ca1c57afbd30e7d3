"""The loop's measured speed: quiet recordings give a conclusion built from their medians, noisy ones say
"unreliable" and name the settings, and a real (tiny) timing run has the promised shape.

NOISY is a run recorded on the course's shared 2-core machine while other work ran (milliseconds per replay
of the two 7B tokens of notebook 02, 6,456,712 page accesses, speed.time_replays with repeats=5). QUIET is
made up to look like a steady run of the same case (spreads of 2-5%), not recorded."""
import numpy as np
import pytest

from labkit.course import Timing
from labkit.memory_wall.verdicts import UNRELIABLE
from labkit.unified_memory import explore as ux
from labkit.unified_memory import speed

from ..refusals import assert_refused

ACCESSES, WHAT = 6_456_712, "replaying the two 7B tokens"


def ms(*values) -> Timing:
    return Timing(tuple(v / 1e3 for v in values))


NOISY = {"none": ms(179.8, 78.4, 136.1, 174.9, 164.9), "none, batches of 256": ms(89.5, 87.2, 105.8, 129.0, 141.9),
         "sequential, 2 MiB": ms(77.0, 134.2, 148.4, 124.9, 151.5), "density": ms(143.3, 116.8, 208.7, 209.8, 267.1)}
QUIET = {"none": ms(161.0, 158.2, 163.5, 159.9, 160.4), "none, batches of 256": ms(80.1, 79.5, 82.3, 80.0, 80.7),
         "sequential, 2 MiB": ms(78.2, 77.9, 79.4, 78.0, 78.8), "density": ms(121.5, 119.8, 124.0, 120.2, 121.1)}


def test_a_quiet_run_concludes_from_its_medians():
    v = speed.speed_verdict(QUIET, ACCESSES, WHAT)
    slow, fast = ACCESSES / 0.1604 / 1e6, ACCESSES / 0.0782 / 1e6  # medians by hand: 160.4 ms, 78.2 ms
    assert v.reliable and v.ratio == pytest.approx(fast / slow)
    assert v.text.startswith(f"the loop replays {slow:.0f} M page accesses/s (none) to {fast:.0f} M/s "
                             "(sequential, 2 MiB) on this machine (medians of 5 runs taken in turns, spreads up to")
    assert v.text.endswith("replaying the two 7B tokens takes 0.08 to 0.16 s, pool set-up included")


def test_a_noisy_run_says_unreliable_and_why():
    v = speed.speed_verdict(NOISY, ACCESSES, WHAT)
    assert not v.reliable and v.text.startswith(UNRELIABLE)
    assert "density: spread 72% > 50%" in v.text and "M page accesses/s" not in v.text
    # one unsteady setting is enough
    mixed = {**QUIET, "density": NOISY["density"]}
    assert not speed.speed_verdict(mixed, ACCESSES, WHAT).reliable
    assert speed.speed_verdict(mixed, ACCESSES, WHAT, max_spread=1.0).reliable


def test_rate_rows():
    rows = speed.rate_rows(QUIET, ACCESSES)
    assert [r["setting"] for r in rows] == list(QUIET)
    assert rows[0]["median_s"] == pytest.approx(0.1604)
    assert rows[0]["M_accesses/s"] == pytest.approx(ACCESSES / 0.1604e6)
    assert rows[0]["spread"] == pytest.approx((163.5 - 158.2) / 160.4)


def test_a_real_timing_run_has_its_shape():
    steps = [np.arange(40), np.arange(48)]
    settings = {"none": {}, "density": {"prefetch": "density"}}
    timings = speed.time_replays(steps, 64, 16, settings, repeats=2)
    assert set(timings) == set(settings) and all(len(t.times) == 2 and t.median > 0 for t in timings.values())


def test_bad_input_is_refused():
    assert_refused(lambda: speed.time_replays([np.arange(4)], 4, 2, {}), ValueError, "settings", {}, "non-empty")
    assert_refused(lambda: speed.time_replays([np.arange(4)], 4, 2, [("none", {})]), TypeError, "settings",
                   [("none", {})], "a dict")
    assert_refused(lambda: speed.time_replays([np.arange(4)], 4, 2, {"none": {}}, repeats=0), ValueError, "repeats",
                   0, "a positive int")
    assert_refused(lambda: speed.rate_rows({}, 10), ValueError, "timings", {}, "non-empty")
    assert_refused(lambda: speed.rate_rows(QUIET, 0), ValueError, "accesses", 0, "")
    assert_refused(lambda: speed.speed_verdict(QUIET, 10, 5), TypeError, "what", 5, "str")
    with pytest.raises(ValueError, match="median > 0"):
        speed.rate_rows({"none": Timing((0.0, 0.0))}, 10)


def test_the_settings_are_the_notebooks():
    assert list(ux.PAGING_SETTINGS) == ["none", "none, batches of 256", "sequential, 2 MiB", "density"]
