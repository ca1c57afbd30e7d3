"""Simulated collectives against brute force: the ring all-reduce is the sum for any rank count and size,
its schedule sends 2(N-1)/N x S per rank, and all-gather, reduce-scatter and all-to-all move the rows the
definitions say."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.parallel import collectives as c
from tests.refusals import assert_refused


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), numel=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_ring_all_reduce_is_the_sum_on_every_rank(n, numel, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(n)]
    before = [x.clone() for x in xs]
    out = c.ring_all_reduce(xs)
    total = torch.stack(xs).sum(0)
    assert len(out) == n and all(torch.allclose(o, total, atol=1e-12) for o in out)
    assert all(torch.equal(a, b) for a, b in zip(xs, before))  # inputs untouched


def test_ring_keeps_shapes_and_integers_exactly():
    xs = [torch.arange(12).reshape(3, 4) * (r + 1) for r in range(3)]
    assert all(torch.equal(o, torch.arange(12).reshape(3, 4) * 6) for o in c.ring_all_reduce(xs))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_each_rank_sends_2_n_minus_1_over_n_of_the_tensor(n):
    numel = 24 * n
    sched = c.ring_schedule(n, numel, 4)
    assert len({t.step for t in sched if t.phase == "reduce-scatter"}) == n - 1
    for r in range(n):
        sent = sum(t.nbytes for t in sched if t.src == r)
        assert sent == pytest.approx(c.bytes_sent_per_rank("all_reduce", numel * 4, n))
    assert all(t.dst == (t.src + 1) % n for t in sched)


def test_chunks_cover_the_tensor():
    bounds = c.ring_chunks(10, 4)
    assert bounds == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_all_gather_reduce_scatter_and_all_to_all_by_definition():
    xs = [torch.arange(4.0) + 10 * r for r in range(2)]
    assert all(torch.equal(o, torch.cat(xs)) for o in c.all_gather(xs))
    rs = c.reduce_scatter(xs)
    assert torch.equal(torch.cat(rs), xs[0] + xs[1])
    rows = [torch.arange(3.0), torch.arange(5.0) + 100]
    splits = [[1, 2], [4, 1]]
    out = c.all_to_all(rows, splits)
    assert torch.equal(out[0], torch.tensor([0.0, 100, 101, 102, 103]))
    assert torch.equal(out[1], torch.tensor([1.0, 2, 104]))
    assert [len(o) for o in out] == [sum(col) for col in zip(*splits)]  # receive matrix = splits transposed
    assert c.bytes_sent_per_rank("all_gather", 100, 4) == 75


def test_bad_input_is_refused():
    assert_refused(lambda: c.ring_all_reduce([]), TypeError, "tensors", "list", "a non-empty list")
    assert_refused(lambda: c.ring_all_reduce([torch.ones(2), torch.ones(3)]), ValueError, "tensors",
                   "[2] float32", "one shape")
    assert_refused(lambda: c.reduce_scatter([torch.ones(3), torch.ones(3)]), ValueError, "tensors", (3,),
                   "divides by the 2 ranks")
    assert_refused(lambda: c.all_to_all([torch.ones(3), torch.ones(2)], [[1, 1], [1, 1]]), ValueError,
                   "splits[0]", [1, 1], "summing to rank 0's 3 rows")
    assert_refused(lambda: c.all_to_all([torch.ones(2), torch.ones(2)], [[1, 1]]), TypeError, "splits",
                   [[1, 1]], "2 x 2")
    assert_refused(lambda: c.all_to_all([torch.ones(2), torch.ones(2)], [[2, -1], [1, 1]]), ValueError,
                   "splits[0][1]", -1, ">= 0")
    assert_refused(lambda: c.bytes_sent_per_rank("broadcast", 1, 2), ValueError, "op", "broadcast", "one of")


def test_all_to_all_refuses_mismatched_trailing_shapes():
    bad = [torch.ones(2, 3), torch.ones(2, 4)]
    assert_refused(lambda: c.all_to_all(bad), ValueError, "tensors", ["(2, 3) float32", "(2, 4) float32"],
                   "shapes past dim 0 and dtypes agree")
    mixed = [torch.ones(2, 3), torch.ones(2, 3, dtype=torch.int64)]
    assert_refused(lambda: c.all_to_all(mixed), ValueError, "tensors", ["(2, 3) float32", "(2, 3) int64"],
                   "dtypes agree")
    assert len(c.all_to_all([torch.ones(2, 3), torch.ones(4, 3)], [[1, 1], [2, 2]])) == 2  # rows may differ
