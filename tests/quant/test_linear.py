"""QuantLinear's two paths against F.linear on the dequantized weight; QuantEmbedding against a lookup."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.quant import QuantLinear, quantize
from labkit.quant.linear import QuantEmbedding
from labkit.quant.linear import int4_kernel_available, to_int4pack

from ..refusals import assert_refused

needs_kernel = pytest.mark.skipif(not int4_kernel_available(), reason="no INT4 CPU kernel in this torch")


def linear(out, inp, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(inp, out, bias=bias)


@pytest.mark.parametrize("bits, group, scheme, tile", [
    (4, 32, "asym", 256), (4, 32, "sym", 64), (4, "channel", "asym", 30), (8, 16, "asym", 64),
    (3, "tensor", "sym", 256), (4, 8, "asym", 2), (4, 32, "asym", 48), (8, "channel", "sym", 64)])
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
@pytest.mark.parametrize("group, scheme", [(32, "asym"), (64, "sym"), ("channel", "asym"),
                                           ("tensor", "asym"), (512, "asym")])
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


def test_weight_tiles_are_columns_of_the_dequantized_weight():
    lin = linear(8, 96)
    for group, bits in ((32, 4), (16, 8), ("channel", 4), ("tensor", 4)):
        q = quantize(lin.weight.detach(), bits, "asym", group)
        ql, full = QuantLinear(q, backend="reference"), q.dequantize()
        for k0, k1 in ((0, 96), (32, 64), (2, 40), (94, 96)):
            assert torch.equal(ql.weight_tile(k0, k1), full[:, k0:k1])
    with pytest.raises(ValueError, match="k0 and k1 must be even for packed 4-bit codes, got k0=1, k1=4"):
        QuantLinear(quantize(lin.weight.detach())).weight_tile(1, 4)
    with pytest.raises(ValueError, match=r"k1 must be an int in \[33, 96\], got 32"):
        ql.weight_tile(32, 32)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear, got Conv1d"):
        QuantLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="qweight must be a labkit.quant.QTensor"):
        QuantLinear(torch.zeros(2, 2))
    q = quantize(linear(16, 64).weight.detach())
    with pytest.raises(ValueError, match="tile must be an even int >= 2, got 3"):
        QuantLinear(q, tile=3)
    with pytest.raises(TypeError, match="tile must be an int >= 2, got 256.0"):
        QuantLinear(q, tile=256.0)
    with pytest.raises(ValueError, match=r"bias must have shape \(16,\), got \(8,\)"):
        QuantLinear(q, torch.zeros(8))
    with pytest.raises(TypeError, match="bits must be one of"):
        QuantLinear.from_linear(linear(16, 64), bits="4")
    ql = QuantLinear.from_linear(linear(16, 64))
    with pytest.raises(ValueError, match="backend must be one of"):
        ql.backend = "gpu"
    with pytest.raises(TypeError, match="backend must be one of"):
        ql.backend = None
    with pytest.raises(ValueError, match=r"x must end in 64 features, got shape \(2, 32\)"):
        ql(torch.randn(2, 32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        ql([1.0] * 64)
    with pytest.raises(ValueError, match=r"inner_k_tiles must be one of \(2, 4, 8\), got 3"):
        to_int4pack(q, inner_k_tiles=3)
    assert ql(torch.randn(2, 64)).shape == (2, 16) and ql.backend == "auto"  # unchanged by the refusals


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool, torch.cfloat])
def test_inputs_that_are_not_real_floats_are_refused_on_every_path(dtype):
    # an integer x would be multiplied in integers (the weights truncated): refused, as nn.Linear refuses it
    q = quantize(linear(16, 64).weight.detach())
    x = torch.ones(2, 64, dtype=dtype)
    for backend in ("reference", "auto"):
        ql = QuantLinear(q, backend=backend)
        calls = [lambda: ql(x), lambda: ql.forward_reference(x)]
        calls += [lambda: ql.forward_int4pack(x)] if ql.int4pack is not None else []
        for call in calls:
            assert_refused(call, TypeError, "x", dtype, "a floating-point tensor")
    assert_refused(lambda: QuantLinear(q, torch.zeros(16, dtype=torch.long)), TypeError, "bias", torch.long,
                   "a floating-point tensor or None")


def test_the_kernel_path_refuses_a_layer_it_cannot_run():
    ql = QuantLinear(quantize(linear(16, 64).weight.detach(), 8), backend="reference")  # 8 bits: no INT4 kernel
    with pytest.raises(ValueError, match="forward_int4pack needs torch's INT4 kernel"):
        ql.forward_int4pack(torch.randn(1, 64))


def test_quantized_embedding_dequantizes_only_the_rows_it_reads():
    w = torch.randn(50, 32, generator=torch.Generator().manual_seed(4))
    q = quantize(w, 8, "asym", 16)
    emb = QuantEmbedding(q)
    tokens = torch.tensor([[1, 49, 1], [0, 7, 3]])
    assert torch.equal(emb(tokens), F.embedding(tokens, q.dequantize()))
    assert torch.equal(emb.qweight.codes, q.codes)
    with pytest.raises(ValueError, match=r"rows must be in \[0, 49\], got values in \[0, 50\]"):
        emb(torch.tensor([0, 50]))
    with pytest.raises(TypeError, match="qweight must be a labkit.quant.QTensor"):
        QuantEmbedding(w)
