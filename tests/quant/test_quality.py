"""The paired retention interval against its formula computed by hand and against figures published in
benchmarks/RESULTS.md; evaluate and sweep against direct calls of the tinylm evaluation functions."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import SETTINGS, Setting, quality, quantize_model
from labkit.tinylm import TASK_KINDS, corpus, perplexity, task_correct


def flips(base_right: int, base_wrong: int, gained: int, lost: int) -> tuple[list[bool], list[bool]]:
    """Answers of a baseline and of a model that gains `gained` of its wrong tasks and loses `lost` right ones."""
    base = [True] * base_right + [False] * base_wrong
    ok = [False] * lost + [True] * (base_right - lost) + [True] * gained + [False] * (base_wrong - gained)
    return ok, base


@pytest.mark.parametrize("gained, lost, low, high", [  # RESULTS.md, 600 tasks, FP32 right on 450
    (13, 26, 0.944, 0.998), (9, 31, 0.924, 0.979), (24, 18, 0.985, 1.042), (0, 1, 0.993, 1.002), (0, 0, 1.0, 1.0)])
def test_published_intervals(gained, lost, low, high):
    ok, base = flips(450, 150, gained, lost)
    r = quality.retention(ok, base)
    assert (r.gained, r.lost, r.correct, r.base_correct) == (gained, lost, 450 + gained - lost, 450)
    assert round(r.low, 3) == low and round(r.high, 3) == high


@settings(max_examples=60, deadline=None)
@given(answers=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=200),
       z=st.sampled_from([1.0, 1.96, 2.58]))
def test_interval_matches_the_formula(answers, z):
    ok, base = [a for a, _ in answers], [b for _, b in answers]
    if not any(base):
        with pytest.raises(ValueError, match="base_ok must contain at least one right answer"):
            quality.retention(ok, base, z)
        return
    r = quality.retention(ok, base, z)
    gained = sum(1 for a, b in answers if a and not b)
    lost = sum(1 for a, b in answers if b and not a)
    n = sum(base)
    assert r.retained == pytest.approx(sum(ok) / n) == pytest.approx(1 + (gained - lost) / n)
    assert r.low == pytest.approx(1 + (gained - lost - z * math.sqrt(gained + lost)) / n)
    assert r.high == pytest.approx(1 + (gained - lost + z * math.sqrt(gained + lost)) / n)
    assert r.low <= r.retained <= r.high


def test_decide_reads_the_whole_interval():
    r = quality.Retention(correct=455, base_correct=450, gained=16, lost=11, low=0.988, high=1.034)
    assert r.decide(0.987) == "reached"
    assert r.decide(1.05) == "not reached"
    assert r.decide(1.0) == "cannot tell: 100.0% is inside the interval"
    with pytest.raises(TypeError, match="target must be a positive finite number"):
        r.decide("98.7%")


def test_bad_answers_are_refused():
    with pytest.raises(TypeError, match="ok must be a sequence of bools"):
        quality.retention([1, 0], [True, True])
    with pytest.raises(TypeError, match="base_ok must be a sequence of bools"):
        quality.retention([True], "T")
    with pytest.raises(ValueError, match=r"ok must hold as many answers as base_ok \(2\), got 1"):
        quality.retention([True], [True, False])
    with pytest.raises(ValueError, match="z must be a positive finite number, got -1"):
        quality.retention([True], [True], z=-1)


def test_quality_tasks_are_the_same_tasks_sorted_by_length():
    tasks = quality.quality_tasks(per_kind=5)
    assert len(tasks) == 15 and {t.kind for t in tasks} == set(TASK_KINDS)
    lengths = [len(t.prompt) + len(t.answer) for t in tasks]
    assert lengths == sorted(lengths)
    assert sorted(map(repr, tasks)) == sorted(repr(t) for k in TASK_KINDS for t in corpus.make_tasks(k, 5))
    with pytest.raises(TypeError, match="per_kind must be a positive int"):
        quality.quality_tasks(per_kind=5.0)


def test_evaluate_and_sweep_agree_with_direct_calls(pretrained):
    model, _ = pretrained
    tasks, text = quality.quality_tasks(per_kind=8), corpus.corpus("test", n_bytes=1024, seed=0)
    settings_ = (SETTINGS[0], Setting("INT4 sym channel", {"attention": "int4", "mlp": "int4"}, "channel", "sym"))
    results = quality.sweep(model, tasks, text, settings_)
    assert list(results) == ["FP32", "INT4 sym channel"]
    base, q = results["FP32"], results["INT4 sym channel"]
    assert base["ppl"] == perplexity(model, text) and base["ok"] == task_correct(model, tasks)
    assert (base["gained"], base["lost"], base["retained"], base["low"], base["high"]) == (0, 0, 1.0, 1.0, 1.0)
    qmodel, report = quantize_model(model, {"attention": "int4", "mlp": "int4"}, "channel", "sym")
    assert q["ppl"] == perplexity(qmodel, text) and q["ok"] == task_correct(qmodel, tasks)
    assert q["bpw"] == report["bits_per_weight"] and q["KiB"] == report["bytes"] / 1024
    r = quality.retention(q["ok"], base["ok"])
    assert q["retention"] == r and (q["gained"], q["lost"], q["low"], q["high"]) == (r.gained, r.lost, r.low, r.high)
    for kind in TASK_KINDS:
        mine = [o for o, t in zip(q["ok"], tasks) if t.kind == kind]
        assert q[kind] == sum(mine) / len(mine)
    with pytest.raises(ValueError, match="settings must be settings with distinct names"):
        quality.sweep(model, tasks, text, (SETTINGS[0], SETTINGS[0]))
    with pytest.raises(TypeError, match="settings must be a non-empty sequence of labkit.quant.Setting"):
        quality.sweep(model, tasks, text, ())
    with pytest.raises(TypeError, match="tasks must be a non-empty list"):
        quality.evaluate(model, "tasks", text)
