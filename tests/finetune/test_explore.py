"""Notebook 09's calculator: its table holds training_memory's figures for every method, the static fallback
prints every model, the widget answers its controls, and bad input is refused by name."""
from labkit.finetune import explore
from labkit.finetune.memory import METHODS, training_memory
from tests.refusals import assert_refused


def test_the_table_holds_the_calculators_figures():
    text = explore.calculator_table("llama-2-7b", 2048, 8, checkpointing=True)
    lines = text.splitlines()
    for method in METHODS:
        row = next(line for line in lines if line.split()[0] == method)
        total = training_memory("llama-2-7b", method, 2048, 8, True)["total"] / 1e9
        assert f"{total:.4g}"[:4] in row.replace(",", ""), (method, total, row)


def test_the_static_fallback_prints_every_model_and_the_widget_answers(capsys):
    assert explore.calculator(static=True, tokens=1024) is None
    out = capsys.readouterr().out
    assert all(f"{name}, 1024 tokens per batch" in out for name in explore.CALC_MODELS)
    widget = explore.calculator()
    controls = {c.description: c for c in widget.children[:-1]}
    assert set(controls) == {"model", "log2 tokens", "LoRA rank", "checkpointing"}
    capsys.readouterr()
    controls["log2 tokens"].value, controls["model"].value = 10, "moe-3t"
    assert widget.kwargs == {"model": "moe-3t", "log2_tokens": 10, "rank": 16, "checkpointing": False}
    assert explore.calculator_table("moe-3t", 1024, 16, False) in capsys.readouterr().out  # what the widget shows


def test_bad_input_is_refused():
    assert_refused(lambda: explore.calculator_table("gpt-9"), ValueError, "model", "gpt-9", "one of")
    assert_refused(lambda: explore.calculator(static="yes"), TypeError, "static", "yes", "True or False")
    assert_refused(lambda: explore.calculator(tokens=0), ValueError, "tokens", 0, "positive")
