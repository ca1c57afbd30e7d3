"""Checkpointing every k-th block keeps fewer activations and gives the same gradients (reference: the step without
checkpointing)."""
import pytest
import torch

from labkit.finetune import checkpointing, memory
from labkit.tinylm import model as model_py

from ..refusals import assert_refused
from .test_memory import CFG, _model


def test_checkpointing_keeps_fewer_activations_and_the_same_gradients():
    tokens = torch.randint(0, CFG.vocab_size, (4, 33))
    grads, acts = [], []
    for every in (0, 1):
        model = _model()
        m = memory.measure_step(model, tokens, torch.optim.SGD(model.parameters(), lr=0.0),
                                forward=checkpointing.checkpointed_loss(every))
        acts.append(m.activations)
        grads.append([p.grad.clone() for p in model.parameters()])
    assert acts[1] < 0.7 * acts[0]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    assert checkpointing.sqrt_rule(16) == 4 and checkpointing.sqrt_rule(1) == 1


def test_every_k_checkpoints_blocks_0_k_2k_and_keeps_the_gradients(monkeypatch):
    """Which blocks go through torch's checkpoint for every = 1..4 on 4 blocks (recorded by wrapping it), the
    gradients against the plain step, and fewer activations the more blocks are checkpointed."""
    tokens = torch.randint(0, CFG.vocab_size, (2, 17))
    seen = []
    real = model_py.checkpoint  # what TinyLM's loop (run_blocks) calls around a checkpointed block

    def recording(block, *args, **kw):
        seen.append(block)
        return real(block, *args, **kw)

    monkeypatch.setattr(model_py, "checkpoint", recording)
    plain = _model()
    memory.lm_loss(plain, tokens).backward()
    acts = {}
    for every, blocks in ((1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3]), (4, [0]), (5, [0])):
        model = _model()
        seen.clear()
        checkpointing.checkpointed_loss(every)(model, tokens).backward()
        assert [list(model.layers).index(b) for b in seen] == blocks
        assert all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(model.parameters(), plain.parameters()))
        acts[every] = memory.measure_step(model, tokens, torch.optim.SGD(model.parameters(), lr=0.0),
                                          forward=checkpointing.checkpointed_loss(every)).activations
    assert acts[1] < acts[2] < acts[4] == acts[5]


def test_the_sqrt_rule_is_the_integer_nearest_sqrt_n():
    for n in range(1, 200):
        nearest = min(range(1, n + 1), key=lambda k: abs(k - n ** 0.5))
        assert checkpointing.sqrt_rule(n) == nearest, n


def test_the_loss_is_the_plain_one_and_the_model_keeps_its_setting():
    tokens = torch.randint(0, CFG.vocab_size, (2, 9))
    mask = torch.rand(2, 8) < 0.5
    model = _model()
    model.checkpoint_every = 3
    plain = memory.lm_loss(_model(), tokens, mask)
    for every in (0, 1, 2):
        loss = checkpointing.checkpointed_loss(every)(model, tokens, mask)
        assert model.checkpoint_every == 3
        assert torch.allclose(loss, plain, rtol=0, atol=1e-6)  # the same ops: equal to the bit in practice


def test_refusals():
    assert_refused(lambda: checkpointing.checkpointed_loss(-1), ValueError, "every", -1, "an int >= 0")
    forward = checkpointing.checkpointed_loss(1)
    assert_refused(lambda: forward(7, torch.zeros(1, 3, dtype=torch.long)), TypeError, "model", 7, "a TinyLM")
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        checkpointing.checkpoint_sweep(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long))
