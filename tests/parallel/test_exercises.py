"""Notebook 04's exercises: each reference passes its own check, a wrong answer fails it, a stub gets the
reference, the notebook's solutions (written out here as a learner would) pass, and MIN_CARDS' reference is the
planner's memory model."""
import math

import pytest
import torch
import torch.nn.functional as F

from labkit.parallel import exercises as ex
from labkit.parallel.planner import Hardware, Workload, estimate
from labkit.rng import Rng
from labkit.specs import device, model

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


@pytest.mark.parametrize("exercise", EXERCISES[:3], ids=lambda e: e.name)
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


def min_cards(name, card, batch, context, per_node):
    spec, usable = model(name), 0.9 * device(card).memory_bytes
    kv = batch * context * spec.kv_bytes_per_token(2)
    for tp in range(1, per_node + 1):
        if spec.n_heads % tp or (spec.n_kv_heads % tp and tp % spec.n_kv_heads):
            continue
        weights = spec.n_params * 2 / tp
        cache = kv / min(tp, spec.n_kv_heads)
        acts = batch * (8 * spec.d_model + 2 * spec.vocab_size / tp) * 4
        if weights + cache + acts <= usable:
            return tp
    return None


@pytest.mark.parametrize("fn,exercise", [(ring_all_reduce, ex.RING_ALL_REDUCE), (tp_mlp, ex.TP_MLP),
                                         (bubble_fraction, ex.BUBBLE), (min_cards, ex.MIN_CARDS)])
def test_the_notebook_solutions_pass(fn, exercise, capsys):
    assert exercise.check(fn) is fn
    assert capsys.readouterr().out.startswith("[PASS]")


def planner_min_cards(name, card, batch, context, per_node):
    """The smallest TP degree labkit.parallel.planner.estimate accepts with PP = EP = 1 on one node."""
    cluster, work = Hardware(1, per_node=per_node, device=card), Workload(batch=batch, context=context)
    return next((tp for tp in range(1, per_node + 1) if estimate(model(name), cluster, work, tp, 1, 1).fits), None)


def test_min_cards_is_the_planners_accounting():
    rng = Rng(4)
    cases = list(ex.MIN_CARDS.cases) + [ex.random_cards(rng) for _ in range(300)]
    assert {ex.min_cards_reference(*c) for c in cases} >= {None, 1, 2, 6, 8, 16}  # the cases reach every branch
    for case in cases:
        assert ex.min_cards_reference(*case) == planner_min_cards(*case), case


def weights_only(name, card, batch, context, per_node):
    return math.ceil(model(name).n_params * 2 / (0.9 * device(card).memory_bytes))


def any_count(name, card, batch, context, per_node):  # every byte counted, but 5 cards for 64 heads
    spec = model(name)
    total = spec.n_params * 2 + batch * context * spec.kv_bytes_per_token(2)
    n = math.ceil(total / (0.9 * device(card).memory_bytes))
    return n if n <= per_node else None


def kv_split_by_tp(name, card, batch, context, per_node):  # the KV cache shrinks past the KV heads
    spec, usable = model(name), 0.9 * device(card).memory_bytes
    kv = batch * context * spec.kv_bytes_per_token(2)
    for tp in range(1, per_node + 1):
        if spec.n_heads % tp or (spec.n_kv_heads % tp and tp % spec.n_kv_heads):
            continue
        if spec.n_params * 2 / tp + kv / tp + batch * (8 * spec.d_model + 2 * spec.vocab_size / tp) * 4 <= usable:
            return tp
    return None


def no_activations(name, card, batch, context, per_node):
    spec, usable = model(name), 0.9 * device(card).memory_bytes
    kv = batch * context * spec.kv_bytes_per_token(2)
    return next((tp for tp in range(1, per_node + 1) if not spec.n_heads % tp
                 and not (spec.n_kv_heads % tp and tp % spec.n_kv_heads)
                 and spec.n_params * 2 / tp + kv / min(tp, spec.n_kv_heads) <= usable), None)


@pytest.mark.parametrize("fn", [weights_only, any_count, kv_split_by_tp, no_activations],
                         ids=lambda f: f.__name__)
def test_min_cards_common_mistakes_fail_on_a_fixed_case(fn, capsys):
    assert any(fn(*case) != ex.min_cards_reference(*case) for case in ex.MIN_CARDS.cases)
    assert ex.MIN_CARDS.check(fn) is ex.MIN_CARDS.reference
    assert capsys.readouterr().out.startswith("[FAIL]")


@pytest.mark.parametrize("args, match", [
    (("deepseek-v3", "h100-sxm", 1, 1024, 8), "name must be a model with KV heads"),
    (("llama-3-8b", "nvlink4", 1, 1024, 8), "card must be a device with memory"),
    (("llama-3-8b", "h100-sxm", 0, 1024, 8), "batch must be"),
    (("llama-3-8b", "h100-sxm", 1, 1024, 0), "per_node must be")])
def test_min_cards_refuses_bad_input_by_name(args, match):
    with pytest.raises(ValueError, match=match):
        ex.min_cards_reference(*args)
