"""Notebook 04's pictures and its plan explorer widget (with a static fallback).

    ring_steps(n)                 the ring all-reduce as text: which chunk each rank sends at each step
    plot_link(measured, fits)     measured collective times against the fitted alpha-beta lines (log-log)
    plot_timeline(events, ...)    a Gantt chart of per-rank (kind, micro-batch, start, end) events
    plan_rows(plans, batch, n)    the first n plans as rows for labkit.course.display.table
    plot_plan(plan)               one plan's time and memory breakdown
    plan_explorer(static=False)   dropdowns for model, device, nodes, batch and context -> ranked plans
"""

from __future__ import annotations

from .._checks import check_bool, check_positive_int, check_type
from ..course import display
from ..specs import device_names
from .collectives import ring_schedule
from .planner import Hardware, Plan, Workload, plan

COLORS = {"F": "tab:blue", "B": "tab:orange", "compute": "tab:blue", "comm": "tab:red"}
MODELS = ("moe-3t", "dense-320b", "llama-3.1-405b", "deepseek-v3", "kimi-k2", "llama-3-70b", "mixtral-8x7b")


def ring_steps(n: int) -> str:
    """One line per step of a ring all-reduce over n ranks: "rank r -> r+1: chunk c" for every rank."""
    check_positive_int("n", n)
    lines = []
    for t in ring_schedule(n, n):
        if t.src == 0:
            lines.append(f"{t.phase:<14} step {t.step}:")
        lines[-1] += f"  {t.src}->{t.dst} c{t.chunk}"
    return "\n".join(lines)


def plot_link(measured: dict, fits: dict, ax=None):
    """measured: {op: (sizes in bytes, seconds)}; fits: {op: LinkModel fitted on it, for n ranks} with
    `n` given as fits["n"]. One line of points and its fitted curve per op."""
    import matplotlib.pyplot as plt
    import numpy as np

    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    for i, (op, (sizes, seconds)) in enumerate(measured.items()):
        color = f"C{i}"
        ax.loglog(sizes, seconds, "o", color=color, label=f"{op} measured")
        xs = np.geomspace(min(sizes), max(sizes), 50)
        ax.loglog(xs, [fits[op].collective(op, x, fits["n"]) for x in xs], "-", color=color, alpha=0.7,
                  label=f"{op} fit: alpha {fits[op].alpha * 1e6:.0f} us, beta {fits[op].beta / 1e9:.2f} GB/s")
    ax.set_xlabel("message size S (bytes)")
    ax.set_ylabel("seconds")
    ax.set_title(f"gloo on this machine, {fits['n']} ranks")
    ax.legend(fontsize=7)
    return ax


def plot_timeline(events: list, title: str = "", ax=None, labels: list[str] | None = None):
    """A Gantt chart: one row per rank (or per entry of `events`), one bar per (kind, micro-batch, start,
    end) event (seconds), labelled with the micro-batch."""
    import matplotlib.pyplot as plt

    check_type("events", events, list)
    ax = ax or plt.subplots(figsize=(8, 0.6 + 0.5 * len(events)))[1]
    for row, stage in enumerate(events):
        for kind, i, start, end in stage:
            ax.barh(row, (end - start) * 1e3, left=start * 1e3, color=COLORS.get(kind, "gray"), edgecolor="white")
            ax.text((start + end) / 2 * 1e3, row, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(events)), labels or [f"rank {r}" for r in range(len(events))])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    kinds = sorted({e[0] for stage in events for e in stage})
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLORS.get(k, "gray")) for k in kinds], labels=kinds,
              fontsize=7, loc="lower right")
    ax.set_title(title)
    return ax


def plan_rows(plans: list[Plan], batch: int, n: int = 5) -> list[dict]:
    """The first n plans as table rows: layout, devices, per-device GB, ms per token, tokens/s, why not."""
    rows = []
    for p in plans[:check_positive_int("n", n)]:
        rows.append({"plan": f"TP{p.tp} PP{p.pp} EP{p.ep} DP{p.dp}", "devices": p.devices,
                     "GB/device": f"{sum(p.memory.values()) / 1e9:.1f}" if p.memory else "-",
                     "ms/token": f"{p.latency * 1e3:.1f}" if p.fits else "-",
                     "tokens/s": f"{p.throughput(batch):,.0f}" if p.fits else "-",
                     "bound": p.bound or "-", "rejected because": p.reason or "-"})
    return rows


def plot_plan(p: Plan, ax=None):
    """Stacked bars of one plan's decode step (ms) and its memory per device (GB)."""
    import matplotlib.pyplot as plt

    axes = ax or plt.subplots(1, 2, figsize=(8, 2.6))[1]
    for a, parts, scale, unit in ((axes[0], p.time, 1e3, "ms per token"), (axes[1], p.memory, 1e-9, "GB per device")):
        left = 0.0
        for i, (name, v) in enumerate(parts.items()):
            a.barh(0, v * scale, left=left, color=f"C{i}", label=name)
            left += v * scale
        a.set_yticks([])
        a.set_xlabel(unit)
        a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
    axes[0].set_title(str(p), fontsize=9)
    return axes


def _show(name: str, dev: str, nodes: int, batch: int, context: int, n: int = 6) -> list[Plan]:
    import matplotlib.pyplot as plt

    cluster = Hardware(nodes, device=dev)
    plans = plan(name, cluster, Workload(batch=batch, context=context))
    print(f"{name} on {nodes} x {cluster.per_node} {dev} ({cluster.devices} devices), {batch} sequences of "
          f"{context} tokens per replica: {sum(p.fits for p in plans)} of {len(plans)} layouts fit")
    print(display.table(plan_rows(plans, batch, n)))
    if plans and plans[0].fits:
        plot_plan(plans[0])
        plt.show()
    return plans


def plan_explorer(static: bool = False, model: str = "moe-3t", dev: str = "h100-sxm", nodes: int = 16,
                  batch: int = 64, context: int = 8192):
    """An ipywidgets explorer of the planner; with static=True, or without ipywidgets, prints the ranked
    table and draws the best plan for the given settings instead (returns the plans then)."""
    check_bool("static", static)
    try:
        import ipywidgets as widgets
    except ImportError:
        static = True
    if static:
        return _show(model, dev, nodes, batch, context)
    wide = {"description_width": "initial"}
    gpus = [d for d in device_names("gpu")]
    return widgets.interactive(
        lambda model, device, nodes, batch, context: _show(model, device, nodes, batch, context) and None,
        model=widgets.Dropdown(options=list(MODELS), value=model, style=wide),
        device=widgets.Dropdown(options=gpus, value=dev, style=wide),
        nodes=widgets.IntSlider(value=nodes, min=1, max=64, style=wide),
        batch=widgets.Dropdown(options=[1, 8, 32, 64, 128, 256], value=batch, style=wide),
        context=widgets.Dropdown(options=[2048, 8192, 32768, 131072], value=context, style=wide))
