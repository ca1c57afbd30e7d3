"""Notebook 08's pictures, tables and drivers: the buffer arena of the decode graph (offset against time, with and
without reuse), torch.compile's report as table rows, the router's registry events as a table, the routing
policies side by side, the failover run's requests on a time line, a process's CPU seconds and the router's
cost per request and per chunk fitted from them, and the rendezvous assignment of prompt prefixes to replicas
(a widget with a static fallback: what moves when one replica leaves). Each plot has a function returning the
plain data it draws, for the notebook's asserts.

    arena   offset ^  [#mm####]      [#mm_1###]        one rectangle per activation buffer,
                   |  [pow][mean][mul###]              from the op that makes it to the last op that reads it
                   +-----------------------------> op index
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request

from .._checks import check_bool, check_positive, check_positive_int, check_type, fail
from ..course import display, evidence
from .policies import rendezvous

# --- 1. the buffer arena --------------------------------------------------------------------------------------


def _aligned(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def no_reuse_offsets(buffers, alignment: int = 64) -> dict[str, int]:
    """Each buffer at its own offset, one after the other in order of first use, every one aligned to
    `alignment` bytes: the layout of an allocator that never frees (what plan_buffers' no_reuse_bytes counts)."""
    check_positive_int("alignment", alignment, unit="bytes")
    offsets, at = {}, 0
    for b in sorted(buffers, key=lambda b: (b.first, b.name)):
        offsets[b.name] = at
        at += _aligned(b.nbytes, alignment)
    return offsets


def arena_blocks(buffers, offsets: dict[str, int]) -> list[dict]:
    """One block per buffer: {"name", "offset", "nbytes", "first", "last"} (bytes; op indices), in order of
    first use; what plot_arena draws."""
    missing = [b.name for b in buffers if b.name not in offsets]
    if missing:
        fail("offsets", sorted(offsets)[:5], f"an offset for every buffer (missing {missing[:5]})")
    return [{"name": b.name, "offset": offsets[b.name], "nbytes": b.nbytes, "first": b.first, "last": b.last}
            for b in sorted(buffers, key=lambda b: (b.first, b.name))]


def plot_arena(buffers, plan):
    """Two panels sharing the time axis: every activation buffer as a rectangle from the op that makes it to
    the last op that reads it, at its offset (KB): left without reuse (no_reuse_offsets at the plan's
    alignment), right at the plan's offsets (labkit.cluster.buffers.plan_buffers), on its own offset scale; a
    dashed line at the planned arena's size in both. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    layouts = {f"no reuse: {plan.no_reuse_bytes / 1e3:.1f} KB": no_reuse_offsets(buffers, plan.alignment),
               f"planned reuse: {plan.arena_bytes / 1e3:.1f} KB": plan.offsets}
    end = max(b.last for b in buffers) + 1
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for ax, (title, offsets) in zip(axes, layouts.items()):
        for i, blk in enumerate(arena_blocks(buffers, offsets)):
            ax.add_patch(Rectangle((blk["first"], blk["offset"] / 1e3), blk["last"] - blk["first"] + 1,
                                   blk["nbytes"] / 1e3, facecolor=f"C{i % 10}", edgecolor="white", linewidth=0.3))
        ax.set_xlim(0, end)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("op index (time)")
        ax.grid(False)
    axes[0].set_ylim(0, max(plan.no_reuse_bytes, 1) / 1e3 * 1.02)
    axes[1].set_ylim(0, max(plan.arena_bytes, 1) / 1e3 * 1.08)  # its own scale: the left one would flatten it
    axes[0].set_ylabel("offset in the arena (KB)")
    for ax in axes:
        ax.axhline(plan.arena_bytes / 1e3, color="k", lw=0.8, ls="--")
        ax.text(end, plan.arena_bytes / 1e3, "planned arena ", fontsize=7, va="bottom", ha="right")
    fig.tight_layout()
    return fig


# --- 1b. torch.compile against eager ---------------------------------------------------------------------------


def compile_rows(report) -> list[dict]:
    """A labkit.cluster.compiled.CompileReport as two table rows, eager and torch.compile: tokens/s, the repeats'
    spread, compile s, kernels, graphs (breaks) and the largest logit difference; "-" where there is no figure
    (no C++ compiler: every compiled field is None)."""
    def shown(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    ran = report.compiled_tokens_per_s is not None
    return [{"": "eager", "tokens/s": shown(report.eager_tokens_per_s, ".0f"), "spread": f"{report.eager_spread:.0%}",
             "compile s": "-", "kernels": "-", "graphs": "-", "max |logit diff|": "-"},
            {"": "torch.compile", "tokens/s": shown(report.compiled_tokens_per_s, ".0f"),
             "spread": shown(report.compiled_spread, ".0%"), "compile s": shown(report.compile_s, ".1f"),
             "kernels": shown(report.kernels, "d"),
             "graphs": f"{report.graphs} ({report.graph_breaks} breaks)" if ran else "-",
             "max |logit diff|": shown(report.max_abs_diff, ".1e")}]


# --- 2. registration ------------------------------------------------------------------------------------------


def post(url: str, body: dict, timeout: float = 10.0) -> tuple[int, dict]:
    """POST `body` as JSON to `url` (stdlib urllib): (HTTP status, the JSON answer), error statuses included (the
    notebook sends the registration protocol's bad requests with it)."""
    check_type("url", url, str, "an http:// URL")
    data = json.dumps(check_type("body", body, dict, "a JSON object (dict)")).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=check_positive("timeout", timeout, unit="s")) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def event_rows(events: list[dict], t0: float) -> list[dict]:
    """The router's registry events (GET /replicas' "events": time, kind, id, detail) as table rows in time
    order, times in seconds since `t0` (time.monotonic() in this process: the router's registry clock is the
    same CLOCK_MONOTONIC on one machine), details at most 60 characters, cut after a whole word (" ...")."""
    check_type("events", events, list, "a list of event dicts (GET /replicas' events)")
    check_type("t0", t0, (int, float), "seconds on time.monotonic()")
    return [{"t s": e["time"] - t0, "event": e["kind"], "replica": e["id"],
             "detail": display.clip(e["detail"], 60)}
            for e in sorted(events, key=lambda e: e["time"])]


# --- 3. routing -----------------------------------------------------------------------------------------------

POLICY_COLUMNS = ("tokens/s", "p50 ms", "p99 ms", "hit rate %")


def plot_policies(rows: list[dict]):
    """Three panels, one bar per policy: throughput (tokens/s), p50 and p99 latency (ms), prefix-cache hit rate
    (%); `rows` as the notebook's table has them ({"policy", *POLICY_COLUMNS}). Returns the figure."""
    import matplotlib.pyplot as plt

    check_type("rows", rows, list, "a list of dicts")
    if not rows or any(set(POLICY_COLUMNS) - set(r) or "policy" not in r for r in rows):
        fail("rows", rows, f"a non-empty list of dicts with 'policy' and {list(POLICY_COLUMNS)}")
    names = [r["policy"] for r in rows]
    colours = [f"C{i}" for i in range(len(rows))]
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.8))
    axes[0].bar(names, [r["tokens/s"] for r in rows], color=colours)
    axes[0].set_ylabel("tokens/s")
    x = range(len(rows))
    axes[1].bar([i - 0.2 for i in x], [r["p50 ms"] for r in rows], 0.4, color=colours, label="p50")
    axes[1].bar([i + 0.2 for i in x], [r["p99 ms"] for r in rows], 0.4, color=colours, alpha=0.5, hatch="//",
                label="p99")
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("latency (ms)")
    axes[1].legend(fontsize=7)
    axes[2].bar(names, [r["hit rate %"] for r in rows], color=colours)
    axes[2].set_ylabel("prefix-cache hit rate (%)")
    axes[2].set_ylim(0, 100)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7, rotation=15)
    fig.tight_layout()
    return fig


def policy_verdict(rows: list[dict]) -> str:
    """What one run per policy supports: the prefix-cache hit rates (counts of cached prompt tokens, set by
    where the requests went far more than by how fast the machine was) compared outright; throughput and p99
    latency never ranked: one run each cannot separate by the course's rule (labkit.course.evidence needs at
    least 4 runs per policy that do not overlap; benchmarks/cluster_router.py repeats them), so those lines give
    the figures and say "unreliable on this run". `rows` as plot_policies takes them."""
    check_type("rows", rows, list, "a list of dicts")
    by = {r["policy"]: r for r in rows}
    if "round_robin" not in by or len(by) < 2:
        fail("rows", rows, "rows for round_robin and at least one other policy")
    best_hit = max(rows, key=lambda r: r["hit rate %"])
    rr = by["round_robin"]
    lines = [f"prefix-cache hit rate: {best_hit['policy']} {best_hit['hit rate %']:.0f}% against round_robin "
             f"{rr['hit rate %']:.0f}% ({best_hit['hit rate %'] - rr['hit rate %']:+.0f} points)"]
    for column, unit in (("tokens/s", "tokens/s"), ("p99 ms", "ms p99")):
        figures = ", ".join(f"{r['policy']} {r[column]:,.0f}" for r in rows)
        lines.append(f"{unit}: {figures}: no ranking, {evidence.UNRELIABLE} (one run per policy; a direction needs "
                     f"{evidence.MIN_REPEATS} runs each that do not overlap)")
    return "\n".join(lines)


# --- 4. failover ----------------------------------------------------------------------------------------------


def plot_failover(spans: list[dict], marks: dict[str, float]):
    """Every request of a load run as a horizontal line from when it was sent to when it ended (s), coloured by
    outcome ("answered" green, "failed" red), and each of `marks` ({"SIGKILL": s, "down": s, "removed": s},
    times on the same axis) as a labelled vertical line. `spans`: {"start", "end", "status"} per request.
    Returns the figure."""
    import matplotlib.pyplot as plt

    check_type("spans", spans, list, "a list of dicts with start, end and status")
    check_type("marks", marks, dict, "a dict of label -> time (s)")
    colour = {"answered": "C2", "failed": "C3"}
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for i, s in enumerate(sorted(spans, key=lambda s: s["start"])):
        ax.plot([s["start"], s["end"]], [i, i], color=colour.get(s["status"], "0.5"), lw=1.5)
    for j, (label, t) in enumerate(marks.items()):
        ax.axvline(t, color=f"C{j + 4}", lw=1, ls="--")
        ax.text(t, len(spans) * (1 - 0.1 * j), f" {label}", fontsize=8, va="top", color=f"C{j + 4}")
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("request (by send time)")
    ax.plot([], [], color="C2", label="answered")
    ax.plot([], [], color="C3", label="failed")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# --- 5. the router's own cost ---------------------------------------------------------------------------------


def router_cost(runs: list[tuple[int, int, float]]) -> tuple[float, float]:
    """(CPU s per request, CPU s per streamed chunk) fitted to load runs of (requests, chunks relayed, router CPU
    seconds) by least squares through the origin, cpu = a requests + b chunks. A coefficient that comes out
    negative (noise: /proc counts CPU in 10 ms ticks) is set to 0 and the other one fitted alone."""
    import numpy as np

    check_type("runs", runs, list, "a list of (requests, chunks, cpu seconds)")
    if len(runs) < 2 or any(not isinstance(r, tuple) or len(r) != 3 for r in runs):
        fail("runs", runs, "at least two (requests, chunks, cpu seconds) tuples")
    x = np.array([[r[0], r[1]] for r in runs], dtype=float)  # [runs, 2]
    y = np.array([r[2] for r in runs], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a < 0 or b < 0:
        keep = 1 if a < 0 else 0
        alone = float(x[:, keep] @ y / (x[:, keep] @ x[:, keep]))
        a, b = (0.0, alone) if keep else (alone, 0.0)
    return max(float(a), 0.0), max(float(b), 0.0)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used so far, from /proc/PID/stat (Linux); None where that
    cannot be read (another OS, or the process is gone): the notebook then uses scale.py's documented figure."""
    check_positive_int("pid", pid)
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


# --- 6. rendezvous vs modulo: what moves when a replica leaves ------------------------------------------------


def modulo_owner(key: str, ids: list[str]) -> str:
    """The naive alternative to rendezvous: ids[hash(key) % len(ids)], hash = first 8 bytes of blake2b(key)."""
    check_type("key", key, str, "a string")
    if not isinstance(ids, (list, tuple)) or not ids:
        fail("ids", ids, "a non-empty list of replica ids")
    return ids[int.from_bytes(hashlib.blake2b(key.encode()).digest()[:8], "big") % len(ids)]


def _yes(moved: bool) -> str:
    return "yes" if moved else "-"


def assignment_rows(keys: list[str], ids: list[str], leaving: str) -> list[dict]:
    """For every key: its owner among `ids` and its owner after `leaving` left ("after"), by rendezvous and by
    modulo hashing, and whether it moved."""
    check_type("keys", keys, list, "a list of prompt prefixes")
    if leaving not in ids or len(ids) < 2:
        fail("leaving", leaving, f"one of {ids} (at least two replicas)")
    after = [i for i in ids if i != leaving]
    rows = []
    for k in keys:
        before, now = rendezvous(k, list(ids)), rendezvous(k, after)
        m_before, m_now = modulo_owner(k, list(ids)), modulo_owner(k, after)
        rows.append({"prefix": repr(k[:18]), "rendezvous": before, "after": now, "moved": _yes(now != before),
                     "modulo": m_before, "modulo after": m_now, "modulo moved": _yes(m_now != m_before)})
    return rows


def assignment_picture(keys: list[str], n_replicas: int, leaving: int) -> str:
    """The table of assignment_rows for replica-1..replica-n with replica-`leaving` leaving (clamped to n), and
    how many keys each scheme moved."""
    n = check_positive_int("n_replicas", n_replicas)
    if n < 2:
        fail("n_replicas", n_replicas, "at least 2 (one of them leaves)")
    ids = [f"replica-{i}" for i in range(1, n + 1)]
    gone = ids[min(check_positive_int("leaving", leaving), n) - 1]
    rows = assignment_rows(keys, ids, gone)
    owned = sum(r["rendezvous"] == gone for r in rows)
    moved = sum(r["moved"] == "yes" for r in rows)
    moved_mod = sum(r["modulo moved"] == "yes" for r in rows)
    return (f"{n} replicas, {gone} leaves: rendezvous moves {moved} of {len(rows)} prefixes (the {owned} {gone} "
            f"owned), modulo hashing moves {moved_mod}\n" + display.table(rows))


def rendezvous_explorer(keys: list[str], max_replicas: int = 6, static: bool = False):
    """Sliders: the number of replicas (2..max_replicas) and which one leaves, showing assignment_picture.
    static=True (or without ipywidgets) prints it for 3 replicas, each one leaving in turn, instead. Returns the
    ipywidgets.interactive, or None when static."""
    check_bool("static", static)
    top = check_positive_int("max_replicas", max_replicas)
    if top < 3:
        fail("max_replicas", max_replicas, "at least 3")
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for leaving in (1, 2, 3):
            print(assignment_picture(keys, 3, leaving) + "\n")
        return None
    return widgets.interactive(lambda replicas, leaves: print(assignment_picture(keys, replicas, leaves)),
                               replicas=widgets.IntSlider(value=3, min=2, max=top, description="replicas"),
                               leaves=widgets.IntSlider(value=2, min=1, max=top, description="replica leaving"))
