"""Blockwise 8-bit states: the codebooks, the quantizer against a brute-force nearest level, AdamW8bit with FP32
states against torch.optim.AdamW (eps and defaults included), tensors under min_8bit_size in FP32 as bitsandbytes
keeps them, the 8-bit run against the FP32 run and against torch's AdamW over many steps of gradients spanning six
decades in one block, closures, state_dict round trips, states on the parameter's device, and refusals. The 8-bit
runs on small tensors set min_8bit_size=0 (every tensor in 8 bits)."""
import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.finetune import optim8bit as o8
from tests.refusals import assert_refused


def test_codebooks_are_sorted_reach_1_and_fit_a_byte_and_only_m_holds_0():
    for signed, size in ((True, 255), (False, 256)):
        code = o8.CODEBOOKS[signed]
        assert code.numel() == size and (code[1:] > code[:-1]).all() and code.max() == 1.0
        assert (code.min() == -1.0) == signed and (0.0 in code) == signed
    v = o8.CODEBOOKS[False]
    assert v.min() == pytest.approx(1e-8) and v[1] == pytest.approx(1e-7) and v[3] <= 1.01e-6  # nine decades, no 0


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
    assert back.shape == x.shape and torch.equal(back, code[codes.long()] * absmax.repeat_interleave(block)[:n])
    if not signed:  # v's map has no 0: a value of a block with a nonzero absmax never reads back as 0
        assert ((back > 0) == (absmax.repeat_interleave(block)[:n] > 0)).all()


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(300, generator=g)), torch.nn.Parameter(torch.randn(7, 5, generator=g))]


def _run(opt_cls, params, steps=20, **kw):
    opt = opt_cls(params, lr=1e-2, weight_decay=0.1, **kw)
    losses = []
    for _ in range(steps):
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
    eight, opt8 = _run(o8.AdamW8bit, p8 := _params(), state_dtype="int8", min_8bit_size=0)
    assert max(abs(a - b) / a for a, b in zip(ref, eight)) < 0.02
    moved = max((a - b).abs().max() for a, b in zip(p_ref, _params()))  # how far AdamW moved the parameters
    assert all((a - b).abs().max() < 0.1 * moved for a, b in zip(p_ref, p8))
    assert opt8.state_bytes() == 2 * 335 + 4 * 2 * (2 + 1)  # a byte per value of m and v, an absmax per block
    assert o8.state_bytes_per_param("int8") == 2 + 8 / 256 and o8.state_bytes_per_param("fp32") == 8


def test_bad_input_is_refused_naming_the_argument():
    refusals = [
        (dict(state_dtype="fp16"), ValueError, "state_dtype", "fp16", "int8"),
        (dict(lr=float("nan")), ValueError, "lr", float("nan"), "finite"),
        (dict(lr=0.0), ValueError, "lr", 0.0, "> 0"),
        (dict(betas=0.9), ValueError, "betas", 0.9, "a pair"),
        (dict(betas=(0.9, 1.0)), ValueError, "betas[1]", 1.0, "[0, 1)"),
        (dict(eps=0.0), ValueError, "eps", 0.0, "> 0"),
        (dict(weight_decay=-0.1), ValueError, "weight_decay", -0.1, ">= 0"),
        (dict(block=0), ValueError, "block", 0, "positive int"),
        (dict(min_8bit_size=-1), ValueError, "min_8bit_size", -1, "non-negative int"),
        (dict(min_8bit_size=4096.0), TypeError, "min_8bit_size", 4096.0, "non-negative int"),
    ]
    for kw, error, name, value, expected in refusals:
        assert_refused(lambda kw=kw: o8.AdamW8bit(_params(), **kw), error, name, value, expected)
    assert_refused(lambda: o8.quantize_blockwise(torch.ones(3, dtype=torch.int64), o8.CODEBOOKS[True]), ValueError,
                   "x", torch.int64, "float")
    with pytest.raises(ValueError, match="block"):
        o8.quantize_blockwise(torch.ones(3), o8.CODEBOOKS[True], 0)


def test_defaults_are_torchs_adamw():
    ours, ref = o8.AdamW8bit(_params()).defaults, torch.optim.AdamW(_params()).defaults
    assert {k: ours[k] for k in ("lr", "betas", "eps", "weight_decay")} == \
        {k: ref[k] for k in ("lr", "betas", "eps", "weight_decay")}


def _sized_params(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]


def test_tensors_under_min_8bit_size_keep_fp32_states_that_follow_torchs_adamw():
    """bitsandbytes' rule, its default 4096: a tensor of 4095 values keeps FP32 m and v (shaped like it), one of
    4096 gets 8-bit codes; the small tensor's trajectory is torch's AdamW's to float tolerance."""
    sizes = (4095, 4096, 7)
    ref, _ = _run(torch.optim.AdamW, p_ref := _sized_params(sizes), steps=10)
    ours, opt = _run(o8.AdamW8bit, p_ours := _sized_params(sizes), steps=10)
    small, big, tiny = (opt.state[p] for p in p_ours)
    assert small["m"].dtype == small["v"].dtype == torch.float32 and small["m"].shape == (4095,)
    assert "m_absmax" not in small and "m_absmax" not in tiny
    assert big["m"].dtype == big["v"].dtype == torch.uint8 and big["m_absmax"].numel() == 4096 // 256
    assert torch.allclose(p_ours[0], p_ref[0], atol=1e-6) and torch.allclose(p_ours[2], p_ref[2], atol=1e-6)
    assert not torch.equal(p_ours[1], p_ref[1])  # the 8-bit tensor rounds its states
    assert opt.state_bytes() == 8 * (4095 + 7) + 2 * 4096 + 2 * 4 * 16
    assert o8.AdamW8bit(_sized_params(sizes), min_8bit_size=4095).min_8bit_size == 4095


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
def test_a_state_dict_round_trip_continues_the_run_exactly(state_dtype):
    """Five steps, a state_dict through torch.save and torch.load into a fresh optimizer over copies of the
    parameters, five more steps on both: the same parameters and states bit for bit; 8-bit codes stay uint8."""
    params = _sized_params((4096, 10))
    opt = o8.AdamW8bit(params, lr=1e-2, state_dtype=state_dtype)

    def steps(ps, o, n):
        for _ in range(n):
            o.zero_grad()
            sum(((p - 0.5) ** 2).sum() for p in ps).backward()
            o.step()

    steps(params, opt, 5)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = o8.AdamW8bit(copies, lr=1.0, state_dtype=state_dtype)
    again.load_state_dict(torch.load(buffer))
    assert again.param_groups[0]["lr"] == 1e-2
    steps(params, opt, 5)
    steps(copies, again, 5)
    assert all(torch.equal(a, b) for a, b in zip(params, copies))
    for p, q in zip(params, copies):
        assert opt.state[p].keys() == again.state[q].keys() and opt.state[p]["step"] == again.state[q]["step"] == 10
        for k, v in opt.state[p].items():
            if isinstance(v, torch.Tensor):
                assert v.dtype == again.state[q][k].dtype and torch.equal(v, again.state[q][k])
    assert again.state[copies[0]]["m"].dtype == (torch.uint8 if state_dtype == "int8" else torch.float32)


def test_a_bf16_parameter_keeps_fp32_states_through_a_state_dict():
    p = torch.nn.Parameter(torch.randn(8, dtype=torch.bfloat16))
    opt = o8.AdamW8bit([p])
    p.grad = torch.ones_like(p)
    opt.step()
    again = o8.AdamW8bit([torch.nn.Parameter(p.detach().clone())])
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    (state,) = again.state.values()
    assert state["m"].dtype == state["v"].dtype == torch.float32


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_states_live_on_the_parameters_device_and_follow_torch_there(device):
    sizes = (4096, 100)
    ref = [torch.nn.Parameter(p.detach().to(device)) for p in _sized_params(sizes)]
    ours = [torch.nn.Parameter(p.detach().to(device)) for p in _sized_params(sizes)]
    _run(torch.optim.AdamW, ref, steps=5)
    _, opt = _run(o8.AdamW8bit, ours, steps=5)
    for p in ours:
        assert all(v.device == p.device for v in opt.state[p].values() if isinstance(v, torch.Tensor))
    assert torch.allclose(ours[1], ref[1], atol=1e-6)  # 100 values: FP32 states
    assert (ours[0] - ref[0]).abs().max() < 5 * 1e-2  # 8-bit states: within a few lr of torch's


def _adamw(params, **kw):
    return torch.optim.AdamW(params, **kw)


def _trajectory(make, grads, lr=1e-2, **kw) -> torch.Tensor:
    """The parameter [n] after each step of `make([p], lr=lr, weight_decay=0, **kw)` fed the gradients [steps, n]
    from p = 0: [steps + 1, n]."""
    p = torch.nn.Parameter(torch.zeros(grads.shape[1]))
    opt = make([p], lr=lr, weight_decay=0.0, **kw)
    out = [p.detach().clone()]
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return torch.stack(out)


def test_a_second_moment_below_the_blocks_range_does_not_blow_the_update_up():
    """Gradients 1 and 1e-4 in one block, then none: v of the second element is 1e-8 of the block's absmax
    (a map with a 0 would store 0 and step by m / eps, -47 instead of torch's -0.0167)."""
    grads = torch.tensor([[1.0, 1e-4], [0.0, 0.0]])
    ref = _trajectory(_adamw, grads)
    ours = _trajectory(o8.AdamW8bit, grads, min_8bit_size=0)
    assert torch.allclose(ours, ref, atol=1e-3) and ref[-1, 1] == pytest.approx(-0.0167, abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_over_many_steps_of_gradients_spanning_six_decades_every_step_stays_within_5_lr(seed):
    """300 steps, one block of 256 elements whose gradients run from 1 down to 1e-6, each element without a
    gradient on 30% of the steps (m decays while v holds). torch's AdamW moves an element at most 1.2 lr a step
    here; the 8-bit states' rounding (coarse in v's lowest decades) at most 5 lr, so the 8-bit trajectory stays
    within 5 lr x t of torch's after t steps. A v rounded to 0 moves an element thousands of lr in one step."""
    lr, steps, n = 1e-2, 300, 256
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** -torch.linspace(0, 6, n)
    grads = torch.stack([(torch.randn(n, generator=g) + 0.3) * scale * (torch.rand(n, generator=g) < 0.7)
                         for _ in range(steps)])
    ref = _trajectory(_adamw, grads, lr)
    ours = _trajectory(o8.AdamW8bit, grads, lr, min_8bit_size=0)
    assert (ref[1:] - ref[:-1]).abs().max() <= 1.2 * lr
    assert (ours[1:] - ours[:-1]).abs().max() <= 5 * lr
    t = torch.arange(steps + 1, dtype=torch.float32)[:, None]
    assert ((ours - ref).abs() <= 5 * lr * t + 1e-6).all()


def test_eps_is_added_to_the_bias_corrected_root_of_v_as_in_torch():
    """Gradients near eps: where eps sits (after the bias-corrected sqrt(v), not inside it or before the
    correction) changes the step by tens of percent."""
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(12, 40, generator=g) * 1e-3
    for eps in (1e-3, 1e-2):
        ref = _trajectory(_adamw, grads, eps=eps)
        ours = _trajectory(o8.AdamW8bit, grads, eps=eps, state_dtype="fp32")
        assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
def test_step_runs_the_closure_with_gradients_and_returns_its_loss_like_torch(state_dtype):
    runs = {}
    for name, make in (("torch", _adamw),
                       ("ours", lambda ps, **kw: o8.AdamW8bit(ps, state_dtype=state_dtype, min_8bit_size=0, **kw))):
        params = _params()
        opt = make(params, lr=1e-2, weight_decay=0.1)
        losses = []
        for _ in range(3):
            def closure(opt=opt, params=params):
                opt.zero_grad()
                loss = sum((p - 0.5).square().sum() for p in params)
                loss.backward()
                return loss
            with torch.no_grad():  # the closure computes gradients whatever the caller's mode
                losses.append(float(opt.step(closure)))
        runs[name] = losses, params
    assert runs["ours"][0] == pytest.approx(runs["torch"][0], rel=1e-4 if state_dtype == "int8" else 1e-6)
    assert all(torch.allclose(a, b, atol=1e-2 if state_dtype == "int8" else 1e-6)  # int8: within one lr
               for a, b in zip(runs["ours"][1], runs["torch"][1]))
    assert o8.AdamW8bit(_params()).step() is None


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
def test_a_nan_or_inf_gradient_is_refused_by_name_and_nothing_changes(state_dtype):
    params = _params()
    opt = o8.AdamW8bit(params, lr=1e-2, state_dtype=state_dtype, min_8bit_size=0)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in params]
    states = {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
              for i, p in enumerate(params)}
    for bad in (float("nan"), float("inf")):
        params[0].grad = torch.ones_like(params[0])
        params[1].grad = torch.ones_like(params[1])
        params[1].grad[2, 3] = bad
        assert_refused(opt.step, ValueError, "param_groups[0]['params'][1].grad", "1 NaN or inf of 35 values",
                       "finite")
        assert all(torch.equal(a, b) for a, b in zip(before, params))
        for i, p in enumerate(params):
            assert opt.state[p].keys() == states[i].keys()
            assert all(torch.equal(v, states[i][k]) if isinstance(v, torch.Tensor) else v == states[i][k]
                       for k, v in opt.state[p].items())


def test_the_quantizer_refuses_a_bad_code_table_nan_input_and_one_absmax_for_several_blocks():
    code = o8.CODEBOOKS[True]
    assert_refused(lambda: o8.quantize_blockwise(torch.ones(3), code.flip(0)), ValueError, "code",
                   f"level 1 = {float(code[-2])} after 1.0", "strictly increasing")
    assert_refused(lambda: o8.quantize_blockwise(torch.ones(3), torch.tensor([0.0, 0.5, 0.5, 1.0])), ValueError,
                   "code", "level 2 = 0.5 after 0.5", "strictly increasing")
    assert_refused(lambda: o8.quantize_blockwise(torch.ones(3), torch.tensor([0.0, 2.0])), ValueError, "code",
                   "level 1 = 2.0", "in [-1, 1]")
    assert_refused(lambda: o8.quantize_blockwise(torch.tensor([1.0, float("nan"), 2.0]), code), ValueError, "x",
                   "1 NaN or inf of 3 values", "finite")
    codes, absmax = o8.quantize_blockwise(torch.randn(600), code)
    assert absmax.numel() == 3
    assert_refused(lambda: o8.dequantize_blockwise(codes, absmax[:1], code), ValueError, "absmax",
                   "torch.float32 (1,)", "3 values")
    assert_refused(lambda: o8.dequantize_blockwise(codes.long(), absmax, code), TypeError, "codes", torch.int64,
                   "uint8")
    assert_refused(lambda: o8.dequantize_blockwise(torch.full((4,), 255, dtype=torch.uint8), absmax[:1], code),
                   ValueError, "codes", 255, "255 levels")
