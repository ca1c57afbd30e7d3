"""Notebook 03's plots, its quantization explorer widget (with a static fallback) and its table helper.

    explorer(w)               sliders for bits, scheme and group size -> histogram of one group of w with
                              its quantization grid, and the round-trip error of the whole matrix
    explorer(w, static=True)  the same figure for fixed settings, plus the error table of every setting
    pooled_sqnr_db(ws, ...)   one SQNR for several matrices quantized alike (section 2, by layer type)
    plot_quality(results)     perplexity against bits per weight for a quality.sweep (section 6)
    plot_matmuls(run, ...)    the INT4 matmul run of labkit.quant.speed on this machine's rooflines (section 8)
    roofline_notes(run, ...)  where that plot's all-thread figures fall below their 1-thread twins (a busy core)
    label_points(ax, points)  labels that do not overlap each other or the points (both plots use it)
"""

from __future__ import annotations

import math

import torch

from .._checks import check_bool, check_int, check_positive, check_type, fail
from ..memory_wall import roofline
from .qtensor import BITS, check_bits, check_group_size, check_weight, quant_error, quantize
from .speed import CASES, FP32, FP32_1, INT4, INT4_1, ROOF, ROOF_1, MatmulRun
from .verdicts import CONTENTION

GROUPS = (32, 64, 128, "channel", "tensor")


def _check_ax(ax, name: str = "ax"):
    """None (a new figure) or a matplotlib Axes."""
    if ax is not None:
        from matplotlib.axes import Axes

        check_type(name, ax, Axes, "a matplotlib Axes or None")
    return ax


def pooled_sqnr_db(ws: list[torch.Tensor], bits: int, scheme: str, group_size) -> float:
    """SQNR (dB) of several matrices quantized with the same settings, noise and signal summed over all
    of them: 10 log10(sum of w^2 / sum of (w - w_hat)^2); inf when every round trip is exact."""
    if isinstance(ws, torch.Tensor) or not isinstance(ws, (list, tuple)) or not ws:
        fail("ws", type(ws).__name__, "a non-empty list of 2-D weight tensors", TypeError)
    noise = signal = 0.0
    for w in ws:
        check_weight(w, "each of ws")
        noise += quant_error(w, quantize(w, bits, scheme, group_size).dequantize())["mse"] * w.numel()
        signal += float(w.double().pow(2).sum())
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def _check_place(grid: tuple[int, int], row, group) -> None:
    """row and group pick one group of a [rows, groups] grid of scales (a grid of one row: any row)."""
    check_int("row", row, 0)
    check_int("group", group, 0, grid[1] - 1)
    if grid[0] > 1 and row >= grid[0]:
        fail("row", row, f"an int in [0, {grid[0] - 1}]")


def grid_levels(w: torch.Tensor, bits: int, scheme: str, group_size, row: int = 0, group: int = 0) -> torch.Tensor:
    """The 2**bits values that one group (row `row`, group `group`) of w can take after quantization."""
    q = quantize(w, bits, scheme, group_size)
    _check_place(tuple(q.scale.shape), row, group)
    r = 0 if q.scale.shape[0] == 1 else row
    codes = torch.arange(-(2 ** (q.bits - 1)), 2 ** (q.bits - 1), dtype=torch.float32)
    zero = 0 if q.zero is None else float(q.zero[r, group])
    return (codes - zero) * float(q.scale[r, group])


def group_values(w: torch.Tensor, group_size, row: int = 0, group: int = 0) -> torch.Tensor:
    """The weights of one group (as quantize() cuts them)."""
    check_weight(w)
    group_size = check_group_size(group_size)
    if isinstance(group_size, int) and w.shape[1] % group_size:
        fail("group_size", group_size, f"a divisor of w's input dimension {w.shape[1]}")
    groups = 1 if isinstance(group_size, str) else w.shape[1] // group_size
    _check_place((1 if group_size == "tensor" else w.shape[0], groups), row, group)
    if group_size == "tensor":
        return w.reshape(-1)
    if group_size == "channel":
        return w[row]
    return w[row, group * group_size:(group + 1) * group_size]


def plot_group(w: torch.Tensor, bits: int = 4, scheme: str = "asym", group_size=32, ax=None):
    """Histogram of group 0 of row 0 of w, with the quantization grid as vertical lines; returns the Axes."""
    import matplotlib.pyplot as plt

    levels = grid_levels(w, bits, scheme, group_size)  # checks the arguments before a figure is made
    _check_ax(ax)
    values = group_values(w, group_size)
    err = quant_error(w, quantize(w, bits, scheme, group_size).dequantize())
    if ax is None:
        _, ax = plt.subplots()
    ax.hist(values.numpy(), bins=min(60, max(10, len(values) // 4)), color="tab:blue", alpha=0.7)
    ax.grid(False)
    for v in levels.tolist():
        ax.axvline(v, color="tab:red", linewidth=0.6, alpha=0.6)
    ax.set_title(f"INT{bits} {scheme}, group {group_size}: first group ({len(values)} weights, {2 ** bits} levels);"
                 f" whole matrix SQNR {err['sqnr_db']:.1f} dB", fontsize=9)
    ax.set_xlabel("weight value (red: the values a quantized weight can take)")
    return ax


def error_table(w: torch.Tensor, bits_list=BITS, groups=GROUPS) -> list[dict]:
    """SQNR (dB) of w's round trip for every bits x scheme x group size that divides w's input dimension."""
    check_weight(w)
    for name, v in (("bits_list", bits_list), ("groups", groups)):
        if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) or not v:
            fail(name, v, "a non-empty tuple or list", TypeError)
    bits_list, groups = [check_bits(b) for b in bits_list], [check_group_size(g) for g in groups]
    if all(isinstance(g, int) and w.shape[1] % g for g in groups):
        fail("groups", tuple(groups), f"group sizes of which at least one divides w's input dimension {w.shape[1]}")
    rows = []
    for bits in bits_list:
        for scheme in ("sym", "asym"):
            for g in groups:
                if isinstance(g, int) and w.shape[1] % g:
                    continue
                e = quant_error(w, quantize(w, bits, scheme, g).dequantize())
                rows.append({"bits": bits, "scheme": scheme, "group_size": g, "sqnr_db": e["sqnr_db"]})
    return rows


def explorer(w: torch.Tensor, static: bool = False):
    """An ipywidgets explorer of quantizing w; with static=True, or when ipywidgets is missing, draws one
    figure for INT4 asym group 32 and prints the error table of all settings instead. Returns the widget
    (or None when static)."""
    check_weight(w)
    check_bool("static", static)
    try:
        import ipywidgets as widgets
    except ImportError:
        static = True
    if static:
        import matplotlib.pyplot as plt

        plot_group(w)
        plt.show()
        for r in error_table(w):
            print(f"INT{r['bits']} {r['scheme']:<4} group {str(r['group_size']):<8} SQNR {r['sqnr_db']:5.1f} dB")
        return None
    groups = [g for g in GROUPS if not isinstance(g, int) or w.shape[1] % g == 0]

    def show(bits, scheme, group_size):
        import matplotlib.pyplot as plt

        plot_group(w, bits, scheme, group_size)
        plt.show()

    wide = {"description_width": "initial"}  # the whole label: "group_size", not "group_si..."
    return widgets.interactive(show, bits=widgets.Dropdown(options=list(BITS), value=4, style=wide),
                               scheme=widgets.ToggleButtons(options=["sym", "asym"], value="asym", style=wide),
                               group_size=widgets.Dropdown(options=groups, value=groups[0], style=wide))


# offsets (points) tried in turn for a label, right of its point first; then further up and down
_OFFSETS = [(5, 2), (5, -9), (-5, 2), (-5, -9)] + [(8, dy) for k in range(1, 8) for dy in (11 * k + 2, -11 * k - 9)]


def _overlaps(box, boxes) -> bool:
    return any(box.overlaps(b) for b in boxes)


def label_points(ax, points, fontsize: int = 7) -> list:
    """Annotate (label, x, y) points of `ax` so that no label overlaps another label or a point: each label
    takes the first of several offsets that is free (with a leader line when it is not beside its point).
    Returns the annotations, in the order of `points`."""
    if isinstance(points, str) or not all(isinstance(p, (tuple, list)) and len(p) == 3 for p in points):
        fail("points", points, "a list of (label, x, y) triples", TypeError)
    from matplotlib.axes import Axes

    check_type("ax", ax, Axes, "a matplotlib Axes")
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [ax.transData.transform((x, y)) for _, x, y in points]
    taken = [Bbox.from_bounds(px - 3, py - 3, 6, 6) for px, py in taken]
    placed = []
    for label, x, y in points:
        for i, (dx, dy) in enumerate(_OFFSETS):
            ann = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                              ha="left" if dx > 0 else "right",
                              arrowprops=None if i < 4 else {"arrowstyle": "-", "color": "0.6", "lw": 0.5})
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer)  # the text alone, without its leader line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not _overlaps(box, taken):
                break
            if i < len(_OFFSETS) - 1:
                ann.remove()
        taken.append(box)
        placed.append(ann)
    return placed


def plot_quality(results: dict, ax=None):
    """Test perplexity against bits per weight (scales included, log scale) for each setting of a
    quality.sweep, labelled without overlaps. Returns the Axes."""
    import matplotlib.pyplot as plt

    check_type("results", results, dict, "a dict from quality.sweep")
    if not results:
        fail("results", results, "a non-empty dict from quality.sweep")
    for name, r in results.items():
        if not isinstance(r, dict) or not {"bpw", "ppl"} <= set(r):
            fail(f"results[{name!r}]", r, "a dict from quality.sweep (with 'bpw' and 'ppl')", TypeError)
    if _check_ax(ax) is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    bpw, ppl = [r["bpw"] for r in results.values()], [r["ppl"] for r in results.values()]
    ax.scatter(bpw, ppl, s=14, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(bpw) / 1.15, max(bpw) * 2.2)  # room on the right for the labels of FP32 and BF16
    pad = (max(ppl) - min(ppl)) * 0.08
    ax.set_ylim(min(ppl) - pad, max(ppl) + pad)
    ax.set_xlabel("bits per weight (scales included)")
    ax.set_ylabel("test perplexity")
    ax.set_title("TinyLM after quantization: lower left is better", fontsize=9)
    label_points(ax, [(name.split(":")[0], b, p) for name, b, p in zip(results, bpw, ppl)])
    return ax


def plot_matmuls(run: MatmulRun, peak_all: float, peak_one: float, ax=None):
    """The cases of a speed.MatmulRun on two rooflines of this machine: all threads (the roof measured
    with them, FP32 matmul peak `peak_all` FLOP/s) and one thread (`peak_one`). Returns the Axes."""
    check_type("run", run, MatmulRun, "a labkit.quant.speed.MatmulRun")
    peak_all, peak_one = check_positive("peak_all", peak_all, "FLOP/s"), check_positive("peak_one", peak_one, "FLOP/s")
    _check_ax(ax)
    ceilings = [(f"{run.threads} threads: {run.bytes_per_s(ROOF) / 1e9:.0f} GB/s, {peak_all / 1e9:.0f} GFLOP/s",
                 peak_all, run.bytes_per_s(ROOF)),
                (f"1 thread: {run.bytes_per_s(ROOF_1) / 1e9:.0f} GB/s, {peak_one / 1e9:.0f} GFLOP/s",
                 peak_one, run.bytes_per_s(ROOF_1))]
    ax = roofline.plot_roofline(ceilings, [], ax=ax, intensity_range=(0.1, 100.0))
    points = [(c, run.intensity(c), run.flops_per_s(c)) for c in CASES]
    for c, x, y in points:
        ax.loglog([x], [y], "s" if c in (FP32_1, INT4_1) else "o", color="tab:red" if "INT4" in c else "tab:gray")
    label_points(ax, points)
    ax.set_title(f"batch-1 matmuls {run.n}x{run.k} on this machine (squares: 1 thread)", fontsize=9)
    return ax


def roofline_notes(run: MatmulRun, peak_all: float, peak_one: float) -> list[str]:
    """What plot_matmuls(run, peak_all, peak_one) shows about the machine's load, from the same figures. More
    threads never lower a roof on a quiet machine. Each all-thread figure below its 1-thread twin (the memory roof
    in bytes/s, the FP32 matmul peak in FLOP/s, the FP32 and INT4 products' FLOP/s) gets a line; then where the
    two rooflines cross (FLOP/byte) or which lies below; then the cause: more than verdicts.CONTENTION times
    lower is another program on a core, less is a figure that gains nothing from a second thread. One line when
    none is below, or when torch runs on one thread (both rooflines are then one thread's)."""
    check_type("run", run, MatmulRun, "a labkit.quant.speed.MatmulRun")
    peak_all, peak_one = check_positive("peak_all", peak_all, "FLOP/s"), check_positive("peak_one", peak_one, "FLOP/s")
    n = run.threads
    if n == 1:
        return ["torch runs on 1 thread here: both rooflines and both points of each kernel are one thread's"]
    bw_all, bw_one = run.bytes_per_s(ROOF), run.bytes_per_s(ROOF_1)
    pairs = [("memory roof", bw_all / 1e9, bw_one / 1e9, "GB/s"),
             ("FP32 matmul peak", peak_all / 1e9, peak_one / 1e9, "GFLOP/s"),
             ("FP32 product", run.flops_per_s(FP32) / 1e9, run.flops_per_s(FP32_1) / 1e9, "GFLOP/s"),
             ("INT4 product", run.flops_per_s(INT4) / 1e9, run.flops_per_s(INT4_1) / 1e9, "GFLOP/s")]
    lower = [(name, a, b, unit) for name, a, b, unit in pairs if a < b]
    if not lower:
        return [f"every {n}-thread figure is at or above its 1-thread twin: the {n}-thread roofline lies above the "
                f"1-thread one and no point sits below its twin"]
    lines = [f"{name}: {a:.4g} {unit} on {n} threads, below the {b:.4g} of 1 thread" for name, a, b, unit in lower]
    if (bw_all < bw_one) != (peak_all < peak_one):  # one roofline higher under the slope, the other on the flat
        lines.append(f"the two rooflines cross at {min(peak_all, peak_one) / min(bw_all, bw_one):.1f} FLOP/byte")
    else:
        lines.append(f"the {n}-thread roofline lies {'below' if bw_all < bw_one else 'above'} the 1-thread one")
    worst = max(b / a for _, a, b, _ in lower)
    if worst > CONTENTION:
        lines.append(f"{worst:.2f}x lower with {n} threads, beyond the {CONTENTION}x the verdicts allow: another "
                     f"program took a core while the {n}-thread figures were measured; read the 1-thread ones")
    else:
        lines.append(f"at most {worst:.2f}x lower with {n} threads, within the {CONTENTION}x the verdicts allow: "
                     f"what a figure that gains nothing from a second thread does from run to run")
    return lines
