"""Notebook 01's plots draw exactly the numbers they are given."""
import matplotlib
import numpy as np
import pytest

from labkit.memory_wall import explore

from ..refusals import assert_refused

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")

ROW = [{"gpu": "g", "link": "l", "workload": "w", "offloaded": 0, "share": 0.0, "fits": True}]
PARTS = {"weights": [138.0, 138.0], "kv_cache": [1.3, 10.7], "activations": [0.5, 4.2]}


def test_footprint_bars_stack_the_parts_in_order_under_the_capacity_line():
    ax = explore.plot_footprint(["1 x 4096", "8 x 4096"], PARTS, 80, "one H100 (80 GB)", "Llama-2-70B in BF16")
    bars = ax.patches
    assert [b.get_height() for b in bars] == pytest.approx([138.0, 138.0, 1.3, 10.7, 0.5, 4.2])
    assert [b.get_y() for b in bars] == pytest.approx([0, 0, 138.0, 138.0, 139.3, 148.7])
    [line] = ax.lines
    assert line.get_ydata()[0] == 80
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one H100 (80 GB)", *PARTS]


def test_ceilings_are_drawn_log_log_one_line_per_curve():
    curves = {"a": ([1, 2, 4], [10.0, 19.0, 35.0]), "b": ([1, 2], [5.0, 9.0])}
    ax = explore.plot_ceilings(curves, "one H200", context=4096)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    for line, (x, y) in zip(ax.lines, curves.values()):
        assert line.get_xdata().tolist() == x and line.get_ydata().tolist() == y
    assert ax.get_xlabel() == "batch (sequences of 4,096 tokens)"


def test_link_share_is_drawn_in_percent_with_the_claims_band():
    offloaded = np.arange(0, 5)
    shares = {"decode": np.array([0.0, 0.5, 0.7, 0.8, 0.9])}
    ax = explore.plot_link_share(offloaded, shares, "t", n_layers=80)
    assert ax.lines[0].get_ydata() == pytest.approx([0, 50, 70, 80, 90])
    band = ax.patches[0].get_path().get_extents().transformed(ax.patches[0].get_transform()).get_points()
    low, high = ax.transData.inverted().transform(band)[:, 1]
    assert (low, high) == pytest.approx((30, 50))
    assert ax.get_xlabel() == "layers offloaded (of 80)"
    assert "the claim: 30-50%" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_share_region_maps_every_setting_to_its_category():
    rows = [{"gpu": "g", "link": "l", "workload": "w1", "offloaded": k, "share": s, "fits": f}
            for k, (s, f) in enumerate([(0.0, True), (0.4, True), (0.6, True)])]
    rows += [{"gpu": "g", "link": "l", "workload": "w2", "offloaded": k, "share": s, "fits": f}
             for k, (s, f) in enumerate([(0.2, False), (0.45, False), (0.5, True)])]
    ax = explore.plot_share_region(rows, "t")
    # 0 outside & fits, 1 in the band & fits, 2 in the band & does not fit, 3 outside & does not fit
    assert ax.images[0].get_array().tolist() == [[0, 1, 0], [3, 2, 1]]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["g + l, w1", "g + l, w2"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [label for _, label in explore.REGION_COLOURS]


def test_region_table_prints_one_line_per_setting_and_workload():
    region = [{"gpu": "h200", "link": "nvlink-c2c", "workload": "decode, batch 1", "fewest": 0, "share_then": 0.0,
               "in_band": "4-7", "in_band_possible": "4-7", "holds": True},
              {"gpu": "h100-sxm", "link": "pcie5-x16", "workload": "decode, batch 1", "fewest": 36,
               "share_then": 0.9612, "in_band": "1", "in_band_possible": "-", "holds": False},
              {"gpu": "h100-sxm", "link": "pcie5-x16", "workload": "huge", "fewest": None, "share_then": None,
               "in_band": "-", "in_band_possible": "-", "holds": False}]
    lines = explore.region_table(region).splitlines()
    assert lines[0].split() == ["setting", "workload", "must", "offload", "share", "then", "30-50%", "with", "of",
                                "them", "possible"]
    assert lines[1].split()[-4:] == ["0", "0%", "4-7", "4-7"] and "(GH200-style)" in lines[1]
    assert lines[2].split()[-4:] == ["36", "96%", "1", "-"]
    assert lines[3].split()[-5:] == ["nothing", "fits", "-", "-", "-"]


REFUSED = [
    (lambda: explore.region_table([]), TypeError, "region", [], "a non-empty list of rows from transfer.region()"),
    (lambda: explore.region_table([{"gpu": "h200"}]), TypeError, "region", [{"gpu": "h200"}], "transfer.region()"),
    (lambda: explore.plot_share_region([], "t"), TypeError, "rows", [], "a non-empty list of rows from transfer"),
    (lambda: explore.plot_share_region([{"gpu": "g"}], "t"), TypeError, "rows", [{"gpu": "g"}], "transfer.sweep()"),
    (lambda: explore.plot_share_region(ROW, "t", band=(0.3, 1.5)), ValueError, "band", 1.5, "a finite number in"),
    (lambda: explore.plot_share_region(ROW, 5), TypeError, "title", 5, "str"),
    (lambda: explore.plot_footprint(["a"], {"w": [1.0, 2.0]}, 80, "x", "t"), ValueError, "parts",
     {"w": [1.0, 2.0]}, "one value per label (1)"),
    (lambda: explore.plot_footprint(["a"], {"w": [-1.0]}, 80, "x", "t"), ValueError, "parts['w']", [-1.0],
     "finite numbers >= 0"),
    (lambda: explore.plot_footprint(["a"], {"w": ["1"]}, 80, "x", "t"), TypeError, "parts['w']", ["1"],
     "a list or array of numbers"),
    (lambda: explore.plot_footprint(["a"], {}, 80, "x", "t"), ValueError, "parts", {}, "a non-empty dict"),
    (lambda: explore.plot_footprint("ab", {"w": [1.0]}, 80, "x", "t"), TypeError, "labels", "ab", "a list of str"),
    (lambda: explore.plot_footprint(["a"], {"w": [1.0]}, 0, "x", "t"), ValueError, "capacity", 0, "a positive"),
    (lambda: explore.plot_footprint(["a"], {"w": [1.0]}, 80, None, "t"), TypeError, "capacity_label", None, "str"),
    (lambda: explore.plot_ceilings({}, "t", 4096), ValueError, "curves", {}, "a non-empty dict"),
    (lambda: explore.plot_ceilings({"a": [1, 2]}, "t", 4096), TypeError, "curves['a'] batches", 1,
     "a list or array of numbers"),
    (lambda: explore.plot_ceilings({"a": ([1, 2], [1.0])}, "t", 4096), ValueError, "curves['a']",
     ([1, 2], [1.0]), "of equal length, all > 0"),
    (lambda: explore.plot_ceilings({"a": 5}, "t", 4096), TypeError, "curves['a']", 5, "a (batches, tokens/s) pair"),
    (lambda: explore.plot_ceilings({"a": ([1], [1.0])}, "t", 0), ValueError, "context", 0, "a positive int"),
    (lambda: explore.plot_ceilings({"a": ([1], [1.0])}, 7, 4096), TypeError, "title", 7, "str"),
    (lambda: explore.plot_link_share([0, 1], {"d": [0.1, 1.2]}, "t", 80), ValueError, "shares",
     {"d": [0.1, 1.2]}, "fractions in [0, 1]"),
    (lambda: explore.plot_link_share([0, 1], {"d": [0.1, 0.2]}, "t", 80, band=(0.5, 0.3)), ValueError, "band",
     (0.5, 0.3), "low <= high"),
    (lambda: explore.plot_link_share([0, 1], {"d": [0.1, 0.2]}, "t", 80, band=(0.3, 2)), ValueError, "band", 2,
     "in [0, 1]"),
    (lambda: explore.plot_link_share([0, 1], {"d": [0.1, 0.2]}, "t", 80, band=0.3), TypeError, "band", 0.3,
     "a (low, high) pair"),
    (lambda: explore.plot_link_share([0, 1], {"d": [0.1, 0.2]}, "t", 80.0), TypeError, "n_layers", 80.0,
     "a positive int"),
    (lambda: explore.plot_link_share("01", {"d": [0.1, 0.2]}, "t", 80), TypeError, "offloaded", "01",
     "a list or array of numbers"),
]


@pytest.mark.parametrize("call,error,name,value,expected", REFUSED, ids=[f"{r[2]}-{r[3]!r}" for r in REFUSED])
def test_bad_input_is_refused_before_anything_is_drawn(call, error, name, value, expected):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    assert_refused(call, error, name, value, expected)
    assert plt.get_fignums() == before


def _mem():
    from labkit.course import Timing

    ms = lambda *v: Timing(tuple(x / 1e3 for x in v))  # noqa: E731
    return {"array_bytes": 256 * 2**20, "threads": 2,
            "gemv": {"n_matrices": 8, "weight_bytes": 64 * 2**20},
            "timings": {"read_threads": ms(5.0, 5.5, 6.0), "read": ms(11.0, 11.0, 11.0),
                        "copy": ms(13.0, 13.2, 13.4), "gemv": ms(22.0, 21.0, 23.0)}}


def test_measurement_table_gives_median_and_best_rates_and_the_steadiest_kernel():
    lines = explore.measurement_table(_mem()).splitlines()
    assert lines[0].split() == ["kernel", "GB/s", "(median)", "GB/s", "(best)", "spread"]
    roof = lines[1].split()
    assert " ".join(roof[:-3]) == "torch sum, 2 threads (the roof)"
    assert roof[-3:] == [f"{256 * 2**20 / 5.5e-3 / 1e9:.1f}", f"{256 * 2**20 / 5.0e-3 / 1e9:.1f}", "18%"]
    assert lines[3].split()[-3:] == [f"{2 * 256 * 2**20 / 13.2e-3 / 1e9:.1f}", f"{2 * 256 * 2**20 / 13e-3 / 1e9:.1f}",
                                     "3%"]  # a copy moves its bytes twice
    assert ("matrix-vector FP32, 8 x 64 MiB" in lines[4]
            and lines[4].split()[-3] == f"{8 * 64 * 2**20 / 22e-3 / 1e9:.1f}")
    assert lines[5] == ("3 rounds: numpy's two kernels in turns, then torch's sum and the product in turns; "
                        "the steadiest this run: np.sum, one core")


def test_measurement_table_refuses_anything_but_a_measure_memory_result():
    assert_refused(lambda: explore.measurement_table([1]), TypeError, "mem", [1], "the dict hardware.measure_memory")
    bad = {**_mem(), "timings": {"read": 1}}
    assert_refused(lambda: explore.measurement_table(bad), ValueError, "mem", bad, "timings of ['read_threads'")
    worse = {**_mem(), "timings": {**_mem()["timings"], "gemv": 0.02}}
    assert_refused(lambda: explore.measurement_table(worse), TypeError, "mem['timings']['gemv']", 0.02, "Timing")
