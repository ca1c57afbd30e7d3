"""labkit._checks: one message format and one rule (wrong type: TypeError; wrong value: ValueError)."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit import _checks as c


@given(st.integers(-10**6, 10**6))
def test_ints_inside_the_range_pass_and_come_back_as_int(v):
    assert c.check_int("n", v, -10**6, 10**6) == v
    assert type(c.check_int("n", np.int64(v))) is int


@given(st.integers(), st.integers(-100, 100), st.integers(-100, 100))
def test_int_range_is_exactly_the_closed_interval(v, lo, hi):
    inside = lo <= v <= hi
    if inside:
        assert c.check_int("n", v, lo, hi) == v
    else:
        with pytest.raises(ValueError, match=f"n must be an int in \\[{lo}, {hi}\\], got {v}"):
            c.check_int("n", v, lo, hi)


@pytest.mark.parametrize("bad", ["3", 3.0, True, None, [3]])
def test_wrong_types_are_type_errors(bad):
    with pytest.raises(TypeError, match="pages must be a positive int"):
        c.check_positive_int("pages", bad)
    with pytest.raises(TypeError, match="n must be an int"):
        c.check_int("n", bad)


@pytest.mark.parametrize("bad", ["5300", None, True, [1.0], complex(1, 1)])
def test_numbers_refuse_non_numbers_with_a_type_error(bad):
    with pytest.raises(TypeError, match="cost must be a positive finite number"):
        c.check_positive("cost", bad)
    with pytest.raises(TypeError, match="x must be a finite number"):
        c.check_number("x", bad)


@pytest.mark.parametrize("bad", [0, -1.5, math.inf, math.nan])
def test_wrong_values_are_value_errors(bad):
    with pytest.raises(ValueError, match=f"bandwidth must be a positive finite number \\(bytes/s\\), got {bad}"):
        c.check_positive("bandwidth", bad, unit="bytes/s")


def test_intervals_open_and_closed():
    assert c.check_fraction("f", 1) == 1.0
    for bad in (0, 1.01, -0.1):
        with pytest.raises(ValueError, match="f must be a finite number in \\(0, 1\\]"):
            c.check_fraction("f", bad)
    assert c.check_fraction("f", 0, allow_zero=True, allow_one=False) == 0.0
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        c.check_fraction("f", 1, allow_zero=True, allow_one=False)
    assert c.check_number("t", 0.0, low=0.0) == 0.0
    with pytest.raises(ValueError, match="t must be a finite number > 0"):
        c.check_number("t", 0.0, low=0.0, low_open=True)
    assert c.check_positive_int("n", 0, allow_zero=True) == 0
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        c.check_positive_int("n", -1, allow_zero=True)


def test_choices_types_and_bools():
    assert c.check_choice("eviction", "lru", ("lru", "clock")) == "lru"
    with pytest.raises(ValueError, match="eviction must be one of \\('lru', 'clock'\\), got 'LRU'"):
        c.check_choice("eviction", "LRU", ("lru", "clock"))
    with pytest.raises(ValueError, match="got \\[1\\]"):
        c.check_choice("eviction", [1], {"lru"})
    with pytest.raises(TypeError, match="model must be a TinyLM, got int 3"):
        c.check_type("model", 3, dict, "a TinyLM")
    assert c.check_bool("tied", False) is False
    with pytest.raises(TypeError, match="tied must be True or False, got 1"):
        c.check_bool("tied", 1)
    with pytest.raises(ValueError, match="x must be what I said, got 'y'"):
        c.fail("x", "y", "what I said")


def test_long_values_are_shortened_in_messages():
    with pytest.raises(TypeError) as err:
        c.check_int("n", "z" * 1000)
    assert len(str(err.value)) < 200 and str(err.value).endswith("...")


def test_an_int_beyond_the_range_of_a_float_is_a_value_error_not_an_overflow():
    for check in (lambda v: c.check_number("x", v), lambda v: c.check_positive("x", v)):
        with pytest.raises(ValueError, match=r"^x must be a .*finite number"):
            check(10**400)


def test_a_refusal_carries_its_parts_as_data_through_pickle():
    """The HTTP service names a request's field from error.refusal, never from the message text; the data
    survives pickling (errors cross from tensor-parallel ranks and replica processes)."""
    import pickle

    from labkit._checks import Refusal
    with pytest.raises(ValueError) as info:
        c.fail("prompt", [1] * 3, "at most 2 tokens")
    assert info.value.refusal == Refusal("prompt", "at most 2 tokens", "[1, 1, 1]")
    assert str(info.value) == info.value.refusal.message() == "prompt must be at most 2 tokens, got [1, 1, 1]"
    assert info.value.refusal.message("messages") == "messages must be at most 2 tokens, got [1, 1, 1]"
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ValueError and again.refusal == info.value.refusal
