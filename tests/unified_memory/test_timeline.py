"""The link timeline: every recorded busy second is kept through widening, each bin holds exactly the busy
time inside it (checked against interval arithmetic), and reading it back is exact at bin edges."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory.timeline import FIRST_WIDTH, N_BINS, busy_until, new_timeline, record_busy, widen


def overlap(intervals, lo, hi):
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e-3), st.floats(1e-9, 1e-3)), min_size=1, max_size=30))
def test_bins_hold_the_busy_time_inside_them(gaps_and_lengths):
    timeline, intervals, t = new_timeline(), [], 0.0
    for gap, length in gaps_and_lengths:
        start, t = t + gap, t + gap + length
        record_busy(timeline, start, t)
        intervals.append((start, t))
    width = timeline[0]
    assert width >= FIRST_WIDTH and t <= width * N_BINS < 2 * t + 2 * FIRST_WIDTH * N_BINS  # covers, not more
    assert np.isclose(timeline[1:].sum(), sum(b - a for a, b in intervals), rtol=1e-9)
    for j in np.random.default_rng(0).integers(0, N_BINS, 50):
        assert np.isclose(timeline[1 + j], overlap(intervals, j * width, (j + 1) * width), rtol=1e-6, atol=1e-18)
    edges = np.arange(0, 11) * width * 1000
    assert np.allclose(busy_until(timeline, edges), [overlap(intervals, 0, e) for e in edges], rtol=1e-6, atol=1e-15)


def test_widen_merges_pairs_and_doubles_the_width():
    timeline = new_timeline()
    timeline[1:5] = [1, 2, 3, 4]
    timeline[-1] = 5
    widen(timeline)
    assert timeline[0] == 2 * FIRST_WIDTH and timeline[1:3].tolist() == [3, 7] and timeline[N_BINS // 2] == 5
    assert timeline[1:].sum() == 15 and (timeline[N_BINS // 2 + 1:] == 0).all()


def test_a_long_run_fits_the_same_bins():
    timeline = new_timeline()
    record_busy(timeline, 0.0, 1e-6)
    record_busy(timeline, 999.0, 1000.0)  # a million times later: 30 doublings
    assert 1000.0 <= timeline[0] * N_BINS < 2000.0
    width = timeline[0]  # inside a bin, the busy time is taken as spread evenly: exact to one bin
    assert abs(busy_until(timeline, np.array([1e3]))[0] - (1.0 + 1e-6)) < width
    assert np.isclose(busy_until(timeline, np.array([500.0]))[0], 1e-6)
    assert np.isclose(busy_until(timeline, np.array([2000.0]))[0], 1.0 + 1e-6)


def test_busy_until_refuses_what_is_not_a_timeline():
    with pytest.raises(TypeError, match="timeline must be a timeline from new_timeline"):
        busy_until(None, [1.0])
    with pytest.raises(ValueError, match="times must be finite simulated times"):
        busy_until(new_timeline(), [float("nan")])
