import pytest

from labkit import specs
from labkit.memory_wall import calculator, footprint


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


@pytest.mark.parametrize("kwargs,match", [({"device": "pcie4-x16"}, "link"), ({"model": "gpt-5"}, "name must"),
                                          ({"batch": 0}, "batch")])
def test_report_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        calculator.report(**kwargs)


def test_report_warns_beyond_the_trained_context():
    assert "trained for 2,048 tokens" in calculator.report("gpt3-175b", context=8192)
    assert "trained for" not in calculator.report("gpt3-175b", context=2048)
