"""Pipeline schedules: every micro-batch is forwarded then backwarded once per stage, GPipe holds m
activations and 1F1B at most p - s, the simulated timeline's bubble is exactly (p-1)/(m+p-1) for any
forward and backward costs, and Megatron's (p-1)/m is the same idle time over the ideal time."""
import pytest
from hypothesis import given, settings, strategies as st

from labkit.parallel import schedule as s
from tests.refusals import assert_refused


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 12), kind=st.sampled_from(s.SCHEDULES),
       f=st.floats(0.5, 2), b=st.floats(0.5, 3))
def test_bubble_of_the_simulated_schedule_is_the_formula(p, m, kind, f, b):
    ops = s.operations(kind, p, m)
    for stage_ops in ops:
        assert sorted(stage_ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(stage_ops.index(("F", i)) < stage_ops.index(("B", i)) for i in range(m))
    events = s.simulate(kind, p, m, f, b)
    total = max(e[3] for stage in events for e in stage)
    assert total == pytest.approx((m + p - 1) * (f + b))
    assert s.measured_bubble(events) == pytest.approx(s.bubble_fraction(p, m))
    idle = total - m * (f + b)
    assert idle / (m * (f + b)) == pytest.approx(s.megatron_bubble(p, m))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2)])
def test_peak_in_flight(p, m):
    assert [s.peak_in_flight(o) for o in s.operations("gpipe", p, m)] == [m] * p
    assert [s.peak_in_flight(o) for o in s.operations("1f1b", p, m)] == [min(p - i, m) for i in range(p)]


def test_bad_input_is_refused():
    assert_refused(lambda: s.bubble_fraction(0, 4), ValueError, "stages", 0, "a positive int")
    assert_refused(lambda: s.operations("zb", 2, 2), ValueError, "schedule", "zb", "one of")
    assert_refused(lambda: s.simulate("gpipe", 2, 2, forward=-1.0), ValueError, "forward", -1.0, "positive")
    assert_refused(lambda: s.simulate("1f1b", 2, 2, backward=-0.5), ValueError, "backward", -0.5, "positive")
