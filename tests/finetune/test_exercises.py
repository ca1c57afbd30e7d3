"""Notebook 09's exercises: each reference passes its own check, the notebook's solutions (written here
independently) pass, common mistakes fail, and the references agree with independent ones."""
import math

import pytest
import torch

from labkit.finetune import exercises as ex
from labkit.finetune import lora
from labkit.finetune.memory import adapter_params, max_rank, training_memory
from labkit.rng import Rng
from labkit.specs import model as model_spec


def mixed_precision_adam_bytes(n):
    return {"weights": 2 * n, "gradients": 2 * n, "master": 4 * n, "adam m": 4 * n, "adam v": 4 * n, "total": 16 * n}


def lora_qkv_forward(x, W, sizes, adapters, alpha):
    """Dense: the fused weight plus each adapter's (alpha / r) B A in its own rows, one matmul."""
    delta = torch.zeros_like(W)
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    for name, start, size in zip("qkv", starts, sizes):
        if name in adapters:
            A, B = adapters[name]
            delta[start:start + size] = alpha / A.shape[0] * B @ A
    return x @ (W + delta).T


def quantize_blockwise(x, code, block):
    """Value by value: the first level at the smallest distance (argmin keeps the first: ties to the lower)."""
    x = x.reshape(-1).double()
    codes, absmax = [], []
    for i in range(0, x.numel(), block):
        part = x[i:i + block]
        m = part.abs().max()
        absmax.append(m.float())
        scaled = part / (m if m > 0 else 1)
        codes += [int((code.double() - v).abs().argmin()) for v in scaled]
    return torch.tensor(codes, dtype=torch.uint8), torch.stack(absmax)


def largest_rank(model, method, budget, tokens, checkpointing):
    """Closed form: the total is the rank-1 total plus 16 bytes (2 weights, 2 gradients, 12 optimizer) per adapter
    parameter for each rank above 1."""
    spec = model_spec(model)
    per_rank = 16 * adapter_params(spec, 1)
    at_one = training_memory(spec, method, tokens, 1, checkpointing)["total"]
    if budget < at_one:
        return 0
    return min(max_rank(spec), 1 + math.floor((budget - at_one) / per_rank))


EXERCISES = [(mixed_precision_adam_bytes, ex.SIXTEEN_BYTES), (lora_qkv_forward, ex.LORA_QKV),
             (quantize_blockwise, ex.BLOCK_QUANT), (largest_rank, ex.LORA_BUDGET)]


@pytest.mark.parametrize("fn, exercise", EXERCISES, ids=lambda v: getattr(v, "name", ""))
def test_the_notebook_solution_and_the_reference_pass(fn, exercise, capsys):
    assert exercise.check(fn) is fn
    learner = lambda *a: exercise.reference(*a)  # noqa: E731
    assert exercise.check(learner) is learner
    assert capsys.readouterr().out.count("[PASS]") == 2


def _thirds(x, W, sizes, adapters, alpha):  # assumes q, k and v equally wide
    n = W.shape[0] // 3
    return ex.lora_qkv_forward(x, W, (n, n, W.shape[0] - 2 * n), adapters, alpha)


def _one_rank(x, W, sizes, adapters, alpha):  # scales every adapter by the first one's rank
    r = next(iter(adapters.values()))[0].shape[0] if adapters else 1
    return ex.lora_qkv_forward(x, W, sizes, {p: (A * A.shape[0] / r, B) for p, (A, B) in adapters.items()}, alpha)


def _ties_up(x, code, block):
    x = x.detach().reshape(-1).float()
    n = x.numel()
    blocks = torch.cat([x, x.new_zeros((-n) % block)]).view(-1, block)
    absmax = blocks.abs().amax(dim=1)
    scaled = blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
    codes = torch.searchsorted((code[1:] + code[:-1]) / 2, scaled.contiguous(), right=True)
    return codes.reshape(-1)[:n].to(torch.uint8), absmax


def _no_cap(model, method, budget, tokens, ckpt):
    spec = model_spec(model)
    per_rank = 16 * adapter_params(spec, 1)
    at_one = training_memory(spec, method, tokens, 1, ckpt)["total"]
    return 0 if budget < at_one else 1 + math.floor((budget - at_one) / per_rank)


def _strictly_below(model, method, budget, tokens, ckpt):  # a budget the total must stay under, not reach
    return ex.largest_rank(model, method, budget - 1, tokens, ckpt)


MISTAKES = [
    (lambda n: {"weights": 2 * n, "gradients": 2 * n, "master": 0, "adam m": 4 * n, "adam v": 4 * n,
                "total": 12 * n}, ex.SIXTEEN_BYTES),                                      # forgot the master copy
    (lambda x, W, sizes, adapters, alpha: ex.lora_qkv_forward(
        x, W, sizes, {p: (A * A.shape[0], B) for p, (A, B) in adapters.items()}, alpha), ex.LORA_QKV),  # forgot / r
    (_thirds, ex.LORA_QKV),
    (_one_rank, ex.LORA_QKV),
    (lambda x, W, sizes, adapters, alpha: ex.lora_qkv_forward(
        x, W, sizes[::-1], adapters, alpha), ex.LORA_QKV),                                   # parts in the wrong order
    (lambda x, code, block: quantize_blockwise(x, code, x.numel()), ex.BLOCK_QUANT),       # one block for all
    (_ties_up, ex.BLOCK_QUANT),                                                             # ties to the upper level
    (_no_cap, ex.LORA_BUDGET),
    (_strictly_below, ex.LORA_BUDGET),
    (lambda model, method, budget, tokens, ckpt: max(1, ex.largest_rank(model, method, budget, tokens, ckpt)),
     ex.LORA_BUDGET),                                                                       # rank 1 when nothing fits
    (lambda model, method, budget, tokens, ckpt: ex.largest_rank(model, "lora", budget, tokens, ckpt),
     ex.LORA_BUDGET),                                                                       # QLoRA's base as LoRA's
]


@pytest.mark.parametrize("fn, exercise", MISTAKES, ids=lambda v: getattr(v, "name", ""))
def test_common_mistakes_fail(fn, exercise, capsys):
    assert exercise.check(fn) is exercise.reference
    assert "[FAIL]" in capsys.readouterr().out


def test_the_tie_cases_are_exact_ties():
    """In every fixed tie case some value / absmax sits exactly on a midpoint, so ties-to-upper answers differ."""
    for x, code, block in ex.BLOCK_QUANT.cases[3:]:
        assert not torch.equal(_ties_up(x, code, block)[0], ex.quantize_blockwise(x, code, block)[0])
    rng = Rng(0)
    ties = [c for c in (ex.random_block_case(rng) for _ in range(20)) if c[1] is not ex.CODEBOOKS[True]
            and c[1] is not ex.CODEBOOKS[False]]
    assert ties and any(not torch.equal(_ties_up(*c)[0], ex.quantize_blockwise(*c)[0]) for c in ties)


def test_lora_qkv_forward_is_each_parts_lora_layer():
    """The fused projection with adapters equals three LoRALinear layers (labkit.finetune.lora), concatenated."""
    g = torch.Generator().manual_seed(0)
    sizes, n_in, layers = (8, 4, 4), 8, []
    for size, rank in zip(sizes, (2, 3, 1)):
        linear = torch.nn.Linear(n_in, size, bias=False)
        linear.weight.data = torch.randn(size, n_in, generator=g)
        layer = lora.LoRALinear(linear, rank, 6.0)
        layer.B.data = torch.randn(layer.B.shape, generator=g)
        layers.append(layer)
    x = torch.randn(5, n_in, generator=g)
    adapters = {p: (m.A.detach(), m.B.detach()) for p, m in zip("qkv", layers)}
    W = torch.cat([m.base.weight() for m in layers])
    want = torch.cat([m(x) for m in layers], dim=-1)
    assert torch.allclose(ex.lora_qkv_forward(x, W, sizes, adapters, 6.0), want, atol=1e-5)


def test_largest_rank_agrees_with_a_scan_of_every_rank():
    for model, method, tokens, ckpt in (("tinylm", "lora", 256, False), ("tinylm", "qlora", 1024, True)):
        totals = [training_memory(model, method, tokens, r, ckpt)["total"] for r in range(1, max_rank(model) + 1)]
        for budget in (int(totals[0]) - 1, int(totals[0]) + 1, int(totals[10]), int(totals[-1]) + 1, 10**12):
            want = max((r for r, t in enumerate(totals, 1) if t <= budget), default=0)
            assert ex.largest_rank(model, method, budget, tokens, ckpt) == want, (model, method, budget)


def test_max_rank_is_the_smallest_side_of_an_adapted_linear():
    assert max_rank("tinylm") == 64             # TinyLM's wk and wv: [64, 128] (grouped-query attention)
    assert max_rank("llama-2-7b") == 4096       # every linear has a side of d_model 4096
    assert max_rank("llama-3-8b") == 1024       # wk, wv: 8 KV heads x 128 = 1024 rows


@pytest.mark.parametrize("fn, exercise, case", [(MISTAKES[0][0], ex.SIXTEEN_BYTES, 0),
                                                (_strictly_below, ex.LORA_BUDGET, 0), (_no_cap, ex.LORA_BUDGET, 3)])
def test_a_failure_names_the_case_and_not_the_answer(fn, exercise, case, capsys):
    """The [FAIL] line shows the failing case's arguments and the answer given, never the expected one."""
    exercise.check(fn)
    line = capsys.readouterr().out
    args = exercise.cases[case]
    expected = exercise.reference(*args)
    answer = expected["master"] if isinstance(expected, dict) else expected
    assert f"{exercise.name if fn.__name__ == '<lambda>' else fn.__name__}({args[0]!r}" in line
    assert str(answer) not in line.split(" returned ", 1)[1], line
