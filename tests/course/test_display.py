"""labkit.course.display: aligned tables and fact-check verdicts."""
import pytest
from hypothesis import given, settings, strategies as st

from labkit.course import display

from ..refusals import assert_refused


def test_table_aligns_columns_and_rounds_floats():
    text = display.table([{"name": "a", "x": 1.23456, "n": 10}, {"name": "long name", "x": 0.5, "n": 7}])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # every line as wide as the header
    assert lines[0].split() == ["name", "x", "n"]
    assert lines[1].split() == ["a", "1.23", "10"] and lines[2].split() == ["long", "name", "0.5", "7"]
    assert display.table([{"x": 2 / 3}], digits=2).splitlines()[1].strip() == "0.67"
    assert display.table([]) == "(no rows)"
    with pytest.raises(TypeError, match="rows must be a list of dicts"):
        display.table({"x": 1})


def test_verdict_prints_each_part_once(capsys):
    text = display.verdict("8:1 compression", ["4 bits vs 32 bits", "scales add 0.5 bit"], "Roughly.", "per channel")
    out = capsys.readouterr().out
    assert out == text + "\n"
    assert text.splitlines() == ["CLAIM    8:1 compression", "         4 bits vs 32 bits",
                                 "         scales add 0.5 bit", "VERDICT  Roughly.", "HOLDS IF per channel"]
    with pytest.raises(TypeError, match="arithmetic must be a list of str lines"):
        display.verdict("c", "one line", "v", "h")
    with pytest.raises(TypeError, match="claim must be a non-empty str"):
        display.verdict("", [], "v", "h")


def test_a_fact_check_shows_as_a_verdict(capsys):
    fc = display.FactCheck("6 TB in FP16", ["3e12 x 2 bytes = 6e12 bytes"], "True.", "dense FP16 weights", {"tb": 6.0})
    fc.show()
    assert capsys.readouterr().out.splitlines()[:3] == ["CLAIM    6 TB in FP16", "         3e12 x 2 bytes = 6e12 bytes",
                                                        "VERDICT  True."]
    assert fc.numbers["tb"] == 6.0


@pytest.mark.parametrize("value, text", [(2217.3, "2,217"), (4.03e-05, "0.0000403"), (0.0959, "0.0959"), (1.0, "1"),
                                         (607.2, "607"), (1020.4, "1,020"), (999.6, "1,000"), (-2217.3, "-2,217"),
                                         (0.0, "0"), (float("inf"), "inf")])
def test_fixed_point_never_writes_an_exponent(value, text):
    assert display.fixed(value) == text


def test_table_writes_floats_in_fixed_point():
    out = display.table([{"ms": 2217.3, "rate": 4.03e-05, "n": 3228420, "name": "x"}])
    assert "e+" not in out and "e-" not in out
    assert out.splitlines()[1].split() == ["2,217", "0.0000403", "3228420", "x"]
    with pytest.raises(TypeError, match="rows must be a list of dicts"):
        display.table({"ms": 1.0})
    with pytest.raises(TypeError, match="value must be a number"):
        display.fixed("1.0")


def test_rows_with_other_keys_are_refused_naming_the_row_and_the_keys():
    rows = [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"a": 5, "c": 6}]
    assert_refused(lambda: display.table(rows), ValueError, "rows[2]", rows[2],
                   "a dict with the keys of rows[0], ['a', 'b'] (missing ['b'], extra ['c'])")
    assert_refused(lambda: display.table([{"a": 1}, {"a": 2, "b": 3}]), ValueError, "rows[1]", {"a": 2, "b": 3},
                   "(missing [], extra ['b'])")
    # the same keys in another order are the same row: printed in the first row's order
    assert display.table([{"a": 1, "b": 2}, {"b": 4, "a": 3}]).splitlines()[2].split() == ["3", "4"]


@pytest.mark.parametrize("call, error, name, value, expected", [
    (lambda: display.table({"x": 1}), TypeError, "rows", {"x": 1}, "a list of dicts"),
    (lambda: display.table([{"x": 1}, 2]), TypeError, "rows[1]", 2, "a dict"),
    (lambda: display.table([{"x": 1.0}], digits=0), ValueError, "digits", 0, "a positive int"),
    (lambda: display.table([{"x": 1.0}], digits=2.5), TypeError, "digits", 2.5, "a positive int"),
    (lambda: display.fixed(True), TypeError, "value", True, "a number"),
    (lambda: display.fixed(1.0, digits=0), ValueError, "digits", 0, "a positive int"),
])
def test_bad_tables_are_refused(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab:/.", min_size=1, max_size=12), max_size=12), st.integers(5, 40))
def test_clip_keeps_the_most_whole_words_that_fit(words, width):
    text = "  ".join(words)  # runs of whitespace become one space
    out = display.clip(text, width)
    assert len(out) <= width
    fits = [k for k in range(len(words) + 1) if len(" ".join(words[:k]) + " ...") <= width]
    if len(" ".join(words)) <= width:
        assert out == " ".join(words)
    elif max(fits) > 0:
        assert out == " ".join(words[:max(fits)]) + " ..."
    else:  # the first word alone is too long: cut inside it
        assert out == words[0][:width - 4] + " ..."


def test_clip_refuses_what_it_cannot_cut():
    assert display.clip("no heartbeat for 1.02 s", 60) == "no heartbeat for 1.02 s"
    assert_refused(lambda: display.clip("text", 4), ValueError, "width", 4, "at least 5")
    assert_refused(lambda: display.clip(3, 10), TypeError, "text", 3, "a string")
