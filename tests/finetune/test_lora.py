"""LoRA and QLoRA: the merged weight equals W + (alpha / r) B A computed in float64, unmerge gives W back, the
adapter's gradients equal those of the full model restricted to the low-rank directions (autograd on a dense
re-parametrization), the 4-bit bases equal lab 03's dequantization, and bad input is refused."""
import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.finetune import lora
from labkit.quant import quantize
from labkit.quant.nf4 import dequantize_nf4, quantize_nf4
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused

CFG = TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)


def _model(seed=0):
    torch.manual_seed(seed)
    return TinyLM(CFG)


def _trained_adapters(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    for m in lora.lora_layers(model).values():
        m.B.data = torch.randn(m.B.shape, generator=g) * 0.1
    return model


@settings(max_examples=15, deadline=None)
@given(rank=st.integers(1, 8), alpha=st.floats(0.5, 64), seed=st.integers(0, 100))
def test_merge_is_w_plus_scaled_ba_and_unmerge_restores(rank, alpha, seed):
    lin = nn.Linear(16, 24, bias=False)
    torch.manual_seed(seed)
    m = lora.LoRALinear(lin, rank, alpha, seed=seed)
    m.B.data = torch.randn(24, rank)
    w0 = lin.weight.detach().clone()
    x = torch.randn(5, 16)
    before = m(x)
    m.merge()
    expected = (w0.double() + m.B.detach().double() @ m.A.detach().double() * (alpha / rank)).float()
    assert torch.equal(m.base.w, expected)
    assert torch.allclose(m(x), before, atol=1e-5)
    merged = m.base.w.clone()
    m.unmerge()  # exact up to one float32 rounding of the merged weight: |error| <= eps / 2 * |W'| per element
    assert ((m.base.w - w0).abs() <= torch.finfo(torch.float32).eps * merged.abs() + 1e-12).all()


def test_lora_gradients_are_the_full_gradient_restricted_to_the_low_rank_directions():
    model = _trained_adapters(lora.add_lora(_model(), rank=4, alpha=8.0))
    tokens = torch.randint(0, CFG.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    model(tokens).logsumexp(-1).mean().backward()
    # the dense re-parametrization: the same model with W' = W + s B A as a plain weight that requires grad
    dense = _model()
    layers = lora.lora_layers(model)
    for path, m in layers.items():
        dense.get_submodule(path).weight.data = (m.base.w.double() + m.delta()).float()
    dense(tokens).logsumexp(-1).mean().backward()
    for path, m in layers.items():
        G = dense.get_submodule(path).weight.grad.double()  # dL/dW' of the full model [out, in]
        s = m.scale
        assert torch.allclose(m.B.grad.double(), s * G @ m.A.detach().double().T, atol=1e-6)  # dL/dB = s G A^T
        assert torch.allclose(m.A.grad.double(), s * m.B.detach().double().T @ G, atol=1e-6)  # dL/dA = s B^T G
    assert all(not p.requires_grad for n, p in model.named_parameters() if not n.endswith((".A", ".B")))


def test_a_fresh_adapter_leaves_the_model_unchanged_and_counts_its_parameters():
    base = _model()
    model = lora.add_lora(copy.deepcopy(base), rank=2, alpha=4.0, targets=("mlp", "layers.0.attn.wq"))
    tokens = torch.randint(0, CFG.vocab_size, (2, 8))
    assert torch.equal(model(tokens), base(tokens))
    expected = sum(2 * (o + i) for o, i in [(64, 32)] * 2 * CFG.n_layers + [(32, 64)] * CFG.n_layers + [(32, 32)])
    assert lora.trainable_params(model) == expected
    assert sorted(lora.lora_layers(model)) == sorted(lora.lora_targets(base, ("mlp", "layers.0.attn.wq")))


def test_nf4_and_int4_bases_equal_lab_03s_dequantization_and_backward_uses_them():
    w = torch.randn(24, 32) * 0.05
    nf4 = lora.FrozenBase(w, "nf4")
    codes, absmax = quantize_nf4(w.reshape(-1).numpy())
    assert torch.equal(nf4.weight(), torch.from_numpy(dequantize_nf4(codes, absmax)).reshape(24, 32))
    assert torch.equal(lora.FrozenBase(w, "int4").weight(), quantize(w, 4, "asym", 32).dequantize())
    assert nf4.nbytes() == 24 * 32 // 2 + 4 * (24 * 32 // 64)
    x = torch.randn(5, 32, requires_grad=True)
    nf4(x).square().sum().backward()
    x2 = x.detach().clone().requires_grad_()
    (x2 @ nf4.weight().T).square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-6)


def test_merge_refuses_a_quantized_base():
    m = lora.LoRALinear(nn.Linear(128, 128, bias=False), 4, 8.0, base_dtype="nf4")
    with pytest.raises(ValueError, match="FP32 base"):
        m.merge()


def test_bad_input_is_refused_and_the_model_is_untouched():
    model = _model()
    state = copy.deepcopy(model.state_dict())
    assert_refused(lambda: lora.add_lora(model, rank=0), ValueError, "rank", 0, "positive")
    assert_refused(lambda: lora.add_lora(model, alpha=float("nan")), ValueError, "alpha", float("nan"), "finite")
    assert_refused(lambda: lora.add_lora(model, targets=("layers.9.attn.wq",)), ValueError, "targets",
                   "layers.9.attn.wq", "linear")
    assert_refused(lambda: lora.add_lora(model, base_dtype="fp8"), ValueError, "base_dtype", "fp8", "one of")
    assert_refused(lambda: lora.add_lora(model, rank=33), ValueError, "rank", 33, "at most")
    assert all(isinstance(m, nn.Linear) for _, m in model.named_modules() if "attn.w" in _ or "mlp.w" in _)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
    np.testing.assert_equal(lora.trainable_params(lora.add_lora(model, rank=1, targets=("attention",))) > 0, True)


def test_a_layer_type_that_matches_no_linear_is_refused_and_the_model_is_untouched():
    """A tied model's lm_head is the embedding's matrix: targets=("head",) names nothing to adapt."""
    torch.manual_seed(0)
    tied = TinyLM(dataclasses.replace(CFG, tie_embeddings=True))
    assert_refused(lambda: lora.add_lora(tied, targets=("head",)), ValueError, "targets", "head", "a layer type with a")
    assert_refused(lambda: lora.add_lora(tied, targets=("mlp", "head")), ValueError, "targets", "head", "linear")
    assert all(p.requires_grad for p in tied.parameters()) and not lora.lora_layers(tied)
    untied = TinyLM(dataclasses.replace(CFG, tie_embeddings=False))
    assert list(lora.lora_layers(lora.add_lora(untied, targets=("head",)))) == ["lm_head"]


def test_a_is_initialised_as_peft_does_and_each_adapter_draws_its_own():
    """A ~ U(-b, b) with b = 1 / sqrt(in): kaiming_uniform_(a=sqrt(5)), nn.Linear's and PEFT's lora_A init; each
    adapter from its own seed (seed + its index), so no two adapters of one shape start equal."""
    model = lora.add_lora(_model(), rank=8, alpha=16.0, seed=5)
    layers = lora.lora_layers(model)
    for m in layers.values():
        in_f = m.A.shape[1]
        bound = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5)) * math.sqrt(3 / in_f)
        a = m.A.detach()
        assert a.abs().max() <= bound * (1 + 1e-6) and a.abs().max() >= 0.9 * bound  # 8 x in draws reach the edge
        assert a.std() == pytest.approx(bound / math.sqrt(3), rel=0.2) and torch.equal(m.B, torch.zeros_like(m.B))
    a_s = [m.A.detach() for m in layers.values()]
    assert all(not torch.equal(a, b) for i, a in enumerate(a_s) for b in a_s[i + 1:] if a.shape == b.shape)
    again = lora.lora_layers(lora.add_lora(_model(), rank=8, alpha=16.0, seed=5))
    assert all(torch.equal(m.A, again[p].A) for p, m in layers.items())  # the seed fixes them
    other = lora.lora_layers(lora.add_lora(_model(), rank=8, alpha=16.0, seed=6))
    assert all(not torch.equal(m.A, other[p].A) for p, m in layers.items())


def test_lora_linear_refuses_the_wrong_width_or_dtype_and_frozen_base_names_its_weight():
    m = lora.LoRALinear(nn.Linear(32, 16, bias=False), 4, 8.0)
    assert_refused(lambda: m(torch.randn(3, 31)), ValueError, "x", "torch.float32 (3, 31)", "[..., 32]")
    assert_refused(lambda: m(torch.randn(3, 32, dtype=torch.float64)), ValueError, "x", "torch.float64 (3, 32)",
                   "torch.float32 tensor")
    assert_refused(lambda: m([1.0] * 4), TypeError, "x", [1.0] * 4, "Tensor")
    w = torch.randn(16, 128)
    w[3, 5] = float("nan")
    for dtype in lora.BASE_DTYPES:
        assert_refused(lambda: lora.FrozenBase(w, dtype), ValueError, "weight", "1 NaN or inf of 2048 values", "finite")
    assert_refused(lambda: lora.FrozenBase(torch.zeros(0, 128), "nf4"), ValueError, "weight", "torch.float32 (0, 128)",
                   "out, in >= 1")
