"""The paired retention interval against its formula computed by hand and against figures published in
benchmarks/RESULTS.md; evaluate and sweep against direct calls of the tinylm evaluation functions."""
import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import SETTINGS, gptq, quality, quantize_model
from labkit.quant.policy import Setting
from labkit.tinylm import TASK_KINDS, corpus, perplexity, task_correct

from ..refusals import assert_refused


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


def test_the_sweep_gives_the_same_answers_on_one_thread_and_all(pretrained):
    model, _ = pretrained
    tasks, text = quality.quality_tasks(per_kind=8), corpus.corpus("test", n_bytes=1024, seed=0)
    settings_ = (SETTINGS[0], SETTINGS[6])
    one = quality.sweep(model, tasks, text, settings_)  # threads=1 by default
    every = quality.sweep(model, tasks, text, settings_, threads=None, progress=True)
    assert [(r["ppl"], r["ok"]) for r in one.values()] == [(r["ppl"], r["ok"]) for r in every.values()]
    with pytest.raises(TypeError, match="progress must be True or False, got 1"):
        quality.sweep(model, tasks, text, settings_, progress=1)


def test_table_prints_every_setting_and_what_a_task_is_worth():
    ok = [True] * 9 + [False]
    lost_one = [False] + [True] * 8 + [False]
    base = {"ppl": 3.57, "ok": ok, "correct": 9, "arithmetic": 0.5, "recall": 1.0, "copy": 1.0, "KiB": 3204.0,
            "bpw": 32.0, "ratio": 1.0}
    q = {**base, "ok": lost_one, "correct": 8, "KiB": 504.0, "bpw": 5.04, "ratio": 6.4, "ppl": 3.5908}
    results = {}
    for name, r in (("FP32", base), ("INT4 asym g32", q)):
        k = quality.retention(r["ok"], ok)
        results[name] = {**r, "gained": k.gained, "lost": k.lost, "retained": k.retained, "low": k.low, "high": k.high}
    lines = quality.table(results)
    assert lines[0].split() == ["KiB", "bits/w", "vs", "FP32", "ppl", "arith", "recall", "copy", "+/-", "retained",
                                "(95%)"]
    assert lines[2].split()[:10] == ["INT4", "asym", "g32", "504", "5.04", "6.4x", "3.5908", "50%", "100%", "100%"]
    assert lines[2].split()[10:] == ["0/1", "88.9%", "(67.1%-110.7%)"]
    assert lines[-1] == "the first row answers 9 of 10 tasks: one task is 11.11% of retention"
    with pytest.raises(ValueError, match="results must be a non-empty dict from quality.sweep"):
        quality.table({})


def test_split_text_cuts_equal_consecutive_pieces():
    text = bytes(range(10))
    assert quality.split_text(text, 3) == [bytes([0, 1, 2]), bytes([3, 4, 5]), bytes([6, 7, 8])]
    with pytest.raises(ValueError, match="n must be at most 5 for a text of 10 tokens"):
        quality.split_text(text, 6)
    with pytest.raises(TypeError, match="text must be bytes or a 1-D integer tensor of token ids, got 'str'"):
        quality.split_text("abc", 1)
    assert_refused(lambda: quality.split_text(torch.zeros(8), 2), TypeError, "text", "Tensor",
                   "bytes or a 1-D integer tensor of token ids")
    assert quality.split_text(torch.arange(8), 2)[1].tolist() == [4, 5, 6, 7]


def test_sensitivity_against_direct_perplexities(pretrained):
    model, _ = pretrained
    text = corpus.corpus("test", n_bytes=1024, seed=1)
    sens = quality.sensitivity(model, text, kinds=("attention", "mlp"), n_pieces=2)
    qmodel, report = quantize_model(model, {"mlp": "int4"}, 32, "asym")
    pieces = [text[:512], text[512:]]
    mlp = sens["mlp"]
    assert mlp.delta == perplexity(qmodel, text) - perplexity(model, text)
    assert mlp.piece_deltas == tuple(perplexity(qmodel, p) - perplexity(model, p) for p in pieces)
    params = [r["params"] for r in report["layers"]]
    assert mlp.share == sum(p for p, r in zip(params, report["layers"]) if r["type"] == "mlp") / sum(params)
    assert mlp.per_weight == mlp.delta / mlp.share and len(mlp.piece_per_weight) == 2
    line = quality.sensitivity_lines(sens)[1]
    assert line.startswith(f"only mlp        in INT4 ({mlp.share:4.0%} of the weights): perplexity {mlp.delta:+.4f}")
    kinds = quality.SENSITIVE_KINDS
    assert_refused(lambda: quality.sensitivity(model, text, kinds=("ffn",)), ValueError, "kinds", "ffn",
                   f"one of {kinds}")
    assert_refused(lambda: quality.sensitivity(model, text, kinds=("norm",)), ValueError, "kinds", "norm", "one of")
    assert_refused(lambda: quality.sensitivity(model, text, kinds=(1,)), TypeError, "kinds", 1, "one of")
    assert_refused(lambda: quality.sensitivity(model, text, kinds="mlp"), TypeError, "kinds", "mlp",
                   "a non-empty sequence of layer types")
    assert_refused(lambda: quality.sensitivity(model, text, precision="int3"), ValueError, "precision", "int3",
                   "one of ('fp16', 'bf16', 'int8', 'int4')")
    assert_refused(lambda: quality.sensitivity_lines({"mlp": 1}), TypeError, "sens['mlp']", 1,
                   "a labkit.quant.quality.Sensitivity")


def test_gptq_vs_rtn_against_direct_calls(pretrained):
    # the one comparison notebook 03 and benchmarks/quant_quality.py print, rebuilt from its parts
    model, _ = pretrained
    text = corpus.corpus("test", n_bytes=1024, seed=2)
    cal = torch.tensor(list(corpus.corpus("train", 2 * 64, seed=0))).view(2, 64)
    (key, c), = quality.gptq_vs_rtn(model, text, cal, (("channel", "sym"),), n_pieces=2).items()
    policy = {"attention": "int4", "mlp": "int4"}
    f64 = lambda m: copy.deepcopy(m).double()  # noqa: E731  (every figure in float64: the same on any CPU)
    rtn = f64(quantize_model(model, policy, "channel", "sym")[0])
    gq = f64(quantize_model(model, policy, "channel", "sym", qtensors=gptq.gptq(model, cal, 4, "channel", "sym"))[0])
    model = f64(model)
    pieces = [text[:512], text[512:]]
    assert key == ("channel", "sym") and (c.group_size, c.scheme) == key
    # float64 on another thread count (gptq_vs_rtn runs on 1): equal to ~1e-15
    assert (c.base, c.rtn, c.gptq) == pytest.approx((perplexity(model, text), perplexity(rtn, text),
                                                     perplexity(gq, text)), rel=1e-12, abs=0)
    assert c.paired.differences == pytest.approx(tuple(perplexity(gq, p) - perplexity(rtn, p) for p in pieces),
                                                 rel=0, abs=1e-12)
    assert c.removed == (c.rtn - c.gptq) / (c.rtn - c.base)
    assert c.verdict == {"below": "GPTQ beats RTN", "above": "RTN beats GPTQ"}.get(c.paired.decision,
                                                                                  "within the noise between texts")
    assert c.line().startswith(f"INT4 sym group channel: perplexity vs FP32 RTN {c.rtn - c.base:+.4f}, GPTQ "
                               f"{c.gptq - c.base:+.4f} (removes {c.removed:.0%} of RTN's increase); "
                               "GPTQ - RTN over 2 pieces")
    assert_refused(lambda: quality.gptq_vs_rtn(model, text, cal, ((32, "nf4"),)), ValueError, "scheme", "nf4", "one of")
    assert_refused(lambda: quality.gptq_vs_rtn(model, text, cal, (32, "asym")), TypeError, "settings", (32, "asym"),
                   "(group_size, scheme) pairs")
    assert_refused(lambda: quality.gptq_vs_rtn(model, text, cal, ()), TypeError, "settings", (),
                   "a non-empty sequence of (group_size, scheme) pairs")


def test_table_refuses_rows_that_are_not_a_sweeps():
    assert_refused(lambda: quality.table({"a": {}}), ValueError, "results['a']", [], "a dict from quality.sweep")
    assert_refused(lambda: quality.table({"a": 1}), TypeError, "results['a']", 1, "a dict from quality.sweep")


def test_table_refuses_a_baseline_with_no_right_answer():
    row = {"ppl": 3.6, "ok": [False] * 4, "correct": 0, "arithmetic": 0.0, "recall": 0.0, "copy": 0.0, "KiB": 1.0,
           "bpw": 32.0, "ratio": 1.0, "gained": 0, "lost": 0, "retained": 1.0, "low": 1.0, "high": 1.0}
    assert_refused(lambda: quality.table({"FP32": row}), ValueError, "results", "a first row with 0 right answers",
                   "at least one right answer")
