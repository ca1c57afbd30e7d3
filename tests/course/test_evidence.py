"""The course's rule for stating a direction, on quiet, noisy and borderline runs, against a simulation of the
false-direction risk it promises, and with hypothesis for its symmetries.

The runs are shaped like the course's own (milliseconds or bytes with the medians and spreads that notebooks 00
and 07 stored): TinyLM's generate with and without the KV cache, image time-to-first-token new and repeated,
and lab 07's peak memory loading slices against whole tensors."""
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from labkit.course import Timing, evidence

from ..refusals import assert_refused


def ms(*values) -> Timing:
    return Timing(tuple(v / 1e3 for v in values))


QUIET = (ms(41, 42, 41, 43, 42), ms(246, 250, 248, 247, 251))
# notebook 07's shape, 7 repeats each: "repeated" has the slower median but its repeats overlap "new"'s
IMAGE_TTFT = (ms(56.1, 61.0, 72.0, 58.3, 77.5, 64.2, 59.9), ms(63.5, 75.3, 72.9, 68.2, 80.1, 71.4, 79.0))
# lab 07's peak memory, 3 fresh processes each (what the notebook measured before): 3 repeats
SLICES_3 = ([3.05e6, 2.95e6, 3.12e6], [3.62e6, 3.49e6, 3.71e6])
# the same with 5 each: separate
SLICES_5 = ([3.05e6, 2.95e6, 3.12e6, 3.01e6, 2.99e6], [3.62e6, 3.49e6, 3.71e6, 3.55e6, 3.60e6])


def test_a_quiet_run_separates_and_names_its_direction():
    c = evidence.compare("with", QUIET[0], "without", QUIET[1])
    assert c.reliable and c.reason == "" and c.ratio == pytest.approx(248 / 42)
    assert (c.lower, c.higher) == ("with", "without")
    flipped = evidence.compare("without", QUIET[1], "with", QUIET[0])
    assert flipped.reliable and (flipped.lower, flipped.higher) == ("with", "without")


def test_overlapping_repeats_state_no_direction_even_when_the_medians_differ():
    c = evidence.compare("image, new", IMAGE_TTFT[0], "image, repeated", IMAGE_TTFT[1], " s")
    assert c.ratio == pytest.approx(72.9 / 61.0) and c.ratio > 1.1
    assert not c.reliable and c.lower is None and c.higher is None
    assert c.unreliable() == ("unreliable on this run (the repeats of image, new (0.0561-0.0775 s) and image, "
                              "repeated (0.0635-0.0801 s) overlap: the difference is within this run's noise)")


def test_three_repeats_never_suffice_and_four_or_more_may():
    short = evidence.compare("slices", SLICES_3[0], "whole", SLICES_3[1], " B")
    assert not short.reliable and short.reason.startswith("3 and 3 repeats: two equal things fail to overlap 10%")
    five = evidence.compare("slices", SLICES_5[0], "whole", SLICES_5[1], " B")
    assert five.reliable and five.lower == "slices"


def test_a_single_tie_between_the_sets_is_an_overlap():
    c = evidence.compare("a", [1, 2, 3, 4, 5], "b", [5, 6, 7, 8, 9])
    assert not c.reliable and "overlap" in c.reason


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (3, 3), (4, 4), (5, 5), (3, 7), (7, 7)])
def test_the_false_direction_chance_matches_a_simulation(n, m):
    rng = random.Random(n * 100 + m)
    trials, apart = 20_000, 0
    for _ in range(trials):
        a = [rng.lognormvariate(0, 0.3) for _ in range(n)]
        b = [rng.lognormvariate(0, 0.3) for _ in range(m)]
        apart += max(a) < min(b) or max(b) < min(a)
    p = evidence.false_direction_chance(n, m)
    assert apart / trials == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / trials) + 1e-3)


def test_the_rule_table_in_the_docstring():
    assert [round(evidence.false_direction_chance(n, n), 5) for n in (3, 4, 5, 7)] == [0.1, 0.02857, 0.00794, 0.00058]
    assert evidence.false_direction_chance(3, 3) > evidence.FALSE_DIRECTION >= evidence.false_direction_chance(4, 4)


finite = st.floats(0.001, 1e3, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=8), st.lists(finite, min_size=1, max_size=8))
def test_the_verdict_is_symmetric_and_reliable_only_when_apart(a, b):
    ab, ba = evidence.compare("a", a, "b", b), evidence.compare("b", b, "a", a)
    assert ab.reliable == ba.reliable and ab.ratio == pytest.approx(1 / ba.ratio)
    apart = max(a) < min(b) or max(b) < min(a)
    enough = evidence.false_direction_chance(len(a), len(b)) <= evidence.FALSE_DIRECTION
    assert ab.reliable == (apart and enough)
    if ab.reliable:
        assert ab.lower == ba.lower and ab.higher == ba.higher and ab.lower != ab.higher


@settings(max_examples=30, deadline=None)
@given(st.lists(finite, min_size=4, max_size=8), st.floats(1.01, 10))
def test_scaling_one_set_above_the_other_separates_it(a, factor):
    b = [max(a) * factor + x for x in a]
    c = evidence.compare("a", a, "b", b)
    assert c.reliable and c.higher == "b"


@pytest.mark.parametrize("call,error,name,value,expected", [
    (lambda: evidence.compare("a", [], "b", [1]), ValueError, "a", [], "at least one"),
    (lambda: evidence.compare("a", [1, math.nan], "b", [1]), ValueError, "a", [1, math.nan], "all finite"),
    (lambda: evidence.compare("a", [1], "b", "12"), TypeError, "b", "12", "a Timing or a list"),
    (lambda: evidence.compare("a", [1], "a", [2]), ValueError, "b_name", "a", "a name other than a_name"),
    (lambda: evidence.compare(1, [1], "b", [2]), TypeError, "a_name", 1, "str"),
    (lambda: evidence.false_direction_chance(0, 3), ValueError, "n", 0, ">= 1"),
    (lambda: evidence.false_direction_chance(3, 2.5), TypeError, "m", 2.5, "an int"),
])
def test_bad_input_is_refused_by_name(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)
