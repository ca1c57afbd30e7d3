"""The Day-0 report: rendering is deterministic and rounded, every row names its lab, the numbers shown are the
report's (recomputed here by hand), and bad inputs are refused by name."""
from dataclasses import replace

import pytest

from labkit.day0.report import LABS, Day0Report, day0_report, report_rows
from tests.refusals import assert_refused

FIELDS = dict(operators=["embedding", "rms_norm", "rope", "gqa_attention", "swiglu", "qk_norm"],
              planned_bytes=[1_234_567, 1_234_567], measured_bytes=[1_300_001, 1_299_999], load_serial_s=0.4321,
              load_threaded_s=0.2109, ttft_text_s=0.0123456, ttft_image_s=0.0345678,
              accuracy={"colour": 0.97, "shape": 0.955, "text copy": 1.0},
              reference_accuracy={"colour": 0.98, "shape": 0.96, "text copy": 1.0}, layout="TP=2")


def make(**changes):
    return Day0Report(**{**FIELDS, **changes})


def test_rendering_is_deterministic_and_rounded():
    text = day0_report(make())
    assert text == day0_report(make()) == day0_report(Day0Report.from_dict(dict(FIELDS)))
    lines = text.splitlines()
    assert lines[0] == "Day-0 report: TinyVLM, TP=2, bf16"
    assert "operators covered (6): embedding, rms_norm, rope, gqa_attention, swiglu, qk_norm" in lines[1]
    # 3 significant digits, computed here from the inputs
    assert " 1.3 " in lines[4] and " 1.23 " in lines[4] and "memory rank 0 (MB)" in lines[4]
    speed = next(line for line in lines if "speed-up" in line)
    assert f"{0.4321 / 0.2109:.3g}" in speed
    assert " 12.3 " in next(line for line in lines if "TTFT text (ms)" in line)
    assert " 34.6 " in next(line for line in lines if "TTFT image (ms)" in line)
    shape = next(line for line in lines if "accuracy shape (%)" in line)
    assert " 95.5 " in shape and " 96 " in shape
    # measurements that differ beyond 3 significant digits render the same text
    assert day0_report(make(ttft_text_s=0.01234561, measured_bytes=[1_300_002, 1_299_998])) == text


def test_every_row_names_its_lab_and_ranks_are_rows():
    rows = report_rows(make(ttft_image_repeat_s=0.01))
    assert all(r["from"].startswith("lab ") for r in rows)
    assert [r["line"] for r in rows if r["line"].startswith("memory")] == ["memory rank 0 (MB)", "memory rank 1 (MB)"]
    by_line = {r["line"]: r for r in rows}
    assert by_line["memory rank 1 (MB)"]["from"] == LABS["memory"] and "lab 01 footprint" in LABS["memory"]
    assert by_line["layout"]["from"] == LABS["layout"] and by_line["layout"]["against"] == "-"
    assert by_line["TTFT same image again (ms)"]["against"] == pytest.approx(34.5678)
    assert "lab 05 prefix cache" in by_line["TTFT image (ms)"]["from"]
    assert [r["line"] for r in rows if r["line"].startswith("accuracy")] == [
        "accuracy colour (%)", "accuracy shape (%)", "accuracy text copy (%)"]  # sorted: stable order
    assert len(report_rows(replace(make(), planned_bytes=[5], measured_bytes=[6]))) == len(rows) - 2


def test_every_comparison_names_what_it_is_against():
    rows = {r["line"]: r for r in report_rows(make(ttft_image_repeat_s=0.01, planned_layout="TP=1 DP=2"))}
    assert rows["layout"]["this run"] == "TP=2" and rows["layout"]["against"] == "TP=1 DP=2"
    assert "planner's first choice" in rows["layout"]["against what"]
    assert rows["memory rank 0 (MB)"]["against what"] == "planned"
    assert "serial" in rows["load bf16, threaded (s)"]["against what"]
    assert "first request" in rows["TTFT same image again (ms)"]["against what"]
    assert "FP32" in rows["accuracy colour (%)"]["against what"]
    assert all((r["against"] == "-") == (r["against what"] == "-") for r in rows.values())
    assert "TP=1 DP=2" in day0_report(make(planned_layout="TP=1 DP=2"))
    assert_refused(lambda: make(planned_layout=""), TypeError, "planned_layout", "", "None or a non-empty str")


def test_an_unreliable_comparison_never_reaches_the_report_as_a_figure():
    rows = {r["line"]: r for r in report_rows(make(ttft_image_repeat_s=0.05, load_reliable=False,
                                                   ttft_image_repeat_reliable=False))}
    assert rows["load speed-up, serial/threaded (x)"]["this run"] == "unreliable on this run"
    assert rows["TTFT same image again (ms)"]["this run"] == "unreliable on this run"
    text = day0_report(make(load_reliable=False))
    assert f"{0.4321 / 0.2109:.3g}" not in text and "unreliable on this run" in text


def test_bad_inputs_are_refused_by_name():
    assert_refused(lambda: make(load_reliable=1), TypeError, "load_reliable", 1, "True or False")
    assert_refused(lambda: make(planned_bytes=[1, -2]), ValueError, "planned_bytes[1]", -2, "positive int")
    assert_refused(lambda: make(measured_bytes=[1.5, 2]), TypeError, "measured_bytes[0]", 1.5, "positive int")
    assert_refused(lambda: make(measured_bytes=[1]), ValueError, "measured_bytes", [1], "one entry per rank")
    assert_refused(lambda: make(ttft_text_s=-0.1), ValueError, "ttft_text_s", -0.1, "positive")
    assert_refused(lambda: make(load_serial_s="1"), TypeError, "load_serial_s", "1", "positive")
    assert_refused(lambda: make(accuracy={"colour": 1.2, "shape": 1, "text copy": 1}), ValueError,
                   "accuracy['colour']", 1.2, "[0, 1]")
    assert_refused(lambda: make(reference_accuracy={"colour": 1.0}), ValueError, "reference_accuracy", ["colour"],
                   "the same tasks as accuracy")
    assert_refused(lambda: make(operators=[]), ValueError, "operators", [], "non-empty list")
    assert_refused(lambda: make(layout=""), TypeError, "layout", "", "non-empty str")
    assert_refused(lambda: make(labs={"memory": "lab 01"}), ValueError, "labs", {"memory": "lab 01"}, "missing")
    partial = {k: v for k, v in FIELDS.items() if k != "ttft_image_s"}
    assert_refused(lambda: Day0Report.from_dict(partial), ValueError, "ttft_image_s", None, "given")
    assert_refused(lambda: Day0Report.from_dict({**FIELDS, "ttft": 1}), ValueError, "d", "ttft", "fields only")
    with pytest.raises(TypeError, match=r"^report must be Day0Report, got dict"):
        day0_report(dict(FIELDS))
