"""The decode report: one measurement of TinyLM's step in one process and with TP=2 ranks, and verdicts that
follow the course's evidence rule (a direction only from repeats that separate) and the 2x goal of the
prediction, checked on made-up timings so that no test depends on the clock."""
import statistics

import pytest

from labkit.course import evidence
from labkit.course.timing import Timing
from labkit.parallel import LinkModel, decode, tensor_parallel_generate
from labkit.tinylm import ByteTokenizer
from tests.refusals import assert_refused


def report(single, tp, back, after, predicted=0.004):
    link = LinkModel(statistics.median(after), 1e9, "made up")
    return decode.DecodeReport(2, Timing(tuple(single)), tuple(tp), tuple(back), tuple(after), 1e-4, link,
                               predicted, 10, 512)


def test_separated_repeats_state_a_direction():
    r = report([1e-3] * 4 + [1.1e-3], [5e-3, 5.5e-3, 6e-3, 7e-3], [3e-4, 3.1e-4, 3.2e-4, 3.3e-4],
               [2e-4, 2.1e-4, 2.2e-4, 2.3e-4])
    assert r.speed() == "TP=2 is 5.8x slower than one process here (every step of each)"
    assert r.alphas().startswith("alpha after compute is 0.68x alpha back to back, lower in every round")
    assert r.tp_step == pytest.approx(5.75e-3) and r.single_step == 1e-3


def test_overlapping_repeats_say_unreliable():
    r = report([1e-3, 2e-3, 3e-3, 4e-3], [2.5e-3, 3e-3, 5e-3, 6e-3], [3e-4, 2e-4, 3e-4, 2e-4], [2.5e-4] * 4)
    assert r.speed().startswith(f"TP=2 against one process: {evidence.UNRELIABLE}")
    assert r.alphas().startswith(f"alpha after compute against back to back: {evidence.UNRELIABLE}")


def test_prediction_within_and_outside_2x():
    within = report([2e-3] * 4, [3e-3] * 4, [2e-4] * 4, [2e-4] * 4, predicted=2e-3)
    assert within.prediction().endswith("measured / predicted 1.50, within 2x")
    outside = report([2e-3] * 4, [11e-3] * 4, [2e-4] * 4, [2e-4] * 4, predicted=2e-3)
    assert "measured / predicted 5.50, outside 2x: the step paid 1.00 ms per collective" in outside.prediction()


@pytest.mark.timeout(90)
def test_measure_on_two_ranks(tinylm, pool2):
    prompt = ByteTokenizer().encode("The key of the red box is 42. The key of the blue box is")
    r = decode.measure(tinylm, prompt, pool2, tokens=6, rounds=4, repeats=3)
    assert r.tp_degree == 2 and len(r.tp) == 5 and len(r.back_to_back) == len(r.after) == 4
    assert r.message_bytes == tinylm.cfg.d_model * 4 and r.collectives == 2 * tinylm.cfg.n_layers + 2
    assert r.gap == pytest.approx(r.single_step / 2 / r.collectives)
    assert r.link.alpha == statistics.median(r.after) and r.predicted > r.single_step / 2
    for line in (r.measured(), r.alphas(), r.prediction(), r.speed()):
        assert line and "nan" not in line
    assert_refused(lambda: decode.measure(tinylm, prompt, pool2, rounds=0), ValueError, "rounds", 0, "positive")


def ev(rank, kind, start, end, step=0):
    return decode.Event(rank, step, kind, start, end)


def made_up_timeline():
    """Two ranks, one step with two all-reduces, in ns; the parts worked out by hand in the test."""
    r0 = [ev(0, "input", 0, 10), ev(0, "forward", 10, 100), ev(0, "all_reduce", 20, 50), ev(0, "all_reduce", 60, 90),
          ev(0, "sample", 100, 105)]
    r1 = [ev(1, "input", 0, 5), ev(1, "forward", 5, 100), ev(1, "all_reduce", 30, 50), ev(1, "all_reduce", 60, 95),
          ev(1, "sample", 101, 110)]
    return decode.StepTimeline(2, 1, tuple(r0 + r1), alpha=1e-8)


def test_parts_of_a_made_up_step():
    t = made_up_timeline()
    # all-reduce 0: last in 30, first out 50; all-reduce 1: last in 60, first out 90
    assert t.parts(0, 0) == pytest.approx({"input": 10e-9, "compute": 30e-9, "wait for peer": 10e-9,
                                           "in collective": 50e-9, "late exit": 0.0, "sample": 5e-9, "other": 0.0})
    assert t.parts(1, 0) == pytest.approx({"input": 5e-9, "compute": 40e-9, "wait for peer": 0.0,
                                           "in collective": 50e-9, "late exit": 5e-9, "sample": 9e-9, "other": 1e-9})
    assert t.step_seconds() == pytest.approx([110e-9]) and t.steps == 1
    assert t.per_collective() == pytest.approx({"wait for peer": 2.5e-9, "in collective": 25e-9,
                                                "late exit": 1.25e-9, "whole": 28.75e-9})
    assert "2 collectives" in t.explain() and "the link model prices 0 us" in t.explain()
    assert "over 2 collectives" in t.tail() and t.tail().endswith("holds 60% of the time")  # 30 of 20 + 30 ns
    assert t.timeline(0).splitlines()[1].split() == ["0", "all_reduce", "0", "0", "0", "0"]  # us, rounded


def test_a_rank_missing_a_collective_is_refused():
    t = made_up_timeline()
    broken = decode.StepTimeline(2, 1, tuple(e for e in t.events if not (e.rank == 1 and e.start_ns == 60)))
    assert_refused(lambda: broken.collectives(0), ValueError, "events", [2, 1], "the same number")


@pytest.mark.timeout(90)
def test_step_timeline_on_two_ranks(tinylm, pool2):
    prompt = ByteTokenizer().encode("The key of the red box is 42. The key of the blue box is")
    t = decode.step_timeline(tinylm, prompt, pool2, steps=6)
    assert t.steps == 6 and t.tp_degree == 2
    assert list(t.tokens) == tensor_parallel_generate(tinylm, prompt, 7, 2, pool=pool2)["tokens"]
    for step in range(t.steps):
        groups = t.collectives(step)
        assert len(groups) == 2 * tinylm.cfg.n_layers + 2
        assert [g[0].kind for g in groups] == ["all_reduce"] * (2 * tinylm.cfg.n_layers + 1) + ["all_gather"]
        for g in groups:  # one clock: nobody leaves a collective before everybody entered it
            assert min(e.end_ns for e in g) >= max(e.start_ns for e in g)
        for rank in range(2):
            mine = t.of(rank, step)
            outer = [e for e in mine if e.kind in ("input", "forward", "sample")]
            assert [e.kind for e in outer] == ["input", "forward", "sample"]
            assert all(a.end_ns <= b.start_ns for a, b in zip(outer, outer[1:]))  # ordered, no overlap
            inner = [e for e in mine if e.kind in decode.COLLECTIVES]
            assert all(outer[1].start_ns <= e.start_ns <= e.end_ns <= outer[1].end_ns for e in inner)
            assert all(a.end_ns <= b.start_ns for a, b in zip(inner, inner[1:]))
            parts = t.parts(rank, step)
            span = (mine[-1].end_ns - mine[0].start_ns) / 1e9
            assert sum(parts.values()) == pytest.approx(span, abs=1e-8) and min(parts.values()) >= 0
            assert parts["other"] < 0.2 * span
            assert span <= t.step_seconds()[step]
    assert_refused(lambda: decode.step_timeline(tinylm, prompt, pool2, steps=0), ValueError, "steps", 0, "positive")
