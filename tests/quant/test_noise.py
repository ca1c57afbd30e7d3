"""Paired differences over pieces of a text: Student's t against a printed table, the interval against the
textbook formula, the decision read from the whole interval, and the refusals."""
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import noise

from ..refusals import assert_refused

# Student's t quantiles as printed in statistics tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2)
T_TABLE = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 3): 3.182, (0.975, 7): 2.365, (0.975, 15): 2.131,
           (0.975, 30): 2.042, (0.95, 5): 2.015, (0.995, 10): 3.169, (0.9, 20): 1.325}


@pytest.mark.parametrize("p, df", list(T_TABLE))
def test_t_quantiles_match_the_printed_table(p, df):
    assert noise.t_quantile(p, df) == pytest.approx(T_TABLE[(p, df)], abs=6e-4)


def test_t_approaches_the_normal_quantile():
    assert noise.t_quantile(0.975, 100_000) == pytest.approx(1.959964, abs=1e-4)


@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=2, max_size=12))
def test_interval_is_the_textbook_formula(pairs):
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    p = noise.paired_difference(a, b)
    d = [x - y for x, y in pairs]
    assert p.differences == tuple(d) and p.n == len(d)
    assert p.mean == pytest.approx(statistics.fmean(d), abs=1e-12)
    half = noise.t_quantile(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    assert p.low == pytest.approx(p.mean - half, abs=1e-9) and p.high == pytest.approx(p.mean + half, abs=1e-9)
    assert p.above == sum(v > 0 for v in d)
    assert p.decision == ("above" if p.low > 0 else "below" if p.high < 0 else "cannot tell")


def test_decision_reads_the_whole_interval():
    assert noise.paired_difference([1.1, 2.12, 3.11], [1.0, 2.0, 3.0]).decision == noise.ABOVE
    assert noise.paired_difference([1.0, 2.0, 3.0], [1.1, 2.12, 3.11]).decision == noise.BELOW
    # above on every piece, but one piece far from the others: the interval reaches below 0
    spiky = noise.paired_difference([0.1, 0.1, 0.1, 5.0], [0.0, 0.0, 0.0, 0.0])
    assert spiky.above == 4 and spiky.decision == noise.UNDECIDED
    assert spiky.describe(2) == f"+1.32 (95% interval {spiky.low:+.2f} to {spiky.high:+.2f}, above on 4 of 4 pieces)"


def test_bad_input_is_refused():
    assert_refused(lambda: noise.paired_difference([1.0], [2.0]), ValueError, "a", (1.0,), "at least 2 paired values")
    assert_refused(lambda: noise.paired_difference([1.0, 2.0], [2.0]), ValueError, "b", (2.0,),
                   "as many values as a (2)")
    assert_refused(lambda: noise.paired_difference([1.0, math.nan], [2.0, 3.0]), ValueError, "a", (1.0, math.nan),
                   "a sequence of finite numbers")
    assert_refused(lambda: noise.paired_difference("12", [2.0, 3.0]), TypeError, "a", "12", "a sequence of numbers")
    assert_refused(lambda: noise.paired_difference([1.0, 2.0], [True, 3.0]), TypeError, "b", [True, 3.0],
                   "a sequence of numbers")
    assert_refused(lambda: noise.t_quantile(0.3, 3), ValueError, "p", 0.3, "in (0.5, 1)")
    assert_refused(lambda: noise.t_quantile(0.975, 0), ValueError, "df", 0, "a positive int")
    assert_refused(lambda: noise.t_quantile(0.975, 2.0), TypeError, "df", 2.0, "a positive int")
