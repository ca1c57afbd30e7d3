"""Notebook 09's calculator: its table holds training_memory's figures and the compute ceiling for every method,
the rule picks the first method that fits, the static fallback prints every model, the widget answers its
controls, and bad input is refused by name."""
import pytest

from labkit.finetune import explore
from labkit.finetune.factcheck import LAPTOP_FLOPS
from labkit.finetune.memory import METHODS, training_memory
from labkit.specs import model as model_spec
from tests.refusals import assert_refused


def test_the_table_holds_the_calculators_figures():
    text = explore.calculator_table("llama-2-7b", 2048, 8, checkpointing=True)
    lines = text.splitlines()
    for method in METHODS:
        row = next(line for line in lines if line.split()[0] == method)
        total = training_memory("llama-2-7b", method, 2048, 8, True)["total"] / 1e9
        assert f"{total:.4g}"[:4] in row.replace(",", ""), (method, total, row)


def test_the_ceiling_is_peak_flops_over_flop_per_token():
    n = model_spec("llama-2-7b").active_params
    assert explore.ceiling("llama-2-7b", "full") == pytest.approx(LAPTOP_FLOPS / (6 * n))
    assert explore.ceiling("llama-2-7b", "qlora") == pytest.approx(LAPTOP_FLOPS / (4 * n))
    assert explore.ceiling("llama-2-7b", "lora", checkpointing=True, flops=1e12) == pytest.approx(1e12 / (6 * n))
    active = model_spec("deepseek-v3").active_params  # a mixture of experts: only the routed experts count
    assert explore.ceiling("deepseek-v3", "full") == pytest.approx(LAPTOP_FLOPS / (6 * active))


def test_the_rule_takes_the_first_method_that_fits():
    order = [(m, c) for m in METHODS for c in (False, True)]
    for name in ("llama-2-7b", "llama-3-70b", "tinylm"):
        for gb in (0.01, 8, 16, 24, 64, 128, 10**6):
            fitting = [(m, c) for m, c in order if training_memory(name, m, 2048, 16, c)["total"] <= gb * 1e9]
            assert explore.choose(name, gb, 2048, 16) == (fitting[0] if fitting else None), (name, gb)
    assert explore.choose("llama-2-7b", 8) == ("qlora", True) and explore.choose("llama-2-7b", 1) is None


def test_the_machines_table_has_8_and_16_gb_rows_and_replay_needs_more():
    text = explore.machines_table(("llama-2-7b",), tokens=2048)
    rows = {line.split()[0]: line for line in text.splitlines()[1:]}
    assert {"8", "16"} <= set(rows)
    assert rows["24"].split()[1:] == ["lora", "lora", "+", "ckpt"]  # replay's longer batches need checkpointing
    assert explore.your_machine("llama-2-7b", 24, 2048) == ("llama-2-7b in 24 GB, 2048 tokens per batch: lora; "
                                                            "with replay: lora + ckpt")


def test_the_static_fallback_prints_every_model_and_the_widget_answers(capsys):
    assert explore.calculator(static=True, tokens=1024, memory_gb=16) is None
    out = capsys.readouterr().out
    assert all(f"{name}, 1024 tokens per batch" in out for name in explore.CALC_MODELS)
    assert explore.your_machine("llama-2-7b", 16, 1024) in out
    widget = explore.calculator(memory_gb=12)
    controls = {c.description: c for c in widget.children[:-1]}
    assert set(controls) == {"model", "log2 tokens", "LoRA rank", "checkpointing", "memory GB", "TFLOP/s"}
    capsys.readouterr()
    controls["log2 tokens"].value, controls["model"].value, controls["TFLOP/s"].value = 10, "moe-3t", 100.0
    assert widget.kwargs == {"model": "moe-3t", "log2_tokens": 10, "rank": 16, "checkpointing": False,
                             "memory_gb": 12, "tflops": 100.0}
    shown = capsys.readouterr().out
    assert explore.calculator_table("moe-3t", 1024, 16, False, 100e12) in shown  # what the widget shows
    assert explore.your_machine("moe-3t", 12, 1024) in shown


def test_bad_input_is_refused():
    assert_refused(lambda: explore.calculator_table("gpt-9"), ValueError, "model", "gpt-9", "one of")
    assert_refused(lambda: explore.calculator(static="yes"), TypeError, "static", "yes", "True or False")
    assert_refused(lambda: explore.calculator(tokens=0), ValueError, "tokens", 0, "positive")
    assert_refused(lambda: explore.calculator(static=True, memory_gb=-1), ValueError, "memory_gb", -1, "> 0")
    assert_refused(lambda: explore.choose("llama-2-7b", 0), ValueError, "memory_gb", 0, "> 0")
    assert_refused(lambda: explore.ceiling("llama-2-7b", "adapters"), ValueError, "method", "adapters", "one of")
