"""The decode report: one measurement of TinyLM's step in one process and with TP=2 ranks, and verdicts that
follow the course's evidence rule (a direction only from repeats that separate) and the 2x goal of the
prediction, checked on made-up timings so that no test depends on the clock."""
import statistics

import pytest

from labkit.course import evidence
from labkit.course.timing import Timing
from labkit.parallel import LinkModel, decode
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
