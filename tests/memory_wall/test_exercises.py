"""Notebook 01's exercises: each reference passes its own check, a wrong answer fails it (on the fixed cases
alone, where the prompt names what it asks), the failure says which case, and the notebook's check cells
use these definitions (none of them, and no cell above them, shows the answer)."""
import dataclasses
import inspect
import json
import math

import numpy as np
import pytest

from labkit.course.classroom import BEGIN as classroom_begin
from labkit.memory_wall import exercises, roofline
from labkit.paths import NOTEBOOKS
from labkit.rng import Rng


@pytest.mark.parametrize("ex", exercises.EXERCISES, ids=[ex.name for ex in exercises.EXERCISES])
def test_each_reference_passes_its_own_check(ex, capsys):
    def mine(*args):  # a copy, not the reference itself
        return ex.reference(*args)
    assert ex.check(mine) is mine and capsys.readouterr().out == (
        f"[PASS] mine matches the reference on {len(ex.cases)} fixed and {ex.n_random} random cases.\n")


def test_the_references_agree_with_the_formulas_written_out():
    # independent of labkit: the formulas of the notebook's markdown
    for args in exercises.KV_BYTES_PER_TOKEN.cases:
        n_layers, n_kv_heads, head_dim, b = args
        assert exercises.KV_BYTES_PER_TOKEN.reference(*args) == math.ceil(2 * n_layers * n_kv_heads * head_dim * b)
    for i, peak, bw in exercises.ATTAINABLE_FLOPS.cases:
        assert exercises.ATTAINABLE_FLOPS.reference(i, peak, bw) == min(peak, i * bw)
    rng = Rng(1)
    for _ in range(20):
        n, bits, kv, batch, context, bw = exercises.random_ceiling_case(rng)
        expected = batch * bw / (n * bits / 8 + batch * context * kv)
        assert math.isclose(exercises.dense_decode_ceiling(n, bits, kv, batch, context, bw), expected, rel_tol=1e-12)


def fails(ex, wrong, capsys) -> bool:
    handed_back = ex.check(wrong)
    return handed_back is ex.reference and capsys.readouterr().out.startswith("[FAIL]")


def fails_on_fixed_cases(ex, wrong, capsys) -> str:
    """The [FAIL] line `wrong` gets from the fixed cases alone (no random case to rescue a weak check)."""
    fixed_only = dataclasses.replace(ex, n_random=0)
    assert fixed_only.check(wrong) is ex.reference
    out = capsys.readouterr().out
    assert out.startswith("[FAIL]"), out
    return out


def test_forgetting_the_value_vectors_or_rounding_down_fails(capsys):
    assert fails(exercises.KV_BYTES_PER_TOKEN, lambda L, h, d, b=2: math.ceil(L * h * d * b), capsys)
    assert fails(exercises.KV_BYTES_PER_TOKEN, lambda L, h, d, b=2: int(2 * L * h * d * b), capsys)


def test_an_unrounded_or_float_answer_fails_and_says_which_case(capsys):
    ex = exercises.KV_BYTES_PER_TOKEN

    def unrounded(L, h, d, b=2):
        return 2 * L * h * d * b

    out = fails_on_fixed_cases(ex, unrounded, capsys)
    assert out.startswith("[FAIL] unrounded(32, 8, 128, 0.5) returned 32768.0") and "expected 32768" in out
    out = fails_on_fixed_cases(ex, lambda L, h, d, b=2: float(math.ceil(2 * L * h * d * b)), capsys)
    assert "(40, 40, 128, 2) returned 819200.0" in out and "expected 819200" in out
    out = fails_on_fixed_cases(ex, lambda L, h, d, b=2: round(2 * L * h * d * b), capsys)
    assert "(3, 1, 1, 0.375) returned 2, expected 3." in out  # to the nearest is not up
    fails_on_fixed_cases(ex, lambda L, h, d, b=2: np.int64(math.ceil(2 * L * h * d * b)) + 1, capsys)
    fails_on_fixed_cases(ex, lambda L, h, d, b=2: True, capsys)


def test_whole_bytes_accepts_ints_of_any_kind_and_nothing_else():
    assert exercises.whole_bytes(3, 3) and exercises.whole_bytes(np.int64(3), 3)
    assert not exercises.whole_bytes(3.0, 3) and not exercises.whole_bytes(True, 1)
    assert not exercises.whole_bytes(2, 3) and not exercises.whole_bytes("3", 3)


def test_every_fixed_case_of_exercise_1_is_needed():
    # each wrong answer is caught by its own fixed case, and passes the cases of real FP16 models
    ex = exercises.KV_BYTES_PER_TOKEN
    wrong = {(32, 8, 128, 0.5): lambda L, h, d, b=2: 2 * L * h * d * b,             # a float
             (1, 1, 1, 0.75): lambda L, h, d, b=2: int(2 * L * h * d * b),          # rounded down
             (3, 1, 1, 0.375): lambda L, h, d, b=2: round(2 * L * h * d * b)}       # to the nearest
    for case, fn in wrong.items():
        others = [c for c in ex.cases if c not in wrong]
        assert all(ex.compare(fn(*c), ex.reference(*c)) for c in others), case
        assert not ex.compare(fn(*case), ex.reference(*case)), case


def test_a_roofline_without_its_roof_or_its_slope_fails(capsys):
    assert fails(exercises.ATTAINABLE_FLOPS, lambda i, peak, bw: i * bw, capsys)
    assert fails(exercises.ATTAINABLE_FLOPS, lambda i, peak, bw: max(peak, i * bw), capsys)


def test_a_ceiling_per_sequence_or_in_bits_fails(capsys):
    ex = exercises.DENSE_DECODE_CEILING
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: bw / (n * bits / 8 + batch * ctx * kv), capsys)
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: batch * bw / (n * bits + batch * ctx * kv), capsys)
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: batch * bw / (n * bits / 8 + ctx * kv), capsys)


def test_the_batch_of_8_fixed_case_catches_per_sequence_answers_without_random_cases(capsys):
    ex = exercises.DENSE_DECODE_CEILING

    def per_sequence(n, bits, kv, batch, ctx, bw):
        return bw / (n * bits / 8 + batch * ctx * kv)

    out = fails_on_fixed_cases(ex, per_sequence, capsys)
    assert out.startswith("[FAIL] per_sequence(68976648192, 4.5, 327680, 8, 4096, 4800000000000.0) returned ")
    fails_on_fixed_cases(ex, lambda n, bits, kv, batch, ctx, bw: batch * bw / (n * bits / 8 + ctx * kv), capsys)


def test_a_roofline_without_its_roof_or_its_slope_fails_on_the_fixed_cases(capsys):
    ex = exercises.ATTAINABLE_FLOPS
    for wrong in (lambda i, peak, bw: i * bw, lambda i, peak, bw: max(peak, i * bw), lambda i, peak, bw: peak,
                  lambda i, peak, bw: peak / bw):
        fails_on_fixed_cases(ex, wrong, capsys)


def test_a_learner_function_that_raises_is_reported_not_raised(capsys):
    def broken(*args):
        raise ZeroDivisionError("oops")
    assert exercises.ATTAINABLE_FLOPS.check(broken) is roofline.attainable_flops
    assert "raised ZeroDivisionError: oops" in capsys.readouterr().out


def test_random_cases_are_the_same_on_every_run():
    for ex in exercises.EXERCISES:
        a, b = Rng(0), Rng(0)
        assert [ex.random_case(a) for _ in range(5)] == [ex.random_case(b) for _ in range(5)]


def test_notebook_01s_check_cells_use_these_exercises_and_define_no_answer():
    cells = ["".join(c["source"]) for c in json.loads((NOTEBOOKS / "01_memory_wall.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    for ex, const in [(exercises.KV_BYTES_PER_TOKEN, "KV_BYTES_PER_TOKEN"),
                      (exercises.ATTAINABLE_FLOPS, "ATTAINABLE_FLOPS"),
                      (exercises.DENSE_DECODE_CEILING, "DENSE_DECODE_CEILING")]:
        check = f"{ex.name} = check.exercise({ex.name}, exercises.{const})"
        at = [i for i, c in enumerate(cells) if check in c]
        assert len(at) == 1, f"no single check cell `{check}`"
        assert "### BEGIN SOLUTION" in cells[at[0] - 1] and f"def {ex.name}(" in cells[at[0] - 1]
        assert not any("def reference" in c or "def random_" in c for c in cells)
        # nothing above the check shows the reference's source
        assert not any("show(" in c and ex.reference.__name__ in c for c in cells[:at[0]])


def test_no_cell_above_an_exercise_check_shows_its_answer():
    """Neither the code nor the stored outputs of the cells above a check cell hold a line of the reference's
    source, or of labkit's own version of the same formula (footprint.decode_bytes_per_step for exercise 3)."""
    from labkit.memory_wall import footprint

    related = {"dense_decode_ceiling": [footprint.decode_bytes_per_step, footprint.decode_tokens_per_s]}
    cells = json.loads((NOTEBOOKS / "01_memory_wall.ipynb").read_text())["cells"]
    texts = []
    for c in cells:
        outs = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                       for o in c.get("outputs", []))
        texts.append(("".join(c["source"]), outs))
    for ex in exercises.EXERCISES:
        at = next(i for i, (src, _) in enumerate(texts) if f"check.exercise({ex.name}, " in src)
        sources = [ex.reference, *related.get(ex.name, [])]
        body = {line.strip() for fn in sources for line in inspect.getsource(fn).splitlines()[1:]
                if len(line.strip()) > 30 and not line.strip().startswith(('"""', "#"))}
        for i, (src, outs) in enumerate(texts[:at]):
            shown = {line.strip() for line in outs.splitlines()}
            assert not body & shown, f"cell {i} shows {ex.name}'s answer: {body & shown}"
            if cells[i]["cell_type"] == "code" and classroom_begin not in src:
                assert not body & {line.strip() for line in src.splitlines()}, f"cell {i} holds the answer"
