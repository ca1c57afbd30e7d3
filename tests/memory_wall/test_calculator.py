import pytest

from labkit import specs
from labkit.memory_wall import calculator, footprint

from ..refusals import assert_refused


def test_report_states_the_footprint_and_the_ceiling():
    text = calculator.report("llama-2-70b", "fp16", 1, 4096, "h100-sxm")
    f = footprint.footprint(specs.model("llama-2-70b"), "fp16", 1, 4096)
    assert f"{f['weights'] / 1e9:,.1f} GB" in text  # 138.0 GB of weights
    assert "fits on 2 x h100-sxm" in text           # 80 GB each
    assert "24.1 tokens/s per sequence" in text     # 3.35e12 / (137.95e9 - 0.52e9 unread embeddings + 1.34e9)


def test_static_fallback_prints_the_report(capsys):
    assert calculator.calculator(static=True, model="llama-3-8b", batch=4) is None
    assert capsys.readouterr().out.strip() == calculator.report("llama-3-8b", batch=4)


def test_widgets_are_built_for_every_setting():
    ui = calculator.calculator(model="mixtral-8x7b")
    names = {c.description for c in ui.children[:-1]}
    assert names == {"model", "precision", "batch", "context", "device"}


@pytest.mark.parametrize("kwargs,error,name,value,expected", [
    ({"device": "pcie4-x16"}, ValueError, "device", "pcie4-x16", "a memory device, not a link: one of ('h100-sxm'"),
    ({"device": "h100"}, ValueError, "name", "h100", "one of ("),
    ({"model": "gpt-5"}, ValueError, "name", "gpt-5", "one of ("),
    ({"model": None}, TypeError, "name", None, "one of ("),
    ({"precision": "int3"}, ValueError, "precision", "int3", "one of ['fp32'"),
    ({"batch": 0}, ValueError, "batch", 0, "a positive int"),
    ({"context": 4096.0}, TypeError, "context", 4096.0, "a positive int"),
])
def test_report_refuses_bad_settings(kwargs, error, name, value, expected):
    assert_refused(lambda: calculator.report(**kwargs), error, name, value, expected)


def test_the_calculator_refuses_unknown_and_bad_settings_before_building_anything(capsys):
    assert_refused(lambda: calculator.calculator(modle="llama-2-7b"), TypeError, "settings", {"modle": "llama-2-7b"},
                   "keyword arguments among ['model', 'precision', 'batch', 'context', 'device'] (unknown: ['modle'])")
    assert_refused(lambda: calculator.calculator(batch=-1), ValueError, "batch", -1, "a positive int")
    assert_refused(lambda: calculator.calculator(static="yes"), TypeError, "static", "yes", "True or False")
    assert capsys.readouterr().out == ""


def test_fits_on_counts_devices_as_footprint_does():
    for model, precision, batch, context, device in [("llama-2-70b", "bf16", 1, 4096, "h100-sxm"),
                                                     ("llama-3-70b", "int4-g32 sym (Q4_0)", 8, 8192, "h200"),
                                                     ("gpt3-175b", "fp16", 4, 2048, "a100-80gb")]:
        n = footprint.devices_needed(specs.model(model), precision, batch, context, specs.device(device).memory_bytes)
        assert f"fits on {n} x {device}" in calculator.report(model, precision, batch, context, device)


def test_report_warns_beyond_the_trained_context():
    assert "trained for 2,048 tokens" in calculator.report("gpt3-175b", context=8192)
    assert "trained for" not in calculator.report("gpt3-175b", context=2048)
