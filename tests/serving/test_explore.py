"""Notebook 06's pictures and drivers: the sampling stages are the sampling module's, the timeline and the sweep
agree with the engine's own records, the plots draw the arrays they are given, the scheduler widget and its
static fallback, the recorded logits are the model's, and the service subprocess starts, answers and stops."""
import math

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from labkit.serving import Engine, SamplingParams, StepCost, explore, probabilities, workload  # noqa: E402
from labkit.serving.sampling import _filtered  # noqa: E402
from labkit.tinylm import make_tasks  # noqa: E402



@pytest.fixture(autouse=True, scope="module")
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # TinyLM's steps are tiny: extra threads only wait for each other
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def trace():
    return workload.make_trace(6, rate=200, seed=1)


LOGITS = torch.tensor([2.0, 1.6, 1.2, 1.0, 0.4, 0.1, -0.5, -1.5])


def test_filter_stages_switch_the_chain_on_step_by_step():
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.8, min_p=0.4)
    stages = explore.filter_stages(LOGITS, params)
    assert [n for n, _ in stages] == ["softmax", "temperature 0.8", "top-k 5", "top-p 0.8", "min-p 0.4"]
    z = LOGITS.double()
    assert torch.allclose(stages[0][1], torch.softmax(z, 0)) and torch.allclose(stages[1][1], torch.softmax(z / 0.8, 0))
    assert [int((p > 0).sum()) for _, p in stages] == [8, 8, 5, 3, 2]
    assert torch.equal(stages[-1][1], probabilities(LOGITS, params))
    only_p = explore.filter_stages(LOGITS, SamplingParams(temperature=1.0, top_p=0.5))
    assert [n for n, _ in only_p] == ["softmax", "temperature 1", "top-p 0.5"]
    assert torch.equal(only_p[-1][1], _filtered(z, SamplingParams(top_p=0.5)))
    with pytest.raises(ValueError, match="params must be a sampled SamplingParams"):
        explore.filter_stages(LOGITS, SamplingParams(temperature=0))
    with pytest.raises(TypeError, match="params"):
        explore.filter_stages(LOGITS, {"temperature": 1})


def test_plot_filters_draws_each_stage():
    stages = explore.filter_stages(LOGITS, SamplingParams(temperature=0.8, top_k=3))
    fig = explore.plot_filters(stages, labels=[f"t{i}" for i in range(8)])
    assert len(fig.axes) == len(stages)
    for ax, (_, p) in zip(fig.axes, stages):
        assert np.allclose([b.get_height() for b in ax.patches], p.numpy())
        assert ax.get_title().endswith(f"{int((p > 0).sum())} kept")


def test_timeline_agrees_with_the_history(model, trace):
    engine = explore.run_policy(model, trace, "chunked", max_num_seqs=3, max_num_batched_tokens=32,
                                enable_prefix_caching=False)  # every prompt token computed: exact counts below
    ids = [r.request_id for r in trace]
    assert all(engine.get(i).finished for i in ids)
    t = explore.timeline(engine.history, ids)
    pairs = [(i, ids.index(rid), n) for i, h in enumerate(engine.history) for rid, n in h["batch"]]
    assert list(zip(t["step"].tolist(), t["row"].tolist(), t["tokens"].tolist())) == pairs
    assert t["tokens"].sum() == sum(h["tokens"] for h in engine.history) and t["tokens"].max() <= 32
    for i, r in enumerate(trace):  # a request computes its prompt, then one token per output token but the last
        assert t["tokens"][t["row"] == i].sum() == len(r.prompt) + r.max_tokens - 1
    assert explore.timeline([], ids)["step"].shape == (0,)
    fig = explore.plot_timeline({"chunked": engine}, ids)
    points = np.concatenate([c.get_offsets() for c in fig.axes[0].collections])
    assert sorted(map(tuple, points.tolist())) == sorted(zip(t["step"].tolist(), t["row"].tolist()))
    bar = fig.axes[-1]  # the colour bar: the prefill tokens' scale, from 1 to the largest prefill
    assert "prefill tokens" in bar.get_ylabel() and bar.get_ylim() == (1, t["tokens"].max())


def test_fit_step_cost_recovers_the_clock_it_was_run_on(model, trace):
    """Steps timed by a known StepCost give that StepCost back (the fit's terms are its three columns)."""
    cost = StepCost(overhead=3e-3, per_token=4e-5, per_seq=1.5e-4)
    engines = [explore.run_policy(model, trace, p, max_num_seqs=3) for p in ("static", "continuous")]
    for e in engines:
        for h in e.history:
            h["seconds"] = cost.seconds(h["tokens"], len(h["batch"]))
    fitted = explore.fit_step_cost(engines)
    assert all(math.isclose(getattr(fitted, k), getattr(cost, k), rel_tol=1e-6)
               for k in ("overhead", "per_token", "per_seq"))
    with pytest.raises(ValueError, match="engines"):
        explore.fit_step_cost([Engine(model, clock=StepCost())])
    with pytest.raises(TypeError, match="engines"):
        explore.fit_step_cost(["not an engine"])


def test_sweep_rows_are_the_engines_numbers_and_the_plot_draws_them(model):
    rows = explore.sweep(model, rates=(4, 400), policies=("static", "continuous"), n=6, slo={"ttft": 50})
    assert [(r["policy"], r["rate"]) for r in rows] == [("static", 4.0), ("continuous", 4.0), ("static", 400.0),
                                                        ("continuous", 400.0)]
    busy = workload.make_trace(6, 400, seed=0)
    engine = explore.run_policy(model, busy, "static")
    seqs = [engine.get(r.request_id) for r in busy]
    end = max(s.token_times[-1] for s in seqs)
    assert math.isclose(rows[2]["tok/s"], sum(s.num_output_tokens for s in seqs) / end)
    ttfts = sorted(s.token_times[0] - s.arrival for s in seqs)
    assert math.isclose(rows[2]["median TTFT ms"], 1000 * (ttfts[2] + ttfts[3]) / 2)
    assert math.isclose(rows[2]["goodput"], sum(t <= 0.05 for t in ttfts) / end)
    assert rows[3]["tok/s"] > rows[2]["tok/s"] and rows[3]["median TTFT ms"] < rows[2]["median TTFT ms"]
    fig = explore.plot_sweep(rows)
    left, right = fig.axes
    assert [list(line.get_ydata()) for line in left.lines] == [[rows[0]["tok/s"], rows[2]["tok/s"]],
                                                              [rows[1]["tok/s"], rows[3]["tok/s"]]]
    assert list(right.lines[1].get_xdata()) == [rows[1]["tok/s"], rows[3]["tok/s"]]
    assert list(right.lines[1].get_ydata()) == [rows[1]["mean E2E ms"], rows[3]["mean E2E ms"]]
    assert math.isnan(explore.sweep(model, (400,), ("continuous",), n=2)[0]["goodput"])


@pytest.fixture(scope="module")
def snaps(model):
    small = workload.make_trace(6, rate=float("inf"), seed=3, long_tail=0.5)
    return explore.record_steps(Engine(model, num_blocks=10, max_num_seqs=4, clock=StepCost()), small)


def test_record_steps_keeps_queues_and_blocks(snaps):
    assert [s["step"] for s in snaps] == list(range(1, len(snaps) + 1))
    assert all(0 <= s["blocks_used"] <= s["blocks_total"] == 10 for s in snaps)
    assert all(len(s["running"]) <= 4 for s in snaps) and any(s["preempted"] for s in snaps)
    assert all(t["time"] >= s["time"] for s, t in zip(snaps, snaps[1:]))
    everyone = {rid for s in snaps for q in ("running", "waiting", "swapped") for rid in s[q]}
    assert everyone == {f"req-{i}" for i in range(6)}
    assert snaps[-1]["blocks_used"] == 0 and not (snaps[-1]["running"] or snaps[-1]["waiting"])
    with pytest.raises(TypeError, match="engine"):
        explore.record_steps("engine", [])


def test_step_picture_shows_one_snapshot():
    snap = {"step": 3, "time": 0.0125, "batch": [("a", 1), ("b", 17)], "preempted": ["c"], "running": ["a", "b"],
            "waiting": [], "swapped": ["c"], "blocks_used": 3, "blocks_total": 12}
    lines = explore.step_picture(snap, width=12).splitlines()
    assert lines[0] == "step 3  t=0.013 s  batch: a x1, b x17"
    assert lines[1].split() == ["running", "a", "b", "|", "waiting", "-", "|", "swapped", "c"]
    assert "[###.........] 3/12 in use" in lines[2] and lines[2].endswith("preempted: c")


def test_widget_and_static_fallback(snaps, capsys):
    widget = explore.scheduler_explorer(snaps)
    slider, button = widget.children[0].children
    assert slider.max == len(snaps) and slider.value == 1
    capsys.readouterr()
    button.click()  # outside a kernel the widget's output area prints here
    assert slider.value == 2 and explore.step_picture(snaps[1]) in capsys.readouterr().out
    slider.value = len(snaps)
    button.click()
    assert slider.value == len(snaps)
    capsys.readouterr()
    assert explore.scheduler_explorer(snaps, static=True, every=5) is None
    assert capsys.readouterr().out.count("step ") == len(snaps[::5])
    with pytest.raises(ValueError, match="snaps"):
        explore.scheduler_explorer([], static=True)


def test_recorded_logits_are_the_models_alone(model, tok):
    prompts = [tok.encode(t.prompt) for t in make_tasks("arithmetic", 3) + make_tasks("copy", 2)]
    engine = Engine(runner=explore.RecordingRunner(model, num_blocks=64), clock=StepCost())
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    logits = explore.engine_logits(engine)
    assert list(logits) == list(engine.requests)
    for rid, p, out in zip(engine.requests, prompts, outs):
        with torch.no_grad():
            alone = model(torch.tensor([p + out]))[0, len(p) - 1:len(p) - 1 + len(out)]  # [6, vocab]
        assert logits[rid].shape == alone.shape and torch.allclose(logits[rid], alone, atol=1e-4)
        assert logits[rid].argmax(-1).tolist() == out
    chunked = Engine(runner=explore.RecordingRunner(model, num_blocks=64), policy="chunked",
                     max_num_seqs=4, max_num_batched_tokens=8, clock=StepCost())
    chunked.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0))
    with pytest.raises(ValueError, match="every scheduled request samples"):
        explore.engine_logits(chunked)
    short = Engine(runner=explore.RecordingRunner(model, num_blocks=64), history_limit=2, clock=StepCost())
    short.generate(prompts[:1], SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(ValueError, match="one entry per step"):
        explore.engine_logits(short)
    with pytest.raises(TypeError, match="RecordingRunner"):
        explore.engine_logits(Engine(model, clock=StepCost()))
