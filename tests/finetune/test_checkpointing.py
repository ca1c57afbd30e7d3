"""Checkpointing every k-th block keeps fewer activations and gives the same gradients (reference: the step without
checkpointing)."""
import torch

from labkit.finetune import checkpointing, memory

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
