"""The pictures: pool_picture agrees with the manager, the story runs through every state, the widget and its
static fallback, and the plots draw the rows they are given."""
import math

import matplotlib

matplotlib.use("Agg")

from labkit.kv_cache import BlockManager, explore, waste  # noqa: E402


def test_pool_picture_shows_holders_refs_cached_and_free():
    bm = BlockManager(4, 2)
    bm.allocate("a", [1, 2, 3])
    bm.fork("a", "b")
    bm.allocate("c", [5, 6])
    bm.mark_computed("c", 2)  # its forward ran: its full block is cached when it ends
    bm.allocate("d", [5, 6])  # not computed: freed without caching anything
    bm.free("c")
    bm.free("d")
    lines = explore.pool_picture(bm).splitlines()
    assert lines[1].split() == ["holds", "a,b", "a,b", "~", "."]
    assert lines[2].split() == ["refs", "2", "2", "0", "0"]
    assert "free 1, in use 2, cached 1" in lines[-1]


def test_the_story_shares_copies_caches_and_evicts():
    steps = explore.story()
    text = "\n".join(t for t, _ in steps)
    assert "refused" in steps[-1][0] and "refused" not in text.rsplit("\n", 1)[0]
    pictures = [p for _, p in steps]
    assert "a,b" in pictures[1] and "~" in pictures[6] and "~" not in pictures[8].splitlines()[1]


def test_widget_and_static_fallback(capsys):
    widget = explore.block_explorer()
    assert widget is not None and widget.children[0].max == len(explore.story())
    capsys.readouterr()
    widget.children[0].value = 3  # outside a kernel the widget's output area prints here
    text, picture = explore.story()[2]
    shown = capsys.readouterr().out
    assert f"step 3: {text}" in shown and picture in shown and "step 4" not in shown
    assert explore.block_explorer(static=True) is None
    assert capsys.readouterr().out.count("step ") == len(explore.story())


def test_plots_draw_their_rows():
    trace = waste.request_trace("tinylm", 50)
    fig = explore.plot_waste(waste.waste_table(trace, 256), "t")
    assert len(fig.axes[0].patches) == 2 * len(waste.SCHEMES)
    rows = waste.block_size_sweep(trace, (1, 4, 16))
    fig = explore.plot_block_sweep(rows, "t")
    assert [list(line.get_xdata()) for line in fig.axes[0].lines] == [[1, 4, 16]] * 2
    ax = fig.axes[0]
    fig.canvas.draw()
    empty = ax.lines[0]
    assert empty.get_ydata()[0] == 0  # block size 1 wastes nothing: its point must still be on the axis
    x0, y0 = ax.transData.transform((1, 0))
    assert all(map(math.isfinite, (x0, y0))) and ax.get_ylim()[0] <= 0
