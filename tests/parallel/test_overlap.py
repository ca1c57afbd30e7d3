"""Overlap: the model's times, and a real run of both modes whose events are one compute and one
all-reduce per micro-batch, the overlapped all-reduce of micro-batch i issued before micro-batch i+1
computes."""
import pytest

from labkit.parallel import overlap as ov
from tests.refusals import assert_refused


def test_predicted_seconds():
    assert ov.predicted_seconds("sequential", 4, 1.0, 0.5) == 6.0
    assert ov.predicted_seconds("overlapped", 4, 1.0, 0.5) == 1.0 + 3 * 1.0 + 0.5
    assert ov.predicted_seconds("overlapped", 4, 0.5, 1.0) == 0.5 + 3 * 1.0 + 1.0
    assert_refused(lambda: ov.predicted_seconds("both", 1, 1, 1), ValueError, "mode", "both", "one of")


@pytest.mark.timeout(60)
def test_both_modes_run(pool2):
    run = ov.run_overlap(microbatches=3, width=32, depth=2, rows=16, pool=pool2)
    for mode in ov.MODES:
        kinds = sorted((k, i) for k, i, _, _ in run[mode]["events"])
        assert kinds == sorted([("comm", i) for i in range(3)] + [("compute", i) for i in range(3)])
        assert run[mode]["seconds"] > 0
    ev = {(k, i): (a, b) for k, i, a, b in run["overlapped"]["events"]}
    assert ev[("comm", 0)][0] <= ev[("compute", 1)][0]  # issued before the next compute starts
    ends = [ev[("comm", i)][1] for i in range(3)]
    waited = run["overlapped"]["waited"]
    assert len(waited) == 3 and all(ev[("comm", i)][0] < end <= w for i, (end, w) in enumerate(zip(ends, waited)))
    # the bar ends when the collective completed, which the next compute did not wait for: a bar ending only
    # when wait() returned (after the next compute) would end after that compute on every micro-batch
    assert any(ends[i] < ev[("compute", i + 1)][1] for i in range(2)) or ends[0] < waited[0]
    assert_refused(lambda: ov.run_overlap(microbatches=0), ValueError, "microbatches", 0, "positive")
