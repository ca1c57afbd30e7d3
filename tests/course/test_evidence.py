"""The course's rule for stating a direction, on quiet, noisy and borderline runs, against a simulation of the
false-direction risk it promises, and with hypothesis for its symmetries.

The runs are shaped like the course's own (milliseconds or bytes with the medians and spreads that notebooks 00
and 07 stored): TinyLM's generate with and without the KV cache, image time-to-first-token new and repeated,
and lab 07's peak memory loading slices against whole tensors."""
import itertools
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


# per-repeat ratios that benchmarks/serving_http.py printed (2026-12-04, httpx load): five repeats, and a sixth
HTTP_5 = [0.99, 1.17, 1.09, 0.91, 0.93]
HTTP_MIXED = [1.25, 0.82, 1.23, 0.98, 0.92, 0.74]
# benchmarks/serving_batching.py, continuous / static at twice the capacity (2026-12-03): one repeat under 2
BATCHING = [1.99, 2.11, 2.25, 2.23, 2.28, 2.20]


def test_a_goal_needs_six_repeats_all_on_one_side():
    five = evidence.against_goal("http / in-process", HTTP_5, 0.9)
    assert not five.reliable and five.met is None and five.median == 0.99
    assert five.reason.startswith("5 repeats of http / in-process: a figure sitting on the goal puts them all on "
                                  "one side 6% of the time")
    six = evidence.against_goal("http / in-process", HTTP_5 + [0.95], 0.9)
    assert six.reliable and six.met is True and six.verdict() == "goal met (every repeat >= 0.9)"
    missed = evidence.against_goal("ratio", [1.2, 1.5, 1.1, 1.3, 1.4, 1.25], 2)
    assert missed.reliable and missed.met is False and missed.verdict() == "goal NOT met (every repeat < 2)"


def test_repeats_on_both_sides_of_the_goal_decide_nothing_whatever_their_median():
    mixed = evidence.against_goal("http / in-process", HTTP_MIXED, 0.9)
    assert mixed.median == pytest.approx(0.95) and mixed.median > 0.9 and mixed.met is None
    assert mixed.verdict() == ("unreliable on this run (4 of 6 repeats of http / in-process (0.74-1.25) reach 0.9, "
                               "the sign test needs 6 on one side: the goal is within this run's noise)")
    one_under = evidence.against_goal("continuous / static", BATCHING, 2)
    assert one_under.median > 2.2 and not one_under.reliable and "5 of 6 repeats" in one_under.reason


# benchmarks/int4_matmul.py's shape: 15 rounds of a kernel's share of the memory roof against the 70% goal
ROOF_12_OF_15 = [0.74, 0.81, 0.66, 0.72, 0.77, 0.71, 0.93, 0.75, 0.69, 0.73, 0.78, 0.70, 0.64, 0.76, 0.72]
ROOF_11_OF_15 = [0.74, 0.81, 0.66, 0.72, 0.77, 0.71, 0.93, 0.75, 0.69, 0.73, 0.68, 0.70, 0.64, 0.76, 0.72]


def test_more_repeats_decide_with_some_on_the_other_side():
    met = evidence.against_goal("share of the roof", ROOF_12_OF_15, 0.7)
    assert met.reliable and met.met is True and met.verdict() == "goal met (12 of 15 repeats >= 0.7)"
    short = evidence.against_goal("share of the roof", ROOF_11_OF_15, 0.7)
    assert short.met is None and "11 of 15 repeats" in short.reason and "needs 12 on one side" in short.reason
    missed = evidence.against_goal("share of the roof", [v - 0.12 for v in ROOF_12_OF_15], 0.7)
    assert missed.met is False and missed.verdict() == "goal NOT met (14 of 15 repeats < 0.7)"


def test_the_sign_chance_matches_every_ordering_and_a_simulation():
    for n in range(1, 15):  # brute force: every pattern of n repeats above (1) or below (0), each 1 / 2**n
        for k in range(n // 2 + 1, n + 1):
            one_side = sum(max(sum(p), n - sum(p)) >= k for p in itertools.product((0, 1), repeat=n))
            assert evidence.sign_chance(n, k) == pytest.approx(one_side / 2**n)
        needed = [k for k in range(n // 2 + 1, n + 1) if evidence.sign_chance(n, k) <= evidence.FALSE_DIRECTION]
        assert evidence.sign_needed(n) == (min(needed) if needed else None)
    rng = random.Random(7)
    for n, k in ((3, 3), (6, 6), (8, 8), (15, 12)):
        trials = 20_000
        one_side = 0
        for _ in range(trials):
            above = sum(rng.lognormvariate(0, 0.3) >= 1 for _ in range(n))  # median 1: the goal
            one_side += max(above, n - above) >= k
        p = evidence.sign_chance(n, k)
        assert one_side / trials == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / trials) + 1e-3)
    assert evidence.MIN_GOAL_REPEATS == 6 and evidence.sign_chance(5) > evidence.FALSE_DIRECTION


def test_the_rule_table_for_goals_in_the_docstring():
    table = [line.split() for line in evidence.__doc__.splitlines() if line.strip().startswith(("repeats n", "needed"))]
    repeats, needed = [int(v) for v in table[0][2:]], [int(v) for v in table[1][4:]]
    assert needed == [evidence.sign_needed(n) for n in repeats]


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=16), finite, st.floats(0.01, 100))
def test_a_goal_is_met_only_when_enough_repeats_reach_it_at_any_scale(x, goal, scale):
    c = evidence.against_goal("x", x, goal)
    above, need = sum(v >= goal for v in x), evidence.sign_needed(len(x))
    assert c.reliable == (need is not None and max(above, len(x) - above) >= need)
    assert c.met == (None if not c.reliable else above >= need)
    assert c.met is not True or c.median >= goal
    scaled = evidence.against_goal("x", [v * scale for v in x], goal * scale)
    assert scaled.met == c.met or scaled.above != c.above  # float rounding at the line


@pytest.mark.parametrize("call,error,name,value,expected", [
    (lambda: evidence.against_goal("r", [1] * 6, math.inf), ValueError, "goal", math.inf, "a finite number"),
    (lambda: evidence.against_goal("r", [1] * 6, True), ValueError, "goal", True, "a finite number"),
    (lambda: evidence.against_goal("r", [], 1), ValueError, "values", [], "at least one"),
    (lambda: evidence.against_goal(2, [1], 1), TypeError, "name", 2, "str"),
    (lambda: evidence.sign_chance(0), ValueError, "n", 0, ">= 1"),
    (lambda: evidence.sign_chance(6, 7), ValueError, "k", 7, "in [1, 6]"),
    (lambda: evidence.sign_needed(1.5), TypeError, "n", 1.5, "an int"),

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
