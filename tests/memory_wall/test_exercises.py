"""Notebook 01's exercises: each reference passes its own check and agrees with an independent one (transformers'
own LlamaConfig and KV cache, torch's FLOP counter), a wrong answer fails it (on the fixed cases alone, each
naive answer on the case written for it), the failure says which case, and the notebook's check cells use
these definitions (none of them, and no cell above them, shows the answer)."""
import dataclasses
import inspect
import json
import math

import numpy as np
import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from labkit.course.classroom import BEGIN as classroom_begin
from labkit import specs
from labkit.memory_wall import exercises, roofline
from labkit.paths import NOTEBOOKS
from labkit.rng import Rng

from ..refusals import assert_refused


@pytest.mark.parametrize("ex", exercises.EXERCISES, ids=[ex.name for ex in exercises.EXERCISES])
def test_each_reference_passes_its_own_check(ex, capsys):
    def mine(*args):  # a copy, not the reference itself
        return ex.reference(*args)
    assert ex.check(mine) is mine and capsys.readouterr().out == (
        f"[PASS] mine matches the reference on {len(ex.cases)} fixed and {ex.n_random} random cases.\n")


def kv_by_transformers(config: dict, b: float) -> int:
    """Exercise 1 by transformers: its LlamaConfig fills in the missing keys, then K and V per KV head per layer."""
    c = transformers.LlamaConfig(**config)
    return math.ceil(2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * b)


def kv_cases(n: int = 30) -> list[tuple]:
    rng = Rng(7)
    return list(exercises.KV_BYTES_PER_TOKEN.cases) + [exercises.random_kv_case(rng) for _ in range(n)]


def test_exercise_1s_reference_reads_a_config_as_transformers_does():
    for config, b in kv_cases():
        assert exercises.KV_BYTES_PER_TOKEN.reference(config, b) == kv_by_transformers(config, b), config


@pytest.mark.parametrize("config", [
    {"num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2},
    {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4},                   # no KV head count
    {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "head_dim": 16,    # head_dim given,
     "num_key_value_heads": 1}])                                                             # not 32 / 4
def test_exercise_1s_reference_is_what_a_real_llama_caches_per_token(config):
    """transformers' own LlamaForCausalLM, FP32: the bytes of its KV cache after 5 tokens, over 5."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, intermediate_size=16,
                                                                   vocab_size=32)).eval()
    with torch.no_grad():
        cache = model(torch.arange(5)[None], use_cache=True).past_key_values
    cached = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    assert exercises.KV_BYTES_PER_TOKEN.reference(config, 4) * 5 == cached


def test_exercise_1s_fixed_cases_are_the_configs_they_say():
    tiny, l70, llama1, qwen, three_bits = exercises.KV_BYTES_PER_TOKEN.cases
    assert tiny[0] == json.loads((NOTEBOOKS.parent / "data" / "tinylm" / "config.json").read_text())
    assert exercises.kv_bytes_from_config(l70[0]) == specs.model("llama-2-70b").kv_bytes_per_token(2) == 327_680
    assert "num_key_value_heads" not in llama1[0] and exercises.kv_bytes_from_config(llama1[0]) == 2**19
    assert qwen[0]["head_dim"] != qwen[0]["hidden_size"] // qwen[0]["num_attention_heads"]
    assert exercises.kv_bytes_from_config(*three_bits) == 3


def test_the_presets_as_configs_give_the_presets_kv_bytes():
    for name in ("gpt3-175b", "opt-13b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "mixtral-8x7b"):
        m = specs.model(name)
        assert exercises.kv_bytes_from_config(exercises.llama_config(m), 2) == m.kv_bytes_per_token(2)
    assert_refused(lambda: exercises.llama_config(specs.model("deepseek-v3")), ValueError, "spec", "deepseek-v3",
                   "MLA")


def test_a_config_without_the_keys_the_cache_needs_is_refused():
    assert_refused(lambda: exercises.kv_bytes_from_config({"num_hidden_layers": 2, "hidden_size": 8}), ValueError,
                   "config", {"num_hidden_layers": 2, "hidden_size": 8}, "'num_attention_heads'")
    assert_refused(lambda: exercises.kv_bytes_from_config([("hidden_size", 8)]), TypeError, "config",
                   [("hidden_size", 8)], "config.json")
    bad = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 0}
    assert_refused(lambda: exercises.kv_bytes_from_config(bad), ValueError, "config['num_attention_heads']", 0, "")
    zero_kv = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 0}
    assert_refused(lambda: exercises.kv_bytes_from_config(zero_kv), ValueError, "config['num_key_value_heads']", 0, "")
    null_kv = {**zero_kv, "num_key_value_heads": None}  # JSON null: LlamaConfig's default, as if absent
    assert exercises.kv_bytes_from_config(null_kv, 1) == kv_by_transformers(null_kv, 1)


def attainable_by_counting(m: int, k: int, n: int, b: float, peak: float, bw: float) -> float:
    """Exercise 2 independently: torch counts the FLOP of a real product, the bytes are the three tensors'."""
    x, w = torch.ones(m, k), torch.ones(k, n)
    with FlopCounterMode(display=False) as counter:
        y = x @ w
    moved = (x.numel() + w.numel() + y.numel()) * b
    return min(peak, counter.get_total_flops() / moved * bw)


def test_exercise_2s_reference_is_the_roofline_at_the_counted_intensity():
    rng = Rng(3)
    small = [(1 + rng.below(300), 1 + rng.below(300), 1 + rng.below(300), rng.choice([0.5, 1, 2, 4]),
              1e9 * (1 + rng.below(10**6)), 1e9 * (1 + rng.below(10**4))) for _ in range(20)]
    for case in list(exercises.MATMUL_ATTAINABLE_FLOPS.cases[:1]) + exercises.MATMUL_ATTAINABLE_FLOPS.cases[2:] + small:
        assert exercises.matmul_attainable_flops(*case) == pytest.approx(attainable_by_counting(*case), rel=1e-12)
    big = exercises.MATMUL_ATTAINABLE_FLOPS.cases[1]  # 8192^3: counted by formula, too large to multiply here
    assert exercises.matmul_attainable_flops(*big) == big[4]


def test_the_dense_ceiling_is_the_formula_written_out():
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


def cfg(config: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(**config)


# naive answers to exercise 1, each with the fixed cases that catch it (the others pass it)
NAIVE_KV = {
    "query heads for KV heads": ({0, 1, 3, 4}, lambda c, b=2: math.ceil(
        2 * c["num_hidden_layers"] * c["num_attention_heads"] * cfg(c).head_dim * b)),
    "num_key_value_heads always there": ({2}, lambda c, b=2: math.ceil(
        2 * c["num_hidden_layers"] * c["num_key_value_heads"] * cfg(c).head_dim * b)),
    "head_dim from hidden_size always": ({3}, lambda c, b=2: math.ceil(
        2 * c["num_hidden_layers"] * cfg(c).num_key_value_heads * (c["hidden_size"] // c["num_attention_heads"]) * b)),
    "rounded down": ({4}, lambda c, b=2: int(2 * c["num_hidden_layers"] * cfg(c).num_key_value_heads * cfg(c).head_dim
                                           * b)),
    "rounded to the nearest": ({4}, lambda c, b=2: round(2 * c["num_hidden_layers"] * cfg(c).num_key_value_heads
                                                       * cfg(c).head_dim * b)),
}


@pytest.mark.parametrize("mistake", NAIVE_KV, ids=list(NAIVE_KV))
def test_each_naive_kv_answer_fails_on_the_fixed_cases_written_for_it(mistake, capsys):
    ex = exercises.KV_BYTES_PER_TOKEN
    caught, wrong = NAIVE_KV[mistake]
    for i, case in enumerate(ex.cases):
        try:
            ok = ex.compare(wrong(*case), ex.reference(*case))
        except KeyError:
            ok = False
        assert ok == (i not in caught), (mistake, i)
    out = fails_on_fixed_cases(ex, wrong, capsys)
    assert repr(ex.cases[min(caught)][0])[:40] in out  # the first failing case is named


def test_forgetting_the_values_or_a_float_answer_fails_and_says_which_case(capsys):
    ex = exercises.KV_BYTES_PER_TOKEN

    def keys_only(c, b=2):
        return math.ceil(c["num_hidden_layers"] * cfg(c).num_key_value_heads * cfg(c).head_dim * b)

    def unrounded(c, b=2):
        return 2 * c["num_hidden_layers"] * cfg(c).num_key_value_heads * cfg(c).head_dim * b

    assert fails_on_fixed_cases(ex, keys_only, capsys).startswith("[FAIL] keys_only({")
    out = fails_on_fixed_cases(ex, unrounded, capsys)
    assert out.startswith("[FAIL] unrounded({") and "0.375) returned 2.25 (float)" in out
    fails_on_fixed_cases(ex, lambda c, b=2: True, capsys)


def test_whole_bytes_accepts_ints_of_any_kind_and_nothing_else():
    assert exercises.whole_bytes(3, 3) and exercises.whole_bytes(np.int64(3), 3)
    assert not exercises.whole_bytes(3.0, 3) and not exercises.whole_bytes(True, 1)
    assert not exercises.whole_bytes(2, 3) and not exercises.whole_bytes("3", 3)


def intensity_no_output(m, k, n, b):
    return 2 * m * k * n / ((m * k + k * n) * b)


# naive answers to exercise 2, each with the fixed cases that catch it
NAIVE_MATMUL = {
    "the output's write forgotten": ({0, 2, 3}, lambda m, k, n, b, peak, bw: min(peak, intensity_no_output(m, k, n, b)
                                                                             * bw)),
    "one FLOP per multiply-add": ({0, 2, 3}, lambda m, k, n, b, peak, bw: min(
        peak, m * k * n / ((m * k + k * n + m * n) * b) * bw)),
    "FLOP per element, not per byte": ({0, 2, 3}, lambda m, k, n, b, peak, bw: min(
        peak, 2 * m * k * n / (m * k + k * n + m * n) * bw)),
    "the roof's max for its min": ({0, 1, 2, 3}, lambda m, k, n, b, peak, bw: max(
        peak, 2 * m * k * n / ((m * k + k * n + m * n) * b) * bw)),
    "the slope without its roof": ({1}, lambda m, k, n, b, peak, bw: 2 * m * k * n / ((m * k + k * n + m * n) * b)
                                   * bw),
}


@pytest.mark.parametrize("mistake", NAIVE_MATMUL, ids=list(NAIVE_MATMUL))
def test_each_naive_matmul_answer_fails_on_the_fixed_cases_written_for_it(mistake, capsys):
    ex = exercises.MATMUL_ATTAINABLE_FLOPS
    caught, wrong = NAIVE_MATMUL[mistake]
    for i, case in enumerate(ex.cases):
        assert math.isclose(wrong(*case), ex.reference(*case), rel_tol=ex.rtol) == (i not in caught), (mistake, i)
    fails_on_fixed_cases(ex, wrong, capsys)


def test_a_compute_bound_answer_for_the_attention_scores_is_caught_without_random_cases(capsys):
    ex = exercises.MATMUL_ATTAINABLE_FLOPS
    m, k, n, b, peak, bw = ex.cases[3]
    assert intensity_no_output(m, k, n, b) > peak / bw > roofline.matmul_intensity(m, n, k, b)  # the flipped verdict
    out = fails_on_fixed_cases(ex, NAIVE_MATMUL["the output's write forgotten"][1], capsys)
    assert "(1, 4096, 4096, 2, " in out  # the first case that catches it, named


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


def test_a_learner_function_that_raises_is_reported_not_raised(capsys):
    def broken(*args):
        raise ZeroDivisionError("oops")
    assert exercises.MATMUL_ATTAINABLE_FLOPS.check(broken) is exercises.matmul_attainable_flops
    assert "raised ZeroDivisionError: oops" in capsys.readouterr().out


def test_random_cases_are_the_same_on_every_run():
    for ex in exercises.EXERCISES:
        a, b = Rng(0), Rng(0)
        assert [ex.random_case(a) for _ in range(5)] == [ex.random_case(b) for _ in range(5)]


def test_notebook_01s_check_cells_use_these_exercises_and_define_no_answer():
    cells = ["".join(c["source"]) for c in json.loads((NOTEBOOKS / "01_memory_wall.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    for ex, const in [(exercises.KV_BYTES_PER_TOKEN, "KV_BYTES_PER_TOKEN"),
                      (exercises.MATMUL_ATTAINABLE_FLOPS, "MATMUL_ATTAINABLE_FLOPS"),
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

    related = {"dense_decode_ceiling": [footprint.decode_bytes_per_step, footprint.decode_tokens_per_s],
               "kv_bytes_per_token": [specs.kv_bytes_per_token],
               "matmul_attainable_flops": [roofline.matmul_intensity, roofline.attainable_flops]}
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
