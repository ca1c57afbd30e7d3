"""QuantLinear's two paths against F.linear on the dequantized weight, and quantize_model's policies."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.rng import Rng
from labkit.tinylm import ByteTokenizer
from labkit.tinylm import corpus as data
from labkit.tinylm import perplexity
from labkit.quant import QTensor, QuantLinear, quantize, quantize_model
from labkit.quant.linear import int4_kernel_available, to_int4pack

needs_kernel = pytest.mark.skipif(not int4_kernel_available(), reason="no INT4 CPU kernel in this torch")


def linear(out, inp, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(inp, out, bias=bias)


@pytest.mark.parametrize("bits, group, scheme, tile", [(4, 32, "asym", 256), (4, 32, "sym", 64), (4, "channel", "asym", 30),
                                                       (8, 16, "asym", 64), (3, "tensor", "sym", 256), (4, 8, "asym", 2),
                                                       (4, 32, "asym", 48), (8, "channel", "sym", 64)])
def test_reference_path_equals_linear_on_the_dequantized_weight(bits, group, scheme, tile):
    lin = linear(24, 96)
    q = quantize(lin.weight.detach(), bits, scheme, group)
    ql = QuantLinear(q, lin.bias, backend="reference", tile=tile)
    x = torch.randn(3, 5, 96)
    expected = F.linear(x.double(), q.dequantize().double(), lin.bias.detach().double())
    assert torch.allclose(ql(x).double(), expected, atol=1e-5)
    assert ql.path(x) == "reference"


def test_four_bit_codes_are_stored_packed_and_odd_widths_unpacked():
    lin = linear(16, 64)
    ql = QuantLinear.from_linear(lin)
    assert ql.codes.shape == (16, 32) and ql.codes.dtype == torch.uint8
    assert torch.equal(ql.qweight.codes, quantize(lin.weight.detach()).codes)
    assert set(dict(ql.named_buffers())) >= {"codes", "scale", "zero", "bias"}
    assert QuantLinear.from_linear(linear(16, 63), group_size="channel").codes.dtype == torch.int8


@needs_kernel
@pytest.mark.parametrize("group, scheme", [(32, "asym"), (64, "sym"), ("channel", "asym"), ("tensor", "asym"), (512, "asym")])
def test_int4pack_conversion_is_exact(group, scheme):
    # With FP32 activations and FP32 scales the kernel has no BF16 rounding: it must agree with the
    # reference path to float32 accuracy, which checks q = code + 8 and zero = -zero_point * scale.
    lin = linear(32, 1024, bias=False)
    q = quantize(lin.weight.detach() + 0.03, 4, scheme, group)
    packed, sz, g = to_int4pack(q)
    assert sz.shape == (1024 // g, 32, 2) and g in (32, 64, 128, 256)
    x = torch.randn(4, 1024)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, g, sz)
    expected = x.double() @ q.dequantize().double().T
    assert torch.allclose(y.double(), expected, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_fast_path_agrees_with_the_reference_within_bf16_rounding():
    lin = linear(64, 256)
    ql = QuantLinear.from_linear(lin, 4, 32, "asym")
    x = torch.randn(2, 7, 256)
    assert ql.path(x) == "int4pack"
    fast, ref = ql(x), ql.forward_reference(x) + ql.bias
    assert fast.dtype == torch.float32 and fast.shape == (2, 7, 64)
    # BF16 keeps 8 significant bits: activations, scales and outputs are each rounded once
    assert (fast - ref).abs().max() < 0.02 * ref.abs().max()
    assert (fast - ref).abs().max() > 0  # it really is another path


def test_fallback_when_the_kernel_does_not_fit():
    x = torch.randn(1, 64)
    for ql in (QuantLinear.from_linear(linear(24, 64)),                  # out not a multiple of 16
               QuantLinear.from_linear(linear(32, 64), bits=8),          # not 4 bits
               QuantLinear.from_linear(linear(32, 64), group_size=16)):  # groups finer than the kernel's 32
        assert ql.int4pack is None and ql.path(x) == "reference"
        before = ql.backend
        with pytest.raises(ValueError, match="backend 'int4pack' is not available"):
            ql.backend = "int4pack"
        assert ql.backend == before and ql(x).shape == (1, ql.out_features)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear, got Conv1d"):
        QuantLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="qweight must be a labkit.quant.QTensor"):
        QuantLinear(torch.zeros(2, 2))
    ql = QuantLinear.from_linear(linear(16, 64))
    with pytest.raises(ValueError, match="backend must be one of"):
        ql.backend = "gpu"
    with pytest.raises(ValueError, match=r"x must end in 64 features, got shape \(2, 32\)"):
        ql(torch.randn(2, 32))
    assert ql(torch.randn(2, 64)).shape == (2, 16)


# --- whole model ------------------------------------------------------------------------------------

def test_policy_errors_name_the_problem(pretrained):
    model, _ = pretrained
    with pytest.raises(ValueError, match="policy key 'ffn' is not a layer type"):
        quantize_model(model, {"ffn": "int4"})
    with pytest.raises(ValueError, match=r"policy\['mlp'\] = 'int2'"):
        quantize_model(model, {"mlp": "int2"})
    with pytest.raises(ValueError, match="norm weights stay floating point"):
        quantize_model(model, {"norm": "int8"})
    with pytest.raises(TypeError, match="policy must be a dict"):
        quantize_model(model, "int4")
    with pytest.raises(ValueError, match="backend must be one of"):
        quantize_model(model, {}, backend="cuda")
    with pytest.raises(ValueError, match="scheme must be 'asym' or 'sym', got 'nf4'"):
        quantize_model(model, {}, scheme="nf4")
    with pytest.raises(TypeError, match="model must be a TinyLM, got Linear"):
        quantize_model(nn.Linear(2, 2), {})


def test_mixed_policy_report_and_modules(pretrained):
    model, _ = pretrained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    qm, report = quantize_model(model, {"embedding": "int8", "attention": "fp16", "mlp": "int4"})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # input model untouched
    assert isinstance(qm.layers[0].mlp.w_up, QuantLinear) and qm.layers[0].mlp.w_up.bits == 4
    assert isinstance(qm.layers[0].attn.wq, nn.Linear)
    assert torch.equal(qm.layers[0].attn.wq.weight, model.layers[0].attn.wq.weight.half().float())
    assert qm.lm_head.scale is qm.tok_emb.scale  # tied: one quantized matrix
    assert torch.equal(qm.lm_head.qweight.codes, qm.tok_emb.codes)
    cfg = model.cfg
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["layers.0.mlp.w_up"]["bytes"] == 384 * 128 // 2 + 384 * 4 * 4
    assert rows["layers.0.attn.wk"]["bytes"] == 2 * 64 * 128
    assert rows["tok_emb"]["bytes"] == 256 * 128 + 256 * 4 * 4 and "lm_head" not in rows
    assert sum(r["params"] for r in report["layers"]) == sum(p.numel() for p in model.parameters())
    assert report["fp32_bytes"] == 4 * 820_352
    assert report["compression"] == pytest.approx(report["fp32_bytes"] / report["bytes"])
    tokens = torch.tensor([list(b"The old sailor")])
    emb = qm.tok_emb(tokens)
    assert torch.equal(emb, qm.tok_emb.qweight.dequantize()[tokens])
    assert qm(tokens).shape == (1, 14, cfg.vocab_size)


def test_fp32_policy_changes_nothing_and_int8_barely_moves_perplexity(pretrained):
    model, _ = pretrained
    tokens = torch.tensor([list(b"copy ab3 -> ab3\n12+30=42\n")])
    same, report = quantize_model(model, {})
    assert torch.equal(same(tokens), model(tokens)) and report["compression"] == 1.0
    text = data.corpus("test", 2048)
    p32 = perplexity(model, text)
    p8 = perplexity(quantize_model(model, {"embedding": "int8", "attention": "int8", "mlp": "int8"})[0], text)
    assert abs(p8 - p32) < 0.01 * p32


def test_gptq_tensors_replace_round_to_nearest(pretrained):
    model, _ = pretrained
    w = model.layers[0].mlp.w_up.weight.detach()
    custom = QTensor(torch.zeros_like(w, dtype=torch.int8), torch.ones(384, 4), torch.zeros(384, 4, dtype=torch.int32),
                     4, 32, "asym", (384, 128))
    qm, _ = quantize_model(model, {"mlp": "int4"}, qtensors={"layers.0.mlp.w_up": custom})
    used = qm.layers[0].mlp.w_up.qweight
    assert torch.equal(used.codes, custom.codes) and used.scale is custom.scale
    with pytest.raises(ValueError, match=r"qtensors\['layers.0.mlp.w_up'\] must be a 8-bit QTensor"):
        quantize_model(model, {"mlp": "int8"}, qtensors={"layers.0.mlp.w_up": custom})
