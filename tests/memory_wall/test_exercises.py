"""Notebook 01's exercises: each reference passes its own check, a wrong answer fails it, and the notebook's
check cells use these definitions (none of them keeps a copy of the answer)."""
import json
import math

import pytest

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


def test_forgetting_the_value_vectors_or_rounding_down_fails(capsys):
    assert fails(exercises.KV_BYTES_PER_TOKEN, lambda L, h, d, b=2: math.ceil(L * h * d * b), capsys)
    assert fails(exercises.KV_BYTES_PER_TOKEN, lambda L, h, d, b=2: int(2 * L * h * d * b), capsys)


def test_a_roofline_without_its_roof_or_its_slope_fails(capsys):
    assert fails(exercises.ATTAINABLE_FLOPS, lambda i, peak, bw: i * bw, capsys)
    assert fails(exercises.ATTAINABLE_FLOPS, lambda i, peak, bw: max(peak, i * bw), capsys)


def test_a_ceiling_per_sequence_or_in_bits_fails(capsys):
    ex = exercises.DENSE_DECODE_CEILING
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: bw / (n * bits / 8 + batch * ctx * kv), capsys)
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: batch * bw / (n * bits + batch * ctx * kv), capsys)
    assert fails(ex, lambda n, bits, kv, batch, ctx, bw: batch * bw / (n * bits / 8 + ctx * kv), capsys)


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
