"""The hierarchical all-reduce equals the plain sum on simulated ranks (any layout) and torch.distributed's
all_reduce on 4 real gloo ranks as 2 nodes x 2; its alpha-beta cost follows the three steps' formulas and
the flat ring's slowest hop; the planner's TP line is the in-node placement."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.parallel import hierarchical as h
from labkit.parallel import linkmodel as lm
from labkit.parallel import planner
from labkit.specs import model
from tests.refusals import assert_refused


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(1, 4), per_node=st.integers(1, 4), numel=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_simulated_is_the_sum_on_every_rank(nodes, per_node, numel, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(nodes * per_node)]
    before = [x.clone() for x in xs]
    total = torch.zeros(numel, dtype=torch.float64)
    for x in xs:  # brute force, one rank after the other
        total += x
    out = h.hierarchical_all_reduce(xs, per_node)
    assert len(out) == len(xs) and all(torch.allclose(o, total, atol=1e-12) for o in out)
    assert all(torch.equal(a, b) for a, b in zip(xs, before))


def test_simulated_keeps_shapes_and_integers_exactly():
    xs = [torch.arange(15).reshape(5, 3) * (r + 1) for r in range(6)]
    assert all(torch.equal(o, torch.arange(15).reshape(5, 3) * 21) for o in h.hierarchical_all_reduce(xs, 3))
    assert_refused(lambda: h.hierarchical_all_reduce(xs, 4), ValueError, "per_node", 4, "a divisor of the 6 ranks")


@pytest.mark.timeout(60)
def test_real_ranks_as_two_nodes_of_two(pool4):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4)]  # 15 elements: padded to 16
    total = xs[0] + xs[1] + xs[2] + xs[3]
    for per_node in (2, 4):
        out = h.real_hierarchical(pool4, xs, per_node)
        for r in out:
            assert r["hierarchical"].shape == (5, 3)
            assert torch.allclose(r["hierarchical"], r["library"], atol=1e-12)
            assert torch.allclose(r["hierarchical"], total, atol=1e-12)
    assert_refused(lambda: h.real_hierarchical(pool4, xs, 3), ValueError, "per_node", 3, "a divisor")
    assert_refused(lambda: h.real_hierarchical(pool4, xs[:3], 2), ValueError, "inputs", 3, "4 tensors")


def test_costs_follow_the_formulas():
    intra, inter = lm.LinkModel(1e-6, 400e9), lm.LinkModel(1e-5, 50e9)
    s, nodes, per = 1e9, 2, 8
    steps = h.hierarchical_seconds(s, nodes, per, intra, inter)
    assert steps["reduce-scatter (intra)"] == pytest.approx(7 * 1e-6 + 7 / 8 * s / 400e9)
    assert steps["all-reduce (inter)"] == pytest.approx(2 * 1e-5 + (s / 8) / 50e9)
    assert steps["all-gather (intra)"] == pytest.approx(7 * 1e-6 + 7 / 8 * s / 400e9)
    assert h.flat_ring_seconds(s, nodes, per, intra, inter) == pytest.approx(30 * 1e-5 + 30 / 16 * s / 50e9)
    # one node: the flat ring is the intra ring, and reduce-scatter + all-gather is the ring all-reduce
    assert h.flat_ring_seconds(s, 1, per, intra, inter) == pytest.approx(intra.collective("all_reduce", s, per))
    assert sum(h.hierarchical_seconds(s, 1, per, intra, inter).values()) == pytest.approx(
        intra.collective("all_reduce", s, per))
    place = h.placement_seconds(s, 8, 2, intra, inter)
    assert place["one node"] < place["hierarchical, 2 nodes"] < place["flat ring, 2 nodes"]
    assert_refused(lambda: h.placement_seconds(s, 8, 3, intra, inter), ValueError, "nodes", 3, "a divisor")


def test_tp_placement_in_one_node_is_the_planners_line():
    cluster, work = planner.Hardware(16), planner.Workload(batch=64, context=8192)
    chosen = planner.plan("moe-3t", cluster, work)[0]
    place = h.tp_placement(model("moe-3t"), chosen, cluster, work)
    assert place["one node"] == pytest.approx(chosen.time["tp all-reduce"], rel=1e-12)
    assert place["flat ring, 2 nodes"] > place["one node"]
    rejected = next(p for p in planner.plan("moe-3t", cluster, work) if not p.fits)
    assert_refused(lambda: h.tp_placement(model("moe-3t"), rejected, cluster, work), ValueError, "chosen",
                   str(rejected), "a layout that fits")


def test_the_real_all_reduce_refuses_a_list_or_a_non_contiguous_tensor_before_any_collective():
    """Checked before the process group is asked for anything (none exists here)."""
    t = torch.arange(12.0).reshape(3, 4).T  # a view with strides (1, 4)
    assert_refused(lambda: h.hierarchical_all_reduce_gloo(t, 2), ValueError, "t",
                   "a non-contiguous tensor of shape (4, 3) and strides (1, 4)", "a contiguous tensor")
    assert_refused(lambda: h.hierarchical_all_reduce_gloo([1.0, 2.0], 2), TypeError, "t", [1.0, 2.0], "a torch.Tensor")
    assert_refused(lambda: h.hierarchical_all_reduce_gloo(torch.ones(4), 0), ValueError, "per_node", 0, "positive")
    xs = [torch.arange(12.0).reshape(3, 4).T * (r + 1) for r in range(4)]  # the simulated ranks take any layout
    assert all(torch.equal(o, torch.arange(12.0).reshape(3, 4).T * 10) for o in h.hierarchical_all_reduce(xs, 2))
