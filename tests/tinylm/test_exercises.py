"""Notebook 00's exercise: the reference passes its own check, each wrong answer fails it on the fixed cases
alone (the comment beside each case says which mistake it catches), and the failure names the case and the
first differing key."""
import dataclasses
import json

from labkit.paths import NOTEBOOKS
from labkit.tinylm import TinyLMConfig, exercises
from labkit.tinylm.config import param_counts

EX = exercises.COUNT_PARAMS


def test_each_reference_passes_its_own_check(capsys):
    for ex in exercises.EXERCISES:
        mine = lambda *args, ex=ex: ex.reference(*args)  # noqa: E731  a copy, not the reference itself
        assert ex.check(mine) is mine
        assert capsys.readouterr().out.startswith("[PASS]")


def test_the_reference_matches_the_counts_written_out():
    # Llama-2-7B's published checkpoint holds 6,738,415,616 parameters
    assert EX.reference(*EX.cases[2])["total"] == 6_738_415_616
    tiny = EX.reference(TinyLMConfig())  # 256 x 128 tied; 4 layers of wq, wo 128x128 and wk, wv 128x64
    assert tiny == {"embedding": 256 * 128, "attention": 4 * (2 * 128 * 128 + 2 * 128 * 64),
                    "mlp": 4 * 3 * 128 * 384, "norm": 9 * 128, "total": 820_352}


def fixed_only_failure(wrong, capsys) -> str:
    assert dataclasses.replace(EX, n_random=0).check(wrong) is EX.reference
    out = capsys.readouterr().out
    assert out.startswith("[FAIL]"), out
    return out


def test_forgetting_the_untied_head_fails(capsys):
    def wrong(cfg):
        counts = dict(param_counts(cfg))
        if not cfg.tie_embeddings:
            counts["embedding"] //= 2
            counts["total"] = sum(v for k, v in counts.items() if k != "total")
        return counts

    out = fixed_only_failure(wrong, capsys)
    assert "tie_embeddings=False" in out and "returned ['embedding'] = 32768, not the answer for this case." in out


def test_full_width_keys_and_values_fail_on_tinylms_own_config(capsys):
    def no_gqa(cfg):
        counts = dict(param_counts(cfg))
        counts["attention"] = cfg.n_layers * 4 * cfg.d_model * cfg.n_heads * cfg.head_dim
        counts["total"] = sum(v for k, v in counts.items() if k != "total")
        return counts

    out = fixed_only_failure(no_gqa, capsys)
    assert out.startswith("[FAIL] no_gqa(TinyLMConfig(vocab_size=256,")
    assert "['attention'] = 262144, not the answer for this case" in out


def test_the_naive_readings_of_the_listing_fail_on_the_case_written_for_each(capsys):
    """print(model) lists lm_head beside tok_emb, and TinyLM's wk/wv have d_model // 2 outputs: a count that
    takes either at face value fails on a fixed case, and the failure names that case."""
    def listed_head_counted(cfg):  # lm_head counted even when it is the embedding (tied)
        counts = dict(param_counts(cfg))
        counts["embedding"] = 2 * cfg.vocab_size * cfg.d_model
        counts["total"] = sum(v for k, v in counts.items() if k != "total")
        return counts

    def half_width_kv(cfg):  # wk, wv read off TinyLM's listing as d_model // 2 outputs
        counts = dict(param_counts(cfg))
        counts["attention"] = cfg.n_layers * (2 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * (cfg.d_model // 2))
        counts["total"] = sum(v for k, v in counts.items() if k != "total")
        return counts

    assert fixed_only_failure(listed_head_counted, capsys).startswith(
        "[FAIL] listed_head_counted(TinyLMConfig(vocab_size=256, d_model=128,")
    assert EX.compare(half_width_kv(EX.cases[0][0]), EX.reference(*EX.cases[0]))  # TinyLM cannot tell it apart
    assert "vocab_size=32000" in fixed_only_failure(half_width_kv, capsys)       # Llama-2-7B can


def test_forgetting_the_final_norm_or_a_matrix_of_the_mlp_fails(capsys):
    def no_final_norm(cfg):
        counts = dict(param_counts(cfg))
        counts["norm"] -= cfg.d_model
        counts["total"] -= cfg.d_model
        return counts

    def two_matrix_mlp(cfg):
        counts = dict(param_counts(cfg))
        counts["total"] -= counts["mlp"] // 3
        counts["mlp"] -= counts["mlp"] // 3
        return counts

    assert "['norm'] = 1024, not the answer for this case" in fixed_only_failure(no_final_norm, capsys)
    fixed_only_failure(two_matrix_mlp, capsys)


def test_float_counts_or_missing_keys_fail(capsys):
    fixed_only_failure(lambda cfg: {k: float(v) for k, v in param_counts(cfg).items()}, capsys)
    fixed_only_failure(lambda cfg: {k: v for k, v in param_counts(cfg).items() if k != "total"}, capsys)
    fixed_only_failure(lambda cfg: {**param_counts(cfg), "total": True}, capsys)
    fixed_only_failure(lambda cfg: list(param_counts(cfg).values()), capsys)


def test_same_counts_is_exact():
    c = param_counts(TinyLMConfig())
    assert exercises.same_counts(dict(c), c)
    assert not exercises.same_counts({**c, "mlp": c["mlp"] + 1}, c)
    assert not exercises.same_counts({**c, "extra": 0}, c)
    assert not exercises.same_counts({**c, "norm": float(c["norm"])}, c)


def test_notebook_00s_check_cell_uses_this_exercise_and_nothing_above_it_shows_the_answer():
    cells = json.loads((NOTEBOOKS / "00_setup.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    at = [i for i, c in enumerate(code) if "count_params = check.exercise(count_params, exercises.COUNT_PARAMS)" in c]
    assert len(at) == 1 and "### BEGIN SOLUTION" in code[at[0] - 1]
    assert not any("show(" in c and "param_counts" in c for c in code[:at[0]])
