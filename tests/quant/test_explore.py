import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from labkit.course import Timing  # noqa: E402
from labkit.quant import explore as qw  # noqa: E402
from labkit.quant import quantize, speed  # noqa: E402

from ..refusals import assert_refused  # noqa: E402


def test_grid_levels_are_what_dequantize_can_produce():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) + 0.3
    for scheme in ("sym", "asym"):
        levels = qw.grid_levels(w, 3, scheme, 32, row=1, group=1)
        assert levels.numel() == 8 and (levels.diff() > 0).all()
        got = quantize(w, 3, scheme, 32).dequantize()[1, 32:64]
        assert all(bool((levels - v).abs().min() < 1e-6) for v in got)
    assert qw.group_values(w, "channel", row=2).tolist() == w[2].tolist()
    assert qw.group_values(w, "tensor").numel() == 256


def test_error_table_skips_groups_that_do_not_divide_and_orders_by_bits():
    w = torch.randn(8, 96, generator=torch.Generator().manual_seed(1))
    rows = qw.error_table(w, bits_list=(4, 8))
    assert {r["group_size"] for r in rows} == {32, "channel", "tensor"}
    by = {(r["bits"], r["scheme"], r["group_size"]): r["sqnr_db"] for r in rows}
    assert all(by[(8, s, g)] > by[(4, s, g)] + 20 for s in ("sym", "asym") for g in (32, "channel", "tensor"))


def test_explorer_widget_and_static_fallback(capsys):
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    assert qw.explorer(w, static=True) is None
    assert "INT4 asym group 32" in capsys.readouterr().out
    pytest.importorskip("ipywidgets")
    widget = qw.explorer(w)
    assert [c.description for c in widget.children[:3]] == ["bits", "scheme", "group_size"]
    assert all(c.style.description_width == "initial" for c in widget.children[:3])  # labels are never cut


def test_pooled_sqnr_sums_noise_and_signal_over_the_matrices():
    g = torch.Generator().manual_seed(3)
    ws = [torch.randn(4, 64, generator=g), 3 * torch.randn(8, 32, generator=g)]
    noise = sum(float((quantize(w, 4, "sym", 32).dequantize().double() - w.double()).pow(2).sum()) for w in ws)
    signal = sum(float(w.double().pow(2).sum()) for w in ws)
    assert qw.pooled_sqnr_db(ws, 4, "sym", 32) == pytest.approx(10 * math.log10(signal / noise))
    assert qw.pooled_sqnr_db([torch.zeros(2, 32)], 4, "asym", 32) == math.inf  # exact round trip
    with pytest.raises(TypeError, match="ws must be a non-empty list of 2-D weight tensors"):
        qw.pooled_sqnr_db(ws[0], 4, "sym", 32)
    with pytest.raises(ValueError, match="each of ws must be a non-empty 2-D tensor"):
        qw.pooled_sqnr_db([torch.zeros(3)], 4, "sym", 32)


def test_bad_input_is_refused_before_any_figure():
    w = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"group must be an int in \[0, 1\], got 2"):
        qw.grid_levels(w, 4, "asym", 32, group=2)
    with pytest.raises(ValueError, match=r"row must be an int in \[0, 3\], got 4"):
        qw.group_values(w, "channel", row=4)
    assert qw.group_values(w, "tensor", row=7).numel() == 256  # one group for the whole matrix: any row
    with pytest.raises(ValueError, match="group_size must be a divisor of w's input dimension 64, got 48"):
        qw.group_values(w, 48)
    with pytest.raises(TypeError, match="bits must be one of"):
        qw.error_table(w, bits_list=(4.0,))
    with pytest.raises(TypeError, match="static must be True or False"):
        qw.explorer(w, static="yes")
    assert_refused(lambda: qw.error_table(w, bits_list=()), TypeError, "bits_list", (), "a non-empty tuple or list")
    assert_refused(lambda: qw.error_table(w, groups=(48,)), ValueError, "groups", (48,),
                   "at least one divides w's input dimension 64")
    assert_refused(lambda: qw.plot_group(w, ax=3), TypeError, "ax", 3, "a matplotlib Axes or None")
    assert_refused(lambda: qw.label_points(None, []), TypeError, "ax", None, "a matplotlib Axes")
    assert_refused(lambda: qw.plot_quality({"FP32": 1}), TypeError, "results['FP32']", 1, "a dict from quality.sweep")


def label_boxes(ax):
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    from matplotlib.text import Text

    for t in ax.texts:
        t.update_positions(renderer)
    return [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text alone, without its leader line


def no_overlaps(boxes):
    return not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_labels_of_crowded_points_do_not_overlap():
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    points = [(f"setting number {i}", 8 + 0.05 * i, 3.57 + 0.0001 * i) for i in range(6)] + [("far", 4, 3.62)]
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    ax.set_xlim(3, 20)
    ax.set_ylim(3.55, 3.63)
    anns = qw.label_points(ax, points)
    assert [a.get_text() for a in anns] == [p[0] for p in points]
    assert no_overlaps(label_boxes(ax))
    with pytest.raises(TypeError, match="points must be a list of \\(label, x, y\\) triples"):
        qw.label_points(ax, [("a", 1)])
    plt.close("all")


def sweep_row(bpw, ppl):
    return {"bpw": bpw, "ppl": ppl}


def test_plot_quality_labels_every_setting_apart():
    import matplotlib.pyplot as plt

    # notebook 03's settings: three near 8 bits at almost the same perplexity, six INT4 ones near 4-5 bits
    results = {"FP32": sweep_row(32.0, 3.5725), "BF16": sweep_row(16.02, 3.5726),
               "INT8 asym g32": sweep_row(9.03, 3.5726),
               "INT8 sym channel": sweep_row(8.14, 3.5724), "INT4 sym g32": sweep_row(4.54, 3.5975),
               "INT4 sym channel": sweep_row(4.14, 3.618), "INT4 asym g32": sweep_row(5.04, 3.5908),
               "INT4 asym g64": sweep_row(4.54, 3.5839), "INT4 asym g128": sweep_row(4.29, 3.5891),
               "INT4 asym channel": sweep_row(4.25, 3.593), "INT4 asym g32, emb INT8": sweep_row(5.2, 3.5751),
               "mixed: attn FP16, MLP INT4 g32, emb INT8": sweep_row(7.83, 3.5744)}
    ax = qw.plot_quality(results)
    assert [t.get_text() for t in ax.texts] == [n.split(":")[0] for n in results]
    assert no_overlaps(label_boxes(ax))
    np_points = ax.collections[0].get_offsets()
    assert [tuple(p) for p in np_points.tolist()] == [(r["bpw"], r["ppl"]) for r in results.values()]
    plt.close("all")


def test_plot_matmuls_draws_both_roofs_and_every_case():
    import matplotlib.pyplot as plt

    ms = {"FP32": 21.2, "BF16": 11.5, "INT4": 2.2, "FP32 on 1 thread": 21.1, "INT4 on 1 thread": 4.2, "roof": 3.5,
          "roof on 1 thread": 6.25}
    n = 4096 * 4096
    run = speed.MatmulRun({k: Timing((v / 1e3,)) for k, v in ms.items()},
                          {"FP32": 4 * n, "BF16": 2 * n, "INT4": 10_485_760, "FP32 on 1 thread": 4 * n,
                           "INT4 on 1 thread": 10_485_760})
    ax = qw.plot_matmuls(run, 3e11, 1.5e11)
    assert [line.get_label() for line in ax.get_legend().get_lines()] == [
        "2 threads: 77 GB/s, 300 GFLOP/s", "1 thread: 43 GB/s, 150 GFLOP/s"]
    assert [t.get_text() for t in ax.texts] == list(speed.CASES) and no_overlaps(label_boxes(ax))
    with pytest.raises(ValueError, match="peak_one must be a positive finite number"):
        qw.plot_matmuls(run, 3e11, 0)
    plt.close("all")


def matmul_run(threads: int = 2, **ms) -> speed.MatmulRun:
    """A recorded run (one sample per case, in ms) with the bytes of a 4096 x 4096 layer."""
    n = 4096 * 4096
    base = {"FP32": 21.2, "BF16": 11.5, "INT4": 2.2, "FP32 on 1 thread": 21.1, "INT4 on 1 thread": 4.2, "roof": 3.5,
            "roof on 1 thread": 6.25}
    return speed.MatmulRun({k: Timing((v / 1e3,)) for k, v in {**base, **ms}.items()},
                           {"FP32": 4 * n, "BF16": 2 * n, "INT4": 10_485_760, "FP32 on 1 thread": 4 * n,
                            "INT4 on 1 thread": 10_485_760}, threads=threads)


def roofline_at(intensity: float, peak: float, bandwidth: float) -> float:
    return min(peak, bandwidth * intensity)


def test_roofline_notes_say_where_the_lines_cross_and_why():
    quiet = qw.roofline_notes(matmul_run(**{"FP32": 20.0}), 3e11, 1.5e11)
    assert quiet == ["every 2-thread figure is at or above its 1-thread twin: the 2-thread roofline lies above the "
                     "1-thread one and no point sits below its twin"]
    # FP32 gains nothing from a second thread (21.2 against 21.1 ms): within the noise the verdicts allow
    same = qw.roofline_notes(matmul_run(), 3e11, 1.5e11)
    assert same[0] == "FP32 product: 12.66 GFLOP/s on 2 threads, below the 12.72 of 1 thread"
    assert same[1] == "the 2-thread roofline lies above the 1-thread one" and "within the 1.25x" in same[2]
    # a busy core: the 2-thread peak under the 1-thread one while the 2-thread roof is higher: the lines cross
    run = matmul_run()
    busy = qw.roofline_notes(run, 1e11, 1.5e11)
    assert busy[0] == "FP32 matmul peak: 100 GFLOP/s on 2 threads, below the 150 of 1 thread"
    cross = float(busy[2].split(" at ")[1].split(" FLOP/byte")[0])
    both = (run.bytes_per_s(speed.ROOF), run.bytes_per_s(speed.ROOF_1))
    assert roofline_at(cross, 1e11, both[0]) == pytest.approx(roofline_at(cross, 1.5e11, both[1]), rel=0.03)
    assert roofline_at(cross / 2, 1e11, both[0]) > roofline_at(cross / 2, 1.5e11, both[1])  # crossing, not touching
    assert roofline_at(cross * 2, 1e11, both[0]) < roofline_at(cross * 2, 1.5e11, both[1])
    assert busy[-1].startswith("1.50x lower with 2 threads, beyond the 1.25x the verdicts allow: another program")
    # both roofs lower with 2 threads: one line under the other, no crossing
    under = qw.roofline_notes(matmul_run(roof=8.0), 1e11, 1.5e11)
    assert under[0].startswith("memory roof: 33.55 GB/s on 2 threads, below the 42.95 of 1 thread")
    assert "the 2-thread roofline lies below the 1-thread one" in under
    assert qw.roofline_notes(matmul_run(threads=1), 1e11, 1.5e11) == [
        "torch runs on 1 thread here: both rooflines and both points of each kernel are one thread's"]
    with pytest.raises(ValueError, match="peak_all must be a positive finite number"):
        qw.roofline_notes(run, -1.0, 1e11)
    assert_refused(lambda: qw.roofline_notes({}, 1e11, 1e11), TypeError, "run", {}, "a labkit.quant.speed.MatmulRun")
