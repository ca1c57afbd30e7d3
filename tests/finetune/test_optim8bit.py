"""Blockwise 8-bit states: the codebooks, the quantizer against a brute-force nearest level, AdamW8bit with FP32
states against torch.optim.AdamW, the 8-bit run against the FP32 run, and refusals."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.finetune import optim8bit as o8
from tests.refusals import assert_refused


def test_codebooks_are_sorted_hold_0_and_1_and_fit_a_byte():
    for signed, size in ((True, 255), (False, 256)):
        code = o8.CODEBOOKS[signed]
        assert code.numel() == size and (code[1:] > code[:-1]).all() and 0.0 in code and code.max() == 1.0
        assert (code.min() == -1.0) == signed
    pos = o8.CODEBOOKS[False][1:]
    assert 0 < pos.min() <= 1.01e-7 and pos[2] <= 1.01e-6  # eight decades below 1 are covered


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 600), block=st.sampled_from([4, 64, 256]), seed=st.integers(0, 10_000), signed=st.booleans())
def test_quantizer_picks_the_nearest_level_of_each_blocks_absmax(n, block, seed, signed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-5, 2, (n,), generator=g).float()
    x = x if signed else x.abs()
    code = o8.CODEBOOKS[signed]
    codes, absmax = o8.quantize_blockwise(x, code, block)
    for b in range(absmax.numel()):  # brute force, block by block
        part = x[b * block:(b + 1) * block]
        assert absmax[b] == part.abs().max()
        scaled = part / (absmax[b] if absmax[b] > 0 else 1)
        dist = (scaled[:, None] - code[None, :]).abs()
        best = dist.min(dim=1).values
        got = dist[torch.arange(part.numel()), codes[b * block:(b + 1) * block].long()]
        assert torch.allclose(got, best, atol=1e-7)
    back = o8.dequantize_blockwise(codes, absmax, code, block)
    assert back.shape == x.shape and (back == 0).sum() >= (x == 0).sum()


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(300, generator=g)), torch.nn.Parameter(torch.randn(7, 5, generator=g))]


def _run(opt_cls, params, steps=20, **kw):
    opt = opt_cls(params, lr=1e-2, weight_decay=0.1, **kw)
    losses = []
    for t in range(steps):
        loss = sum((p - 0.5).square().sum() * (i + 1) for i, p in enumerate(params))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, opt


def test_fp32_states_are_torchs_adamw_and_8bit_states_follow_within_a_band():
    ref, ref_opt = _run(torch.optim.AdamW, p_ref := _params(), eps=1e-8)
    ours, _ = _run(o8.AdamW8bit, p_ours := _params(), state_dtype="fp32")
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p_ref, p_ours))
    eight, opt8 = _run(o8.AdamW8bit, p8 := _params(), state_dtype="int8")
    assert max(abs(a - b) / a for a, b in zip(ref, eight)) < 0.02
    moved = max((a - b).abs().max() for a, b in zip(p_ref, _params()))  # how far AdamW moved the parameters
    assert all((a - b).abs().max() < 0.1 * moved for a, b in zip(p_ref, p8))
    assert opt8.state_bytes() == 2 * 335 + 4 * 2 * (2 + 1)  # a byte per value of m and v, an absmax per block
    assert o8.state_bytes_per_param("int8") == 2 + 8 / 256 and o8.state_bytes_per_param("fp32") == 8


def test_bad_input_is_refused():
    assert_refused(lambda: o8.AdamW8bit(_params(), state_dtype="fp16"), ValueError, "state_dtype", "fp16", "int8")
    assert_refused(lambda: o8.AdamW8bit(_params(), lr=float("nan")), ValueError, "lr", float("nan"), "finite")
    assert_refused(lambda: o8.quantize_blockwise(torch.ones(3, dtype=torch.int64), o8.CODEBOOKS[True]), ValueError,
                   "x", torch.int64, "float")
    with pytest.raises(ValueError, match="block"):
        o8.quantize_blockwise(torch.ones(3), o8.CODEBOOKS[True], 0)
