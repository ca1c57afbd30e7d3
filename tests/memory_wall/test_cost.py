import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.memory_wall.cost import breakeven_days

from ..refusals import assert_refused


@given(st.floats(1, 1e7), st.floats(1, 1e5), st.floats(0, 1e5))
def test_after_breakeven_buying_has_cost_no_more_than_renting(local, cloud, upkeep):
    days = breakeven_days(local, cloud, upkeep)
    if cloud <= upkeep:
        assert days == math.inf
    else:  # brute force: the running totals cross at `days`
        assert local + upkeep * days == pytest.approx(cloud * days, rel=1e-9)


def test_the_claims_cost_table():
    # $5,300 once vs $2,100 a day in the cloud: 2.5 days, not 6 months
    assert round(breakeven_days(5300, 2100), 2) == 2.52


@pytest.mark.parametrize("args,error,name,value,expected", [
    ((0, 10), ValueError, "local_cost", 0, "a positive finite number (money)"),
    ((10, -1), ValueError, "cloud_per_day", -1, "a positive finite number (money per day)"),
    ((10, 10, float("nan")), ValueError, "local_per_day", float("nan"), "a non-negative finite number"),
    ((10, 10, -5), ValueError, "local_per_day", -5, "a non-negative finite number (money per day)"),
    (("5300", 10), TypeError, "local_cost", "5300", "a positive finite number"),   # a string is not an amount
    ((5300, None), TypeError, "cloud_per_day", None, "a positive finite number"),
    ((5300, 10, True), TypeError, "local_per_day", True, "a non-negative finite number"),
])
def test_bad_amounts_are_refused(args, error, name, value, expected):
    assert_refused(lambda: breakeven_days(*args), error, name, value, expected)


def test_no_upkeep_is_allowed_and_renting_cheaper_than_upkeep_never_breaks_even():
    assert breakeven_days(100, 10, 0) == 10
    assert breakeven_days(100, 10, 10) == math.inf
