"""Real collectives on 2 and 4 gloo ranks equal the simulated ones and torch.distributed's own; the
course's ring over point-to-point sends equals gloo's all_reduce; timing returns one time per size."""
import multiprocessing

import pytest
import torch

from labkit.parallel import Pool, gloo
from labkit.parallel import collectives as c
from tests.refusals import assert_refused


def _inputs(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 4])
def test_real_equals_simulated_equals_library(size, pool2, pool4):
    pool = pool2 if size == 2 else pool4
    xs = _inputs(size, (8 * size, 3))
    out = gloo.real_collective(pool, "all_reduce", xs)
    for o, s in zip(out, c.ring_all_reduce(xs)):
        assert torch.allclose(o["ring"], s, atol=1e-5) and torch.allclose(o["library"], s, atol=1e-5)
    for op in ("all_gather", "reduce_scatter"):
        for o, s in zip(gloo.real_collective(pool, op, xs), getattr(c, op)(xs)):
            assert torch.allclose(o["library"], s, atol=1e-5)
    rows = [torch.arange(float(r + 2 * size)) + 100 * r for r in range(size)]
    splits = [[(i + j) % 3 for j in range(size)] for i in range(size)]
    for i, row in enumerate(rows):
        splits[i][0] += len(row) - sum(splits[i])  # rank i's splits sum to its rows
    for o, s in zip(gloo.real_collective(pool, "all_to_all", rows, splits), c.all_to_all(rows, splits)):
        assert torch.equal(o["library"], s)


@pytest.mark.timeout(60)
def test_time_worker_gives_a_time_per_size(pool2):
    for op in ("all_reduce", "ring_all_reduce", "all_gather", "all_to_all"):
        times = pool2.run(gloo.time_worker, op, [1024, 1 << 16], 1)
        assert times[0] == times[1] and len(times[0]) == 2 and all(t > 0 for t in times[0])


def test_time_worker_after_compute_gives_a_time_per_size(pool2):
    times = pool2.run(gloo.time_worker, "all_reduce", [512], 2, 1e-4)
    assert times[0] == times[1] and len(times[0]) == 1 and times[0][0] > 0


def test_bad_input_is_refused_before_any_rank_starts():
    pool2 = Pool(2)  # never started: a refusal must not start it
    before = set(multiprocessing.active_children())
    assert_refused(lambda: gloo.real_collective(pool2, "all_to_all", [torch.ones(3), torch.ones(2)],
                                                [[1, 1], [1, 1]]), ValueError, "splits[0]", [1, 1], "3 rows")
    assert_refused(lambda: gloo.real_collective(pool2, "all_reduce", [torch.ones(3)]), ValueError, "inputs", 1,
                   "2 tensors")
    assert_refused(lambda: gloo.real_collective(pool2, "gather", [torch.ones(3)] * 2), ValueError, "op",
                   "gather", "one of")
    assert_refused(lambda: gloo.real_collective(pool2, "all_to_all", [torch.ones(2, 3), torch.ones(2, 4)]),
                   ValueError, "inputs", ["(2, 3) float32", "(2, 4) float32"], "shapes past dim 0 and dtypes agree")
    assert_refused(lambda: gloo.real_collective(pool2, "all_to_all", [torch.ones(2)] * 3), ValueError, "inputs", 3,
                   "2 tensors")
    assert not pool2.running and set(multiprocessing.active_children()) == before
