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


@pytest.mark.parametrize("model,precision,batch,context,device,n", [
    # by hand: Llama-2-7B BF16 weights 13.48 GB + 32 x 4,096 tokens x 512 KiB of KV cache = 82.2 GB > 80 GB
    ("llama-2-7b", "bf16", 32, 4096, "h100-sxm", 2),
    # Llama-3-8B BF16 16.06 GB + 64 x 8,192 x 128 KiB = 68.7 GB of KV cache: 84.8 GB on 24 GB cards
    ("llama-3-8b", "bf16", 64, 8192, "rtx-4090", 4),
    ("llama-2-7b", "bf16", 1, 4096, "h100-sxm", 1),
])
def test_fits_on_counts_the_kv_cache_too(model, precision, batch, context, device, n):
    m, memory = specs.model(model), specs.device(device).memory_bytes
    by_hand = -(-(m.n_params * 2 + batch * context * 2 * m.n_layers * m.n_kv_heads * m.head_dim * 2) // memory)
    assert by_hand == n
    assert f"fits on {n} x {device}" in calculator.report(model, precision, batch, context, device)
