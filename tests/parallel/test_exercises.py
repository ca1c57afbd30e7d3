"""Notebook 04's exercises: each reference passes its own check, a wrong answer fails it, a stub gets the
reference, and the notebook's solutions (written out here as a learner would) pass."""
import math

import pytest
import torch
import torch.nn.functional as F

from labkit.parallel import exercises as ex

EXERCISES = [ex.RING_ALL_REDUCE, ex.TP_MLP, ex.BUBBLE, ex.MIN_CARDS]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_each_reference_passes_its_own_check(exercise, capsys):
    learner = lambda *a: exercise.reference(*a)  # noqa: E731
    assert exercise.check(learner) is learner
    assert capsys.readouterr().out.startswith("[PASS]")


def off(value):
    if isinstance(value, list):
        return [v + 1e-3 for v in value]
    return value + (1 if isinstance(value, int) else 1e-3)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_wrong_answer_fails(exercise, capsys):
    wrong = lambda *a: off(exercise.reference(*a))  # noqa: E731
    assert exercise.check(wrong) is exercise.reference
    assert capsys.readouterr().out.startswith("[FAIL]")


def test_a_stub_gets_the_reference(capsys):
    def stub(*args):
        raise NotImplementedError
    assert ex.BUBBLE.check(stub) is ex.BUBBLE.reference
    assert capsys.readouterr().out.startswith("[TODO]")


def ring_all_reduce(tensors):
    n = len(tensors)
    bufs = [list(t.clone().reshape(-1).tensor_split(n)) for t in tensors]
    for s in range(n - 1):
        sent = [bufs[r][(r - s) % n].clone() for r in range(n)]
        for r in range(n):
            bufs[(r + 1) % n][(r - s) % n] += sent[r]
    for s in range(n - 1):
        sent = [bufs[r][(r + 1 - s) % n].clone() for r in range(n)]
        for r in range(n):
            bufs[(r + 1) % n][(r + 1 - s) % n] = sent[r]
    return [torch.cat(b).reshape(t.shape) for b, t in zip(bufs, tensors)]


def tp_mlp(x, w_gate, w_up, w_down, tp):
    f = w_gate.shape[0] // tp
    return [(F.silu(x @ w_gate[r * f:(r + 1) * f].T) * (x @ w_up[r * f:(r + 1) * f].T)) @ w_down[:, r * f:(r + 1) * f].T
            for r in range(tp)]


def bubble_fraction(stages, microbatches):
    return (stages - 1) / (microbatches + stages - 1)


def min_cards(n_params, bytes_per_param, card_bytes, usable):
    return math.ceil(n_params * bytes_per_param / (card_bytes * usable))


@pytest.mark.parametrize("fn,exercise", [(ring_all_reduce, ex.RING_ALL_REDUCE), (tp_mlp, ex.TP_MLP),
                                         (bubble_fraction, ex.BUBBLE), (min_cards, ex.MIN_CARDS)])
def test_the_notebook_solutions_pass(fn, exercise, capsys):
    assert exercise.check(fn) is fn
    assert capsys.readouterr().out.startswith("[PASS]")
