"""labkit.course.timing: the one timing helper, checked with a fake clock-free workload (call counts) and
orderings that hold on any machine."""
import time

import pytest

from labkit.course import timing


def test_measure_calls_warmup_plus_repeats_times_calls():
    calls = []
    t = timing.measure(lambda: calls.append(1), repeats=4, warmup=2, calls=3)
    assert len(calls) == 2 + 4 * 3 and len(t.times) == 4
    assert t.best <= t.median <= max(t.times) and t.spread >= 0


def test_a_sleep_is_measured_per_call():
    t = timing.measure(lambda: time.sleep(0.01), repeats=3, warmup=0, calls=2)
    assert 0.009 < t.best < 0.5


def test_interleave_takes_turns_and_keeps_the_order():
    order = []
    got = timing.interleave({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4 and list(got) == ["a", "b"] and all(len(v.times) == 3 for v in got.values())
    slow = timing.interleave({"fast": lambda: None, "slow": lambda: time.sleep(0.005)}, repeats=3)
    assert slow["slow"].median > slow["fast"].median


def test_bad_arguments():
    with pytest.raises(ValueError, match="repeats must be a positive int, got 0"):
        timing.measure(lambda: None, repeats=0)
    with pytest.raises(TypeError, match="warmup must be a non-negative int"):
        timing.measure(lambda: None, warmup=1.5)
    with pytest.raises(TypeError, match="fns must be a non-empty dict"):
        timing.interleave([lambda: None])
    assert timing.Timing((1.0, 3.0, 2.0)).median == 2.0 and timing.Timing((0.0,)).spread == 0.0
    assert timing.Timing((1.0,)).spread_words() == "1 sample"
    assert timing.Timing((1.0, 1.5)).spread_words() == "spread 40%"  # 0.5 / 1.25
