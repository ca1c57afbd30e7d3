"""labkit.day0.operators: QK-norm against torch's own RMSNorm, and the refusal of a missing operator."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from labkit.day0 import (BASELINE_OPERATORS, TinyVLM, UnsupportedOperatorError, register_operator, required_operators,
                         small_config)
from labkit.day0.operators import OPERATORS, check_operators, qk_norm


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 4), t=st.integers(1, 5), hd=st.sampled_from([2, 8, 32]),
       seed=st.integers(0, 1000))
def test_qk_norm_is_torch_rms_norm_over_the_head(b, h, t, hd, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(b, h, t, hd, generator=g) * 3, torch.randn(hd, generator=g)
    torch.testing.assert_close(qk_norm(x, w, 1e-5), F.rms_norm(x, (hd,), w, 1e-5), rtol=1e-5, atol=1e-6)


def test_the_baseline_runtime_refuses_tinyvlm_naming_the_operator_and_field():
    with pytest.raises(UnsupportedOperatorError, match=r"'qk_norm'.*text_config\.qk_norm"):
        TinyVLM(small_config(), BASELINE_OPERATORS)
    assert "qk_norm" not in BASELINE_OPERATORS and "qk_norm" in OPERATORS


def test_the_decoder_built_alone_refuses_too():
    from labkit.day0.model import LanguageModel
    with pytest.raises(UnsupportedOperatorError, match=r"'qk_norm'.*text_config\.qk_norm"):
        LanguageModel(small_config().text_config, BASELINE_OPERATORS)


def test_qk_norm_computes_in_fp32_and_returns_the_input_dtype():
    x, w = torch.randn(1, 2, 3, 16).bfloat16(), torch.rand(16).bfloat16() + 0.5
    got = qk_norm(x, w, 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.rms_norm(x.float(), (16,), w.float(), 1e-5).bfloat16())


def test_a_model_without_qk_norm_runs_on_the_baseline():
    cfg = small_config(qk_norm=False)
    assert "qk_norm" not in required_operators(cfg)
    TinyVLM(cfg, BASELINE_OPERATORS)


def test_register_operator_returns_a_new_table_the_model_uses():
    calls = []

    def mine(x, w, eps):
        calls.append(x.shape)
        return qk_norm(x, w, eps)
    ops = register_operator("qk_norm", mine, BASELINE_OPERATORS)
    assert "qk_norm" not in BASELINE_OPERATORS
    model = TinyVLM(small_config(), ops)
    model.language_model(torch.tensor([[1, 2, 3]]))
    assert len(calls) == 2 * small_config().text_config.n_layers  # q and k of every layer


def test_bad_tables_and_functions():
    with pytest.raises(TypeError, match="operators"):
        check_operators(small_config(), ["qk_norm"])
    with pytest.raises(TypeError, match="fn"):
        register_operator("qk_norm", 3, BASELINE_OPERATORS)
