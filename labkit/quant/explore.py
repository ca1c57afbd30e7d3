"""Notebook 03's plots, its quantization explorer widget (with a static fallback) and its table helper.

    explorer(w)               sliders for bits, scheme and group size -> histogram of one group of w with
                              its quantization grid, and the round-trip error of the whole matrix
    explorer(w, static=True)  the same figure for fixed settings, plus the error table of every setting
    pooled_sqnr_db(ws, ...)   one SQNR for several matrices quantized alike (section 2, by layer type)
"""

from __future__ import annotations

import math

import torch

from .._checks import check_bool, check_int, fail
from .qtensor import BITS, check_bits, check_group_size, check_weight, quant_error, quantize

GROUPS = (32, 64, 128, "channel", "tensor")


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
    bits_list, groups = [check_bits(b) for b in bits_list], [check_group_size(g) for g in groups]
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

    return widgets.interactive(show, bits=widgets.Dropdown(options=list(BITS), value=4),
                               scheme=widgets.ToggleButtons(options=["sym", "asym"], value="asym"),
                               group_size=widgets.Dropdown(options=groups, value=groups[0]))
