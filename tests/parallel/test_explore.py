"""Notebook 04's pictures and widget: the ring as text, the plots draw what they are given, the plan table
and the explorer (widget and static fallback)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from labkit.parallel import explore, schedule  # noqa: E402
from labkit.parallel.linkmodel import LinkModel  # noqa: E402
from labkit.parallel.planner import Hardware, plan  # noqa: E402


def test_ring_steps_text():
    text = explore.ring_steps(3)
    assert text.splitlines()[0] == "reduce-scatter step 0:  0->1 c0  1->2 c1  2->0 c2"
    assert len(text.splitlines()) == 4


def test_plots_draw_their_data():
    link = LinkModel(1e-4, 1e9)
    ax = explore.plot_link({"all_reduce": ([1e3, 1e6], [2e-4, 2e-3])}, {"all_reduce": link, "n": 2})
    assert len(ax.lines) == 2
    events = schedule.simulate("1f1b", 2, 3)
    ax = explore.plot_timeline(events, "1F1B")
    assert len(ax.patches) == 12 + 0 and ax.get_title() == "1F1B"
    plans = plan("llama-3-70b", Hardware(1))
    axes = explore.plot_plan(plans[0])
    assert len(axes[0].patches) == len(plans[0].time)
    plt.close("all")


def test_plan_rows_and_explorer(capsys):
    rows = explore.plan_rows(plan("llama-3-70b", Hardware(1)), 64, 3)
    assert len(rows) == 3 and rows[0]["rejected because"] == "-"
    plans = explore.plan_explorer(static=True, model="llama-3-70b", nodes=1)
    out = capsys.readouterr().out
    assert plans[0].fits and "TP" in out and out.startswith("llama-3-70b on 1 x 8 h100-sxm (8 devices)")
    widget = explore.plan_explorer()
    assert [c.description for c in widget.children[:5]] == ["model", "device", "nodes", "batch", "context"]
    plt.close("all")


def test_every_control_changes_the_output(capsys):
    """The browser test moves one control of the widget and waits for its output to change."""
    outputs = []
    for nodes in (16, 17):
        explore.plan_explorer(static=True, nodes=nodes)
        outputs.append(capsys.readouterr().out)
    assert outputs[0] != outputs[1]
    plt.close("all")
