"""Notebook 09's exercises: each reference passes its own check, the notebook's solutions (written here
independently) pass, common mistakes fail, and the references agree with independent ones."""
import pytest
import torch

from labkit.finetune import exercises as ex
from labkit.finetune import lora


def mixed_precision_adam_bytes(n):
    return {"weights": 2 * n, "gradients": 2 * n, "master": 4 * n, "adam m": 4 * n, "adam v": 4 * n, "total": 16 * n}


def lora_forward(x, W, A, B, alpha):
    return x @ (W + alpha / A.shape[0] * B @ A).T


def quantize_blockwise(x, code, block):
    x = x.reshape(-1).float()
    codes, absmax = [], []
    for i in range(0, x.numel(), block):
        part = x[i:i + block]
        m = part.abs().max()
        absmax.append(m)
        scaled = part / (m if m > 0 else 1)
        mids = (code[1:] + code[:-1]) / 2
        codes.append(torch.searchsorted(mids, scaled))
    return torch.cat(codes).to(torch.uint8), torch.stack(absmax)


EXERCISES = [(mixed_precision_adam_bytes, ex.SIXTEEN_BYTES), (lora_forward, ex.LORA_FORWARD),
             (quantize_blockwise, ex.BLOCK_QUANT)]


@pytest.mark.parametrize("fn, exercise", EXERCISES, ids=lambda v: getattr(v, "name", ""))
def test_the_notebook_solution_and_the_reference_pass(fn, exercise, capsys):
    assert exercise.check(fn) is fn
    learner = lambda *a: exercise.reference(*a)  # noqa: E731
    assert exercise.check(learner) is learner
    assert capsys.readouterr().out.count("[PASS]") == 2


MISTAKES = [
    (lambda n: {"weights": 2 * n, "gradients": 2 * n, "master": 0, "adam m": 4 * n, "adam v": 4 * n,
                "total": 12 * n}, ex.SIXTEEN_BYTES),                                      # forgot the master copy
    (lambda x, W, A, B, alpha: x @ W.T + x @ A.T @ B.T * alpha, ex.LORA_FORWARD),        # forgot / r
    (lambda x, code, block: quantize_blockwise(x, code, x.numel()), ex.BLOCK_QUANT),       # one block for all
]


@pytest.mark.parametrize("fn, exercise", MISTAKES, ids=lambda v: getattr(v, "name", ""))
def test_common_mistakes_fail(fn, exercise, capsys):
    assert exercise.check(fn) is exercise.reference
    assert "[FAIL]" in capsys.readouterr().out


def test_lora_forward_is_the_layers_forward():
    lin = torch.nn.Linear(8, 6, bias=False)
    m = lora.LoRALinear(lin, 3, 5.0)
    m.B.data = torch.randn(6, 3)
    x = torch.randn(4, 8)
    assert torch.allclose(m(x), ex.lora_forward(x, lin.weight, m.A, m.B, 5.0), atol=1e-6)
