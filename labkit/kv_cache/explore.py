"""Notebook 05's pictures: the pool as text (which sequence holds each block, reference counts, cached and free
blocks), a scripted story of block tables filling, sharing, copying and being evicted, a widget that steps
through it (with a static fallback that prints every step), and the plots of the waste and block-size sweep.

    pool_picture(bm)  ->   block    0    1    2    3    4    5
                           holds   a,b   a    b    ~    .    .       a,b: referenced by a and b
                           refs     2    1    1    0    0    0       ~: cached (evictable), .: free
"""

from __future__ import annotations

from typing import Callable

from .._checks import check_bool, check_type
from .blocks import BlockManager, OutOfBlocksError


def pool_picture(bm: BlockManager) -> str:
    """The pool as three aligned text rows, then each sequence's block table and token count."""
    check_type("bm", bm, BlockManager, "a labkit.kv_cache.BlockManager")
    holders: dict[int, list[str]] = {b: [] for b in range(bm.num_blocks)}
    for s in bm.seq_ids:
        for b in bm.block_table(s):
            holders[b].append(str(s))
    cached = set(bm.cached_blocks())
    cells = [",".join(holders[b]) or ("~" if b in cached else ".") for b in range(bm.num_blocks)]
    width = max(4, *(len(c) for c in cells)) + 1
    rows = [("block", [str(b) for b in range(bm.num_blocks)]), ("holds", cells),
            ("refs", [str(bm.ref_count(b)) for b in range(bm.num_blocks)])]
    lines = [f"{name:<6}" + "".join(c.rjust(width) for c in values) for name, values in rows]
    lines += [f"  {s!s:>3}: table {bm.block_table(s)}, {bm.num_tokens(s)} tokens" for s in bm.seq_ids]
    lines.append(f"  free {bm.num_free_blocks}, in use {bm.num_used_blocks}, cached {bm.num_cached_blocks} "
                 f"(evicted next: {bm.cached_blocks()[:1] or '-'})")
    return "\n".join(lines)


def story(num_blocks: int = 8, block_size: int = 4) -> list[tuple[str, str]]:
    """A scripted run of a small pool: (what happened, pool_picture after it), step by step. Two requests share
    a prefix and split on a new token; a fork copies on write; a finished request leaves cached blocks that a
    later one reuses; a last one evicts them."""
    bm = BlockManager(num_blocks, block_size)
    prefix = [7, 1, 2, 3, 4, 5, 6, 7]  # two full blocks

    def prefill(seq, tokens):  # allocate, then the forward computes every token: full blocks become findable
        bm.allocate(seq, tokens)
        bm.mark_computed(seq, len(tokens))

    def decode(seq, tokens):
        for t in tokens:
            bm.append(seq, t)
            bm.mark_computed(seq, bm.num_tokens(seq))

    steps: list[tuple[str, Callable[[], object]]] = [
        ("a arrives and is prefilled: 10 prompt tokens -> 3 blocks", lambda: prefill("a", prefix + [8, 9])),
        ("b arrives with the same 8-token prefix: 2 computed blocks shared, only its tail is new",
         lambda: prefill("b", prefix + [1, 1])),
        ("b decodes 3 tokens: its last block fills, then a new one", lambda: decode("b", (2, 3, 4))),
        ("b forks into c (parallel sampling): every block shared", lambda: bm.fork("b", "c")),
        ("c appends: copy-on-write of the shared, partly filled last block",
         lambda: decode("c", (5,))),
        ("a finishes: its shared blocks stay with b and c, its own partial block is free", lambda: bm.free("a")),
        ("b and c finish: all their full blocks are cached", lambda: [bm.free("b"), bm.free("c")]),
        ("d arrives with the prefix again: cache hits, no prefill for 8 tokens",
         lambda: prefill("d", prefix + [3])),
        ("e needs 5 blocks: the 4 free ones, then the least recently used cached one is evicted",
         lambda: prefill("e", list(range(1, 19)))),
        ("f arrives: nothing is free or cached any more", lambda: prefill("f", [1])),
    ]
    out = []
    for text, act in steps:
        try:
            act()
        except OutOfBlocksError as e:  # shown, not raised: the story can be run on a smaller pool
            text += f" -> refused: {e}"
        out.append((text, pool_picture(bm)))
    return out


def block_explorer(static: bool = False):
    """A slider over story()'s steps, each showing the pool; static=True (or without ipywidgets) prints every
    step instead. Returns the widget, or None when static."""
    check_bool("static", static)
    steps = story()
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for i, (text, picture) in enumerate(steps, 1):
            print(f"step {i}: {text}\n{picture}\n")
        return None
    out = widgets.Output()

    def show(change=None):
        i = slider.value
        out.clear_output(wait=True)
        with out:
            print(f"step {i}: {steps[i - 1][0]}\n{steps[i - 1][1]}")

    slider = widgets.IntSlider(value=1, min=1, max=len(steps), description="step")
    slider.observe(show, names="value")
    show()
    return widgets.VBox([slider, out])


def plot_waste(rows: list[dict], title: str):
    """Bars: utilization of each scheme on this trace beside vLLM's Fig. 2 figure. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots()
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["utilization"] for r in rows], 0.4, label="this trace")
    ax.bar(x + 0.2, [r["vLLM Fig. 2"] for r in rows], 0.4, label="vLLM Fig. 2 (OPT-13B, ShareGPT)")
    ax.set_xticks(x, [r["scheme"] for r in rows])
    ax.set_ylabel("KV memory holding real tokens")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="upper left")
    return fig


def plot_block_sweep(rows: list[dict], title: str):
    """Empty slots per sequence (internal fragmentation) and block-table entries against block size."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    sizes = [r["block_size"] for r in rows]
    ax.plot(sizes, [r["empty slots/seq"] for r in rows], "o-", label="empty slots in the last block", clip_on=False)
    ax.plot(sizes, [r["table entries/seq"] for r in rows], "s-", label="block-table entries")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1)  # linear below 1: block size 1 wastes 0 slots, which a log axis drops
    ax.set_ylim(bottom=0)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("per sequence, averaged over steps")
    ax.set_title(title)
    ax.legend()
    return fig
