"""Notebook 01's plots and its measurement table: the cells compute the numbers (and print and check them);
these functions draw or lay them out.

    measurement_table(mem)                                           hardware.measure_memory's figures
    plot_footprint(labels, parts, capacity, capacity_label, title)   stacked bars of GB per setting
    plot_ceilings(curves, title)                                     tokens/s against batch, log-log
    plot_link_share(offloaded, shares, title)                        % of a step's time spent on the link
    region_table(region)                                             transfer.region's rows as text
    plot_share_region(rows, title)                                   where the 30-50% claim holds (transfer.sweep)

Each returns the matplotlib Axes; the cell ends with plt.show(). The roofline itself is
roofline.plot_roofline (notebooks 01 and 03 draw it), the calculator's sliders calculator.calculator.
Units: GB = 1e9 bytes, tokens/s, layers, fractions of a step's time.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .._checks import check_positive, check_positive_int, check_type, fail
from .transfer import check_band, setting
from ..course import Timing, table

# hardware.measure_memory's kernels, in the order the table lists them, and how each is described
KERNELS = {"read_threads": "torch sum, {threads} threads (the roof)", "read": "np.sum, one core",
           "copy": "np.copyto, one core (read + write)", "gemv": "matrix-vector FP32, {n} x {mib:.0f} MiB"}


def _series(name: str, values) -> np.ndarray:
    """A non-empty 1-D array of finite numbers >= 0 (TypeError for non-numbers, ValueError otherwise)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        fail(name, values, "a list or array of numbers", TypeError)
    arr = np.asarray(values)
    if arr.dtype.kind not in "iuf":
        fail(name, values, "a list or array of numbers", TypeError)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        fail(name, values, "a non-empty 1-D list of finite numbers >= 0")
    return arr.astype(np.float64)


def _named_series(name: str, series) -> dict[str, np.ndarray]:
    check_type(name, series, Mapping, "a dict of label -> numbers")
    if not series:
        fail(name, series, "a non-empty dict of label -> numbers")
    return {str(k): _series(f"{name}[{k!r}]", v) for k, v in series.items()}


def measurement_table(mem: Mapping) -> str:
    """Section 2: one row per kernel of hardware.measure_memory's result `mem`: GB/s from the median round
    and from the best, and the spread ((slowest - fastest) / median), then the steadiest kernel of the run."""
    check_type("mem", mem, Mapping, "the dict hardware.measure_memory returns")
    need = {"timings", "array_bytes", "threads", "gemv"}
    if not need <= set(mem) or not set(KERNELS) <= set(mem["timings"]):
        fail("mem", mem, f"the dict hardware.measure_memory returns (keys {sorted(need)}, timings of {list(KERNELS)})")
    gemv = mem["gemv"]
    moved = {"read_threads": mem["array_bytes"], "read": mem["array_bytes"], "copy": 2 * mem["array_bytes"],
             "gemv": gemv["n_matrices"] * gemv["weight_bytes"]}
    rows = []
    for name, label in KERNELS.items():
        t = check_type(f"mem['timings'][{name!r}]", mem["timings"][name], Timing, "a labkit.course.Timing")
        rows.append({"kernel": label.format(threads=mem["threads"], n=gemv["n_matrices"],
                                            mib=gemv["weight_bytes"] / 2**20),
                     "GB/s (median)": f"{moved[name] / t.median / 1e9:.1f}",
                     "GB/s (best)": f"{moved[name] / t.best / 1e9:.1f}", "spread": f"{t.spread:.0%}"})
    steadiest = min(KERNELS, key=lambda k: mem["timings"][k].spread)
    rounds = len(mem["timings"]["read"].times)
    return (table(rows) + f"\n{rounds} rounds: numpy's two kernels in turns, then torch's sum and the product in "
            f"turns; the steadiest this run: {rows[list(KERNELS).index(steadiest)]['kernel']}")


def _axes(ax, figsize: tuple[float, float]):
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)[1] if ax is None else ax


def plot_footprint(labels: Sequence[str], parts: Mapping[str, Sequence[float]], capacity: float,
                   capacity_label: str, title: str, ax=None):
    """Section 1: one stacked bar per setting (`labels`), one layer per part ("weights", "kv_cache", ...: GB
    per setting, in the order given), and a dashed line at the `capacity` (GB) of one device."""
    check_type("labels", labels, (list, tuple), "a list of str")
    check_type("capacity_label", capacity_label, str)
    check_type("title", title, str)
    heights = _named_series("parts", parts)
    if any(len(h) != len(labels) for h in heights.values()):
        fail("parts", parts, f"one value per label ({len(labels)}) in every part")
    capacity = check_positive("capacity", capacity, unit="GB")
    ax = _axes(ax, (8, 3.5))
    bottom = np.zeros(len(labels))
    for name, h in heights.items():
        ax.bar([str(x) for x in labels], h, bottom=bottom, label=name)
        bottom += h
    ax.axhline(capacity, color="k", ls="--", lw=1, label=capacity_label)
    ax.set_ylabel("GB"), ax.set_xlabel("batch x context"), ax.set_title(title), ax.legend()
    return ax


def plot_ceilings(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]], title: str, context: int,
                  ax=None):
    """Section 4: for each label, (batches, tokens/s of the whole batch), drawn log-log; every sequence
    holds `context` tokens."""
    context = check_positive_int("context", context, unit="tokens")
    check_type("title", title, str)
    check_type("curves", curves, Mapping, "a dict of label -> (batches, tokens/s)")
    if not curves:
        fail("curves", curves, "a non-empty dict of label -> (batches, tokens/s)")
    data = {}
    for label, pair in curves.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            fail(f"curves[{label!r}]", pair, "a (batches, tokens/s) pair", TypeError)
        x, y = _series(f"curves[{label!r}] batches", pair[0]), _series(f"curves[{label!r}] tokens/s", pair[1])
        if len(x) != len(y) or np.any(x <= 0) or np.any(y <= 0):
            fail(f"curves[{label!r}]", pair, "batches and tokens/s of equal length, all > 0")
        data[label] = (x, y)
    ax = _axes(ax, (8, 4))
    for label, (x, y) in data.items():
        ax.loglog(x, y, "o-", label=label)
    ax.set_xlabel(f"batch (sequences of {context:,} tokens)"), ax.set_ylabel("tokens/s ceiling (all sequences)")
    ax.set_title(title), ax.legend(), ax.grid(True, which="both", alpha=0.3)
    return ax


def plot_link_share(offloaded: Sequence[int], shares: Mapping[str, Sequence[float]], title: str, n_layers: int,
                    band: tuple[float, float] = (0.3, 0.5), ax=None):
    """Section 5: the share of a step's time spent on the link (fractions, drawn in %) against the number
    of layers offloaded (of the model's `n_layers`), one line per workload, with the claim's `band` shaded."""
    n_layers = check_positive_int("n_layers", n_layers, unit="layers")
    check_type("title", title, str)
    x = _series("offloaded", offloaded)
    lines = _named_series("shares", shares)
    if any(len(s) != len(x) or np.any(s > 1) for s in lines.values()):
        fail("shares", shares, f"fractions in [0, 1], one per offloaded count ({len(x)}) in every line")
    low, high = check_band(band)
    ax = _axes(ax, (8, 3.5))
    for label, s in lines.items():
        ax.plot(x, s * 100, "o-", ms=3, label=label)
    ax.axhspan(low * 100, high * 100, color="orange", alpha=0.2, label=f"the claim: {low * 100:.0f}-{high * 100:.0f}%")
    ax.set_xlabel(f"layers offloaded (of {n_layers})"), ax.set_ylabel("% of step time on the link")
    ax.set_title(title), ax.legend()
    return ax


def region_table(region: Sequence[Mapping]) -> str:
    """Section 5: transfer.region's rows as a table: the setting, the workload, the fewest layers that must be
    offloaded (and the link's share then), the layers offloaded that put 30-50% on the link, and those of
    them that fit on the GPU ("-" for none)."""
    need = {"gpu", "link", "workload", "fewest", "share_then", "in_band", "in_band_possible"}
    if isinstance(region, (str, bytes)) or not isinstance(region, Sequence) or not region or not all(
            isinstance(r, Mapping) and need <= set(r) for r in region):
        fail("region", region, "a non-empty list of rows from transfer.region()", TypeError)
    return table([{"setting": setting(r["gpu"], r["link"]), "workload": r["workload"],
                   "must offload": "nothing fits" if r["fewest"] is None else str(r["fewest"]),
                   "share then": "-" if r["share_then"] is None else f"{r['share_then']:.0%}",
                   "30-50% with": r["in_band"], "of them possible": r["in_band_possible"]} for r in region])


# plot_share_region's four kinds of cell: (colour, legend)
REGION_COLOURS = (("white", "outside the band, fits"), ("tab:orange", "in the band, fits: the claim holds"),
                  ("navajowhite", "in the band, does not fit on the GPU"), ("lightgrey", "outside, does not fit"))


def plot_share_region(rows: Sequence[Mapping], title: str, band: tuple[float, float] = (0.3, 0.5), ax=None):
    """Section 5: transfer.sweep's rows as a map, one line per (gpu + link, workload), one column per number
    of layers offloaded; orange where the link's share lies in `band` and what stays fits on the GPU.
    Returns the Axes; its image holds the category of every cell (0-3, REGION_COLOURS' order)."""
    from matplotlib.colors import ListedColormap

    check_type("title", title, str)
    keys = {"gpu", "link", "workload", "offloaded", "share", "fits"}
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows or not all(
            isinstance(r, Mapping) and keys <= set(r) for r in rows):
        fail("rows", rows, "a non-empty list of rows from transfer.sweep()", TypeError)
    low, high = check_band(band)
    lines = list(dict.fromkeys((r["gpu"], r["link"], r["workload"]) for r in rows))
    width = 1 + max(r["offloaded"] for r in rows)
    grid = np.zeros((len(lines), width))
    for r in rows:
        inside = low <= r["share"] <= high
        grid[lines.index((r["gpu"], r["link"], r["workload"])), r["offloaded"]] = \
            (1 if inside else 0) if r["fits"] else (2 if inside else 3)
    ax = _axes(ax, (9, 0.22 * len(lines) + 1.5))
    ax.imshow(grid, cmap=ListedColormap([c for c, _ in REGION_COLOURS]), vmin=-0.5, vmax=3.5, aspect="auto",
              interpolation="nearest")
    ax.set_yticks(range(len(lines)), [f"{setting(g, ln)}, {w}" for g, ln, w in lines], fontsize=7)
    ax.set_xlabel("layers offloaded"), ax.set_title(title)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor=c, edgecolor="k", label=label) for c, label in REGION_COLOURS], fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.6 / (0.22 * len(lines) + 1.5)), ncol=2)
    return ax
