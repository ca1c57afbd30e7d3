"""Expert parallelism on real ranks: the output equals the single-process mixture of experts, the routing
keeps at most `capacity` assignments per expert (brute force), the send and receive split matrices are
transposes, the bytes match the formula when routing is uniform, and bad input is refused."""
import math

import pytest
import torch

from labkit.parallel import expert as ex
from tests.refusals import assert_refused

PARAMS = ex.make_experts(16, 24, 4, seed=0)
X = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))


def brute_route(x, router, k, cf, skew):
    logits = x @ router.T - skew * torch.arange(router.shape[0], dtype=x.dtype)
    probs = logits.softmax(-1)
    cap = math.ceil(cf * x.shape[0] * k / router.shape[0])
    used, kept, dropped = [0] * router.shape[0], [], 0
    for n in range(x.shape[0]):
        top = probs[n].topk(k)
        for v, e in zip(top.values, top.indices.tolist()):
            if used[e] < cap:
                used[e] += 1
                kept.append((n, e, float(v / top.values.sum())))
            else:
                dropped += 1
    return kept, dropped


@pytest.mark.parametrize("cf,skew", [(1.0, 0.0), (1.25, 3.0), (0.5, 0.0)])
def test_routing_against_brute_force(cf, skew):
    r = ex.route(X, PARAMS["router"], 2, cf, skew)
    kept, dropped = brute_route(X, PARAMS["router"], 2, cf, skew)
    assert r.dropped == dropped
    assert [(int(n), int(e)) for n, e in zip(r.token, r.expert)] == [(n, e) for n, e, _ in kept]
    assert torch.allclose(r.gate, torch.tensor([g for _, _, g in kept]), atol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cf,skew", [(8.0, 0.0), (1.0, 2.0)])
def test_expert_parallel_equals_the_reference(cf, skew, pool2):
    run = ex.expert_parallel_forward(X, PARAMS, 2, cf, 2, skew, pool=pool2)
    ref = torch.cat([ex.moe_forward(c, PARAMS, 2, cf, skew) for c in X.chunk(2)])
    assert torch.allclose(run.y, ref, atol=1e-5)
    recv = [list(col) for col in zip(*run.splits)]  # the receive matrix: the send matrix transposed
    assert run.load == [sum(r) for r in recv]
    assert sum(map(sum, run.splits)) == 64 * 2 - run.dropped
    dispatch, received = by_hand_crossings(X, PARAMS, 2, cf, skew, 2)
    assert run.dispatch_bytes == [n * 16 * 4 for n in dispatch]
    assert run.combine_bytes == [n * 16 * 4 for n in received]


def by_hand_crossings(x, params, k, cf, skew, ep):
    """Route every rank's chunk in one process; count rows leaving each rank and rows arriving from others."""
    per_rank = params["router"].shape[0] // ep
    dispatch, received = [0] * ep, [0] * ep
    for i, chunk in enumerate(x.chunk(ep)):
        for _, e, _ in brute_route(chunk, params["router"], k, cf, skew)[0]:
            if e // per_rank != i:
                dispatch[i] += 1
                received[e // per_rank] += 1
    return dispatch, received


@pytest.mark.timeout(60)
def test_uniform_routing_bytes_match_the_formula(pool2):
    router = torch.eye(4, 16) * 10  # expert e scores feature e
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]  # every ordered pair twice per rank
    x = torch.stack([torch.eye(16)[a] * 2 + torch.eye(16)[b] for a, b in pairs * 4])  # [48, 16]
    params = dict(PARAMS, router=router)
    run = ex.expert_parallel_forward(x, params, 2, 8.0, 2, pool=pool2)
    assert run.dropped == 0
    assert run.bytes_sent == [ex.all_to_all_bytes(48, 2, 16, 2)] * 2


def test_bad_input_is_refused():
    assert_refused(lambda: ex.expert_parallel_forward(X, PARAMS, 2, 1.0, 3), ValueError, "ep", 3,
                   "a divisor of n_experts=4")
    assert_refused(lambda: ex.expert_parallel_forward(X, PARAMS, 5, 1.0, 2), ValueError, "k", 5, "in [1, 4]")
    assert_refused(lambda: ex.expert_parallel_forward(X, PARAMS, 2, 0, 2), ValueError, "capacity_factor", 0,
                   "positive")
    assert_refused(lambda: ex.expert_parallel_forward(X, {}, 2, 1.0, 2), TypeError, "params", [],
                   "a dict from make_experts")


def test_route_and_moe_forward_refuse_bad_input():
    router = PARAMS["router"]
    assert_refused(lambda: ex.route(X, router, 0, 1.0), ValueError, "k", 0, "in [1, 4]")
    assert_refused(lambda: ex.route(X, router, 2, -1.0), ValueError, "capacity_factor", -1.0, "positive")
    assert_refused(lambda: ex.route(X[:, :8], router, 2, 1.0), ValueError, "x", (64, 8), "the router's")
    assert_refused(lambda: ex.moe_forward(X, PARAMS, 2, 1.0, skew="high"), TypeError, "skew", "high", "number")
    assert_refused(lambda: ex.moe_forward(X[:, :8], PARAMS, 2, 1.0), ValueError, "x", "[N, 8]", "d_model 16")
