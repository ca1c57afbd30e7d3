"""Notebook 06's pictures and drivers: the sampling chain stage by stage, a timeline of which requests ran at
each engine step, a sweep of request rates for each batching policy (throughput against latency), a widget
that steps through the scheduler's queues and blocks (with a static fallback), and the HTTP service started
as a subprocess for the notebook's `openai` client.

    step 12  t=0.031 s  batch: req-0 x1, req-3 x1, req-5 x17    (x17: a prefill of 17 tokens)
             running  req-0 req-3 req-5 | waiting req-6 | swapped -
             blocks   [########......]  8/14 in use           preempted: -
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np
import torch

from .._checks import check_bool, check_positive_int, check_type, fail
from .engine import Engine, StepCost
from .launch import ServiceProcess, start_service  # noqa: F401 (re-exported: notebook 06, section 6)
from .metrics import summarize
from .runner import ModelRunner
from .sampling import SamplingParams, probabilities
from .config import SCHEDULING_POLICIES
from .workload import make_trace

# --- 1. sampling ----------------------------------------------------------------------------------------


def filter_stages(logits: torch.Tensor, params: SamplingParams) -> list[tuple[str, torch.Tensor]]:
    """(stage, probabilities [V]) after each step of the chain of labkit.serving.sampling, in its order:
    softmax, then temperature, top-k, top-p and min-p switched on one after the other (the module's own
    `probabilities`, never a copy). Stages that `params` leaves off are skipped."""
    check_type("params", params, SamplingParams, "a SamplingParams")
    if params.greedy:
        fail("params", params, "a sampled SamplingParams (temperature > 0): greedy has no chain")
    steps = [("softmax", {}), (f"temperature {params.temperature:g}", {"temperature": params.temperature})]
    for name, key, off in (("top-k", "top_k", 0), ("top-p", "top_p", 1.0), ("min-p", "min_p", 0.0)):
        if getattr(params, key) != off:
            steps.append((f"{name} {getattr(params, key):g}", {**steps[-1][1], key: getattr(params, key)}))
    return [(name, probabilities(logits, SamplingParams(**kw))) for name, kw in steps]


def plot_filters(stages: list[tuple[str, torch.Tensor]], labels: list[str] | None = None):
    """One bar chart per stage of filter_stages, side by side; kept tokens coloured. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(stages), figsize=(2.3 * len(stages), 2.8), sharey=True)
    for ax, (name, p) in zip(np.atleast_1d(axes), stages):
        x = np.arange(p.numel())
        ax.bar(x, p.numpy(), color=["C0" if v > 0 else "0.8" for v in p.tolist()])
        ax.set_title(f"{name}\n{int((p > 0).sum())} kept", fontsize=9)
        ax.set_xticks(x, labels if labels is not None else [str(i) for i in x], fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("probability")
    fig.tight_layout()
    return fig


# --- 2. the engine: timelines and a sweep of request rates ----------------------------------------------


def timeline(history: Iterable[dict], request_ids: list[str]) -> dict[str, np.ndarray]:
    """The arrays behind plot_timeline: for every (step, request) pair of engine.history, the step index,
    the request's row (its index in request_ids) and the tokens it computed in that step."""
    check_type("history", history, (list, deque), "engine.history (a list or deque of step dicts)")
    rows = {rid: i for i, rid in enumerate(request_ids)}
    pts = [(i, rows[rid], n) for i, h in enumerate(history) for rid, n in h["batch"] if rid in rows]
    step, row, tokens = (np.array(v, dtype=np.int64) for v in zip(*pts)) if pts else (np.zeros(0, np.int64),) * 3
    return {"step": step, "row": row, "tokens": tokens}


def plot_timeline(engines: dict[str, Engine], request_ids: list[str]):
    """Which requests ran at each step, one panel per engine: a dot per decode step, a larger mark per
    prefill (or prefill chunk), coloured by its tokens on one scale for every panel (the colour bar on the
    right). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    fig, axes = plt.subplots(len(engines), 1, figsize=(7, 1.2 + 0.16 * len(request_ids) * len(engines)),
                             sharex=True, squeeze=False)
    lines = {name: timeline(engine.history, request_ids) for name, engine in engines.items()}
    most = max([int(t["tokens"].max()) for t in lines.values() if len(t["tokens"])] + [2])
    norm = Normalize(vmin=1, vmax=most)
    for ax, (name, engine) in zip(axes[:, 0], engines.items()):
        t = lines[name]
        decode, prefill = t["tokens"] == 1, t["tokens"] > 1
        ax.scatter(t["step"][decode], t["row"][decode], s=3, marker="s", color="0.45", label="decode (1 token)")
        marks = ax.scatter(t["step"][prefill], t["row"][prefill], s=16, marker="D", c=t["tokens"][prefill],
                           cmap="viridis", norm=norm, label="prefill")
        ax.set_yticks(range(len(request_ids)), request_ids, fontsize=6)
        ax.invert_yaxis()
        ax.set_title(f"{name}: {len(engine.history)} steps", fontsize=9)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("engine step")
    fig.tight_layout()
    fig.colorbar(marks, ax=axes[:, 0].tolist(), label="prefill tokens in the step", fraction=0.03, pad=0.02)
    return fig


def run_policy(model, trace, policy: str, clock=None, **engine_options) -> Engine:
    """An Engine with `policy` on `clock` (default: the modelled StepCost()) after replaying `trace`."""
    engine = Engine(model, policy=policy, clock=StepCost() if clock is None else clock, **engine_options)
    engine.run(trace)
    return engine


def fit_step_cost(engines: Iterable[Engine]) -> StepCost:
    """The StepCost that best fits the measured steps of `engines` (run with clock="measured"): least squares
    of each step's seconds on (1, tokens computed, sequences in the batch), negative terms set to 0. Replaying
    a trace on it predicts what the measured clock gives on this machine (notebook 06, section 2)."""
    engines = list(engines)
    for e in engines:
        check_type("engines", e, Engine, "Engines run with clock='measured'")
    steps = [h for e in engines for h in e.history]
    if len(steps) < 3:
        fail("engines", f"{len(steps)} steps", "at least 3 measured steps to fit 3 terms")
    x = np.array([[1.0, h["tokens"], len(h["batch"])] for h in steps])
    y = np.array([h["seconds"] for h in steps])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return StepCost(*(max(0.0, float(c)) for c in coef))


def sweep(model, rates: Iterable[float], policies: Iterable[str] = SCHEDULING_POLICIES, n: int = 24, seed: int = 0,
          slo: dict | None = None, clock=None, **engine_options) -> list[dict]:
    """One row per (policy, request rate): the same `n`-request trace (make_trace(n, rate, seed=seed)) replayed
    on `clock` (default StepCost(): deterministic); throughput (output tok/s), median TTFT and mean E2E
    latency (ms), mean TPOT (ms), goodput under `slo` (req/s)."""
    check_positive_int("n", n, "requests")
    rows = []
    for rate in rates:
        trace = make_trace(n, rate, seed=seed)
        for policy in policies:
            engine = run_policy(model, trace, policy, clock, **engine_options)
            s = summarize([engine.get(r.request_id) for r in trace], slo=slo, start=0.0)
            rows.append({"policy": policy, "rate": float(rate), "tok/s": s.output_throughput,
                         "median TTFT ms": s.stats["ttft"].median, "mean TPOT ms": s.stats["tpot"].mean,
                         "mean E2E ms": s.stats["e2el"].mean,
                         "goodput": s.request_goodput if slo is not None else float("nan")})
    return rows


def plot_sweep(rows: list[dict], latency: str = "mean E2E ms"):
    """Left: output throughput against the request rate; right: `latency` against throughput; one line per
    policy, points in order of rate. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    looks = [dict(marker="o", linestyle="-", markersize=5, linewidth=1.5),
             dict(marker="s", linestyle="-", markersize=10, linewidth=5, alpha=0.35),  # a wide pale band, so that
             dict(marker="x", linestyle=":", markersize=7, linewidth=1.5)]           # a curve drawn on it shows both
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rate"])
        rate, tps, lat = ([r[k] for r in mine] for k in ("rate", "tok/s", latency))
        look = looks[i % len(looks)]
        left.plot(rate, tps, label=policy, color=f"C{i}", **look)
        right.plot(tps, lat, label=policy, color=f"C{i}", **look)
    left.set(xscale="log", xlabel="request rate (req/s)", ylabel="output tokens/s")
    right.set(xlabel="output tokens/s", ylabel=latency.replace(" ms", " latency (ms)"), yscale="log")
    left.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- 3. the scheduler, step by step ---------------------------------------------------------------------


def record_steps(engine: Engine, trace) -> list[dict]:
    """Replay `trace` on `engine` (an offline clock) and keep, after every step, what the widget shows: time,
    the batch [(request, tokens)], who was preempted, the running / waiting / swapped queues, blocks used."""
    check_type("engine", engine, Engine, "a labkit.serving.Engine")
    snaps: list[dict] = []

    def snapshot(e: Engine) -> None:
        s, h = e.scheduler, e.history[-1]
        snaps.append({"step": e.steps, "time": h["time"], "batch": list(h["batch"]),
                      "preempted": list(h["preempted"]), "running": [q.request_id for q in s.running],
                      "waiting": [q.request_id for q in s.waiting], "swapped": [q.request_id for q in s.swapped],
                      "blocks_used": e.block_manager.num_used_blocks, "blocks_total": e.block_manager.num_blocks})
    engine.run(trace, progress=snapshot)
    return snaps


def step_picture(snap: dict, width: int = 24) -> str:
    """One snapshot of record_steps as three lines of text (see the module docstring)."""
    batch = ", ".join(f"{rid} x{n}" for rid, n in snap["batch"]) or "-"
    used = round(width * snap["blocks_used"] / snap["blocks_total"])
    queues = " | ".join(f"{q} {' '.join(snap[q]) or '-'}" for q in ("running", "waiting", "swapped"))
    return (f"step {snap['step']}  t={snap['time']:.3f} s  batch: {batch}\n         {queues}\n"
            f"         blocks   [{'#' * used}{'.' * (width - used)}] {snap['blocks_used']}/{snap['blocks_total']} "
            f"in use   preempted: {' '.join(snap['preempted']) or '-'}")


def scheduler_explorer(snaps: list[dict], static: bool = False, every: int = 1):
    """A slider and a "next step" button over record_steps' snapshots, each shown as step_picture; static=True
    (or without ipywidgets) prints every `every`-th step instead. Returns the widget, or None when static."""
    check_bool("static", static)
    check_positive_int("every", every)
    if not isinstance(snaps, list) or not snaps:
        fail("snaps", snaps, "a non-empty list from record_steps")
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for snap in snaps[::every]:
            print(step_picture(snap) + "\n")
        return None
    out = widgets.Output()
    slider = widgets.IntSlider(value=1, min=1, max=len(snaps), description="step")
    button = widgets.Button(description="next step")

    def show(change=None):
        out.clear_output(wait=True)
        with out:
            print(step_picture(snaps[slider.value - 1]))

    def forward(_):
        slider.value = min(slider.value + 1, slider.max)
    slider.observe(show, names="value")
    button.on_click(forward)
    show()
    return widgets.VBox([widgets.HBox([slider, button]), out])


# --- 4. correct under batching ---------------------------------------------------------------------------


class RecordingRunner(ModelRunner):
    """A ModelRunner that keeps the logits of every step it runs (Engine(runner=RecordingRunner(...)));
    engine_logits maps them back to requests."""

    def __init__(self, model, num_blocks: int, block_size: int = 16):
        super().__init__(model, num_blocks, block_size)
        self.logits: list[torch.Tensor] = []

    def execute(self, step):
        out = super().execute(step)
        self.logits.append(out)
        return out


def engine_logits(engine: Engine) -> dict[str, torch.Tensor]:
    """{request id: logits [output tokens, vocab]}: the logits each output token was sampled from, in order,
    from an engine whose runner is a RecordingRunner. Every scheduled request must sample in every step (the
    "continuous" or "static" policy: no prefill chunk without a token)."""
    check_type("engine.runner", engine.runner, RecordingRunner, "a RecordingRunner (Engine(runner=...))")
    if len(engine.history) != len(engine.runner.logits):
        fail("engine.history", f"{len(engine.history)} steps for {len(engine.runner.logits)} forwards",
             "one entry per step the runner ran (an engine without history_limit, never warmed up)")
    rows: dict[str, list[torch.Tensor]] = {}
    for h, logits in zip(engine.history, engine.runner.logits):
        if len(h["batch"]) != logits.shape[0]:
            fail("engine", f"step {h['batch']} with {logits.shape[0]} sampled rows",
                 'a run where every scheduled request samples (policy "continuous" or "static")')
        for (rid, _), row in zip(h["batch"], logits):
            rows.setdefault(rid, []).append(row)
    return {rid: torch.stack(v) for rid, v in rows.items()}
