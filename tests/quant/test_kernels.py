"""The INT4 GEMV ladder (labkit.quant.kernels): rungs 1-4 equal x @ w_hat.T computed in float64 from the
dequantized weight (an independent reference: QTensor.dequantize and torch's matmul), on random shapes,
group sizes and K not a multiple of a tile or of a task's rows; rung 5 equal to the same product with x
replaced by its int8 blocks, and within int8's error of the exact one; the compiled loops equal their
plain-Python selves; the thread count is honoured and restored; bad x and w are refused. Rungs 6 and 7 (C) take
groups of a multiple of 8 inputs and refuse others by name (tests/quant/test_kernels_c.py: their build); rung 7
is held to rung 5's reference."""
import numba
import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.quant import kernels as kk
from labkit.quant import kernels_jit as kj
from labkit.quant.qtensor import quantize

from ..refusals import assert_refused


def exact(x: torch.Tensor, q) -> torch.Tensor:
    """x @ w_hat.T in float64 (the reference every exact rung is held to)."""
    return (x.double() @ q.dequantize().double().T).float()


def runs(name: str, w) -> bool:
    """Whether rung `name` takes weight w (rungs 6-7 need a C compiler and groups of a multiple of 8 inputs)."""
    return name not in kk.C_RUNGS or (kk.available(name)[0] and kk._weight(w).lanes is not None)


def close(y, ref, k):
    # float32 sums of k terms in another order: relative error ~ k * 2**-24 of the sum of |terms|
    return torch.allclose(y, ref, rtol=1e-4, atol=1e-5 * k ** 0.5)


def layer(n, k, group, scheme="asym", seed=0, shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    q = quantize(torch.randn(n, k, generator=gen) + shift, 4, scheme, group)
    return q, torch.randn(1, k, generator=gen)


@pytest.mark.parametrize("name", kk.EXACT)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_exact_rungs_match_the_dequantized_product(name, group):
    # K = 3 groups: not a multiple of rung 2's 256-column tile; N = 40: not a multiple of ROWS_PER_TASK
    q, x = layer(40, 3 * group, group)
    if not runs(name, q):
        pytest.skip(f"{name} does not run here: {kk.available(name)[1]}")
    assert close(kk.RUNGS[name](x, q), exact(x, q), 3 * group)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), groups=st.integers(1, 6), group=st.sampled_from([2, 8, 16, 32, 48, 64, 128]),
       m=st.integers(1, 3), scheme=st.sampled_from(["asym", "sym"]), seed=st.integers(0, 2**16),
       shift=st.floats(-2, 2))
def test_random_shapes(n, groups, group, m, scheme, seed, shift):
    q, _ = layer(n, groups * group, group, scheme, seed, shift)
    x = torch.randn(m, groups * group, generator=torch.Generator().manual_seed(seed + 1))
    w = kk.pack_weight(q)
    ref = exact(x, q)
    for name in kk.EXACT:
        if runs(name, w):
            assert close(kk.RUNGS[name](x, w), ref, groups * group), name
        elif name in kk.C_RUNGS and kk.available(name)[0]:
            assert_refused(lambda: kk.RUNGS[name](x, w), ValueError, "w", w, "a multiple of 8 inputs")
    for name in filter(lambda name: runs(name, w), kk.APPROXIMATE):
        assert close(kk.RUNGS[name](x, w), int8_exact(x, q, kk.x_block(group)), groups * group), name


@pytest.mark.parametrize("group_size", ["channel", "tensor"])
def test_channel_and_tensor_groups(group_size):
    for k in (100, 128):  # 100 inputs: rung 5 uses blocks of gcd(100, 32) = 4, rung 6 refuses (not 8 * j)
        q, x = layer(17, k, group_size)
        for name in filter(lambda name: runs(name, q), kk.EXACT):
            assert close(kk.RUNGS[name](x, q), exact(x, q), k), name


def test_one_d_input_gives_one_d_output():
    q, x = layer(8, 64, 32)
    for name, rung in kk.RUNGS.items():
        if not runs(name, q):
            continue
        y = rung(x[0], q)
        assert y.shape == (8,) and y.dtype == torch.float32


def int8_exact(x: torch.Tensor, q, block: int) -> torch.Tensor:
    """x's int8 blocks, dequantized, times w_hat in float64: what rung 5 computes, up to float rounding."""
    xq, scale = kk.quantize_activations(x, block)
    x_hat = (xq.double().reshape(x.shape[0], -1, block) * scale.double()[..., None]).reshape(x.shape)
    return (x_hat @ q.dequantize().double().T).float()


@pytest.mark.parametrize("name", kk.APPROXIMATE)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_integer_rungs(name, group):
    q, x = layer(64, 4 * group, group, seed=group)
    if not runs(name, q):
        pytest.skip(f"{name} does not run here: {kk.available(name)[1]}")
    y = kk.RUNGS[name](x, q)
    assert close(y, int8_exact(x, q, 32), 4 * group)
    # against the exact FP32 product: int8 rounding of x costs about 1/254 of each block's largest |x|,
    # so the error is far below the product's size but not zero
    ref = exact(x, q)
    rel = float((y - ref).norm() / ref.norm())
    assert 1e-5 < rel < 0.02, rel


def test_quantize_activations_round_trip():
    x = torch.tensor([[0.0] * 32 + list(range(-16, 16))], dtype=torch.float32)
    codes, scale = kk.quantize_activations(x, 32)
    assert codes.dtype == torch.int8 and scale.shape == (1, 2)
    assert scale[0, 0] == 1 and (codes[0, :32] == 0).all()  # an all-zero block
    assert codes[0, 32] == -127 and torch.allclose(codes[0, 32:].float() * scale[0, 1], x[0, 32:], atol=scale[0, 1])


def test_threads_are_set_and_restored():
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    with kk.threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
        assert not kj.ENABLED or numba.get_num_threads() == 1
        q, x = layer(40, 64, 32)
        assert close(kk.blocked(x, q), exact(x, q), 64)
    assert (torch.get_num_threads(), numba.get_num_threads()) == (torch_before, numba_before)
    with pytest.raises(RuntimeError):
        with kk.threads(1):
            raise RuntimeError("inside")
    assert (torch.get_num_threads(), numba.get_num_threads()) == (torch_before, numba_before)
    with kk.threads(None) as n:
        assert n == numba_before or not kj.ENABLED
    block = kk.threads(1)  # one object entered twice, nested (the ladder enters one per case, sample after sample)
    with block:
        with block:
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert (torch.get_num_threads(), numba.get_num_threads()) == (torch_before, numba_before)
    with pytest.raises(ValueError, match="n must be an int in"):
        kj.set_threads(kj.max_threads() + 1)


def test_refusals():
    q, x = layer(8, 64, 32)
    assert_refused(lambda: kk.fused(x.double(), q), TypeError, "x", torch.float64, "float32")
    assert_refused(lambda: kk.fused(x[:, :32], q), ValueError, "x", (1, 32), "[M, 64]")
    assert_refused(lambda: kk.fused(x.reshape(1, 1, 64), q), ValueError, "x", (1, 1, 64), "[M, 64]")
    assert_refused(lambda: kk.fused(x[:0], q), ValueError, "x", (0, 64), "M >= 1")
    assert_refused(lambda: kk.fused([1.0], q), TypeError, "x", [1.0], "torch.Tensor")
    for name, rung in kk.RUNGS.items():  # rung 7 finds them in its C loop, the others before they start
        if runs(name, q):
            for bad in (float("nan"), float("inf"), float("-inf")):
                x_bad = x.clone()
                x_bad[0, 37] = bad
                assert_refused(lambda: rung(x_bad, q), ValueError, "x", "a NaN or inf", "finite")
    assert_refused(lambda: kk.fused(x, "w"), TypeError, "w", "w", "QTensor")
    q8 = quantize(torch.randn(4, 64), 8, "asym", 32)
    assert_refused(lambda: kk.pack_weight(q8), ValueError, "q", q8, "4-bit")
    odd = quantize(torch.randn(4, 63), 4, "asym", "channel")
    assert_refused(lambda: kk.pack_weight(odd), ValueError, "q", odd, "even")
    assert_refused(lambda: kk.threads(0), ValueError, "n", 0, "an int in [1,")
    assert_refused(lambda: kk.threads(kj.max_threads() + 1), ValueError, "n", kj.max_threads() + 1, "an int in")
    assert_refused(lambda: kk.threads(1.0), TypeError, "n", 1.0, "an int")
    assert close(kk.fused(x, q), exact(x, q), 64)  # still usable after the refusals


@pytest.mark.parametrize("name", ["4 blocked, threads (numba)", "6 C, compiler's SIMD, OpenMP"])
def test_rungs_4_and_6_refuse_x_beyond_their_headroom(name):
    # finite x whose exact product is a finite float32: the positive-shifted sums of rungs 4 (15 |scale| sum |x|)
    # and 6 (32 |scale| sum |x|) overflow before the zero point comes off; refused by name, never inf or NaN
    w = torch.ones(16, 64)
    w[:, 1::2] = -1  # each row's +1s and -1s cancel: the exact product of an even x is 0
    q = quantize(w, 4, "asym", 32)
    if not runs(name, q):
        pytest.skip(f"{name} does not run here: {kk.available(name)[1]}")
    x = torch.full((1, 64), 1e37)
    ref = exact(x, q)
    assert torch.isfinite(ref).all() and torch.isfinite(kk.fused(x, q)).all()  # rung 3 handles it
    with pytest.raises(ValueError, match=f"x must be inputs small enough for rung {name[0]}.*got 'max .x. 1e.37'"):
        kk.RUNGS[name](x, q)
    small = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    assert close(kk.RUNGS[name](small, q), exact(small, q), 64)  # still usable
