import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.memory_wall.cost import breakeven_days


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


@pytest.mark.parametrize("args,match", [((0, 10), "local_cost"), ((10, -1), "cloud_per_day"),
                                        ((10, 10, float("nan")), "local_per_day"), (("5300", 10), "local_cost")])
def test_bad_amounts_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        breakeven_days(*args)
