"""ZeRO stage 1 on 2 real gloo ranks: ZeroOne over AdamW gives the parameters of one process on the whole global
batch and of torch's ZeroRedundancyOptimizer, with half of Adam's states per rank; over SGD with momentum, two
param groups, a frozen parameter and a learning-rate schedule it gives torch's SGD on one process; its closure,
its per-rank state_dict round trip, and refusals. The workers below run on the ranks (spawned processes import
them from this module); every multi-process test is capped in time."""
import io

import pytest
import torch
import torch.nn.functional as F

from labkit.finetune import zero
from labkit.finetune.memory import optimizer_state_bytes
from labkit.parallel import Pool
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused


def _mlp(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _groups(model) -> list[dict]:
    """Two groups with their own settings; the first layer's bias frozen (never sharded, never moved)."""
    model[0].bias.requires_grad_(False)
    return [{"params": [model[0].weight, model[0].bias]},
            {"params": list(model[2].parameters()), "lr": 0.05, "weight_decay": 0.0}]


def _train(model, opt, x, y, steps: int) -> None:
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # changes the groups' lr mid-run
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()


def _half(rank, world, t):
    rows = t.shape[0] // world
    return t[rank * rows:(rank + 1) * rows]


SGD = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)


def sgd_worker(rank, world, x, y, steps):
    model = _mlp(0)
    opt = zero.ZeroOne(_groups(model), torch.optim.SGD, **SGD)
    _train(model, opt, _half(rank, world, x), _half(rank, world, y), steps)
    return [p.detach() for p in model.parameters()], optimizer_state_bytes(opt.optim)


def closure_worker(rank, world, x, y):
    model = _mlp(1)
    opt = zero.ZeroOne(model.parameters(), torch.optim.SGD, lr=0.1)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(_half(rank, world, x)), _half(rank, world, y))
        loss.backward()
        return loss

    with torch.no_grad():  # the closure computes gradients whatever the caller's mode
        loss = opt.step(closure)
    return float(loss), [p.detach() for p in model.parameters()]


def resume_worker(rank, world, x, y):
    """Two steps, this rank's state_dict through torch.save, a fresh model and ZeroOne loading both, two more
    steps on each. Returns (same parameters, the loaded lr, the refusal of the other rank's state_dict)."""
    xr, yr = _half(rank, world, x), _half(rank, world, y)

    def run(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            F.mse_loss(model(xr), yr).backward()
            opt.step()

    model = _mlp(2)
    opt = zero.ZeroOne(model.parameters(), torch.optim.AdamW, lr=1e-2)
    run(model, opt, 2)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    twin = _mlp(3)
    twin.load_state_dict(model.state_dict())
    again = zero.ZeroOne(twin.parameters(), torch.optim.AdamW, lr=1.0)
    saved = torch.load(buffer)
    again.load_state_dict(saved)
    lr = again.param_groups[0]["lr"]
    run(model, opt, 2)
    run(twin, again, 2)
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    try:
        again.load_state_dict(dict(saved, rank=1 - rank))
        refusal = None
    except ValueError as e:
        refusal = str(e)
    return same, lr, refusal


@pytest.fixture(scope="module")
def pool():
    with Pool(2, timeout=30) as p:
        yield p


def _data(seed=0, rows=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)


@pytest.mark.timeout(120)
def test_zero1_matches_one_process_and_zero_redundancy_optimizer(pool):
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32))
    r = zero.compare_zero(pool, model, steps=3, batch=4, seq=16, lr=1e-2)
    assert r["moved"] > 1e-3  # training moved the parameters: agreement is not trivial
    assert r["ours_vs_single"] < 1e-5 and r["library_vs_single"] < 1e-5 and r["ranks_agree"]
    # Adam's m and v (4 bytes each per parameter) and one 4-byte step counter per parameter tensor
    n, tensors = r["params"], len(list(model.parameters()))
    assert r["single_bytes"] == 8 * n + 4 * tensors
    assert r["ours_bytes"] == [4 * (n + n % 2) + 4] * 2  # one flat shard per rank: one counter
    assert sum(r["library_bytes"]) == 8 * n + 4 * tensors  # the library shards whole tensors


@pytest.mark.timeout(120)
def test_zero_one_over_sgd_with_groups_a_frozen_tensor_and_a_schedule_is_torchs_sgd(pool):
    x, y = _data()
    steps = 5
    ranks = pool.run(sgd_worker, x, y, steps)
    model = _mlp(0)
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(_groups(model), **SGD)
    _train(model, opt, x, y, steps)
    for params, _ in ranks:
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params, model.parameters()))
    assert max((a - b).abs().max() for a, b in zip(start, model.parameters())) > 1e-2  # SGD moved them
    assert torch.equal(ranks[0][0][1], start[1])  # the frozen bias
    # momentum buffers: one per trainable value in one process; per rank, half of each group's flat vector
    assert optimizer_state_bytes(opt) == 4 * (96 + 51)
    assert [b for _, b in ranks] == [4 * (48 + 26)] * 2


@pytest.mark.timeout(120)
def test_step_runs_the_closure_and_returns_its_loss(pool):
    x, y = _data(1)
    ranks = pool.run(closure_worker, x, y)
    model = _mlp(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    F.mse_loss(model(x), y).backward()
    opt.step()
    for rank, (loss, params) in enumerate(ranks):
        with torch.no_grad():
            assert loss == pytest.approx(float(F.mse_loss(_mlp(1)(_half(rank, 2, x)), _half(rank, 2, y))))
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params, model.parameters()))


@pytest.mark.timeout(120)
def test_a_ranks_state_dict_round_trip_continues_the_run_and_another_ranks_is_refused(pool):
    for rank, (same, lr, refusal) in enumerate(pool.run(resume_worker, *_data(2))):
        assert same and lr == 1e-2
        assert refusal.startswith("state_dict must be this rank's own state_dict") and \
            f"rank {rank} of 2" in refusal and f"rank {1 - rank} of 2" in refusal


def test_bad_arguments_are_refused_by_name():
    params = list(_mlp(0).parameters())
    assert_refused(lambda: zero.ZeroOne(params, "AdamW"), TypeError, "optimizer_class", "AdamW",
                   "torch.optim.Optimizer subclass")
    with pytest.raises(TypeError, match="optimizer_class must be a torch.optim.Optimizer subclass"):
        zero.ZeroOne(params, torch.optim.AdamW(params))  # an instance, not the class
    assert_refused(lambda: zero.ZeroOne(params, torch.optim.AdamW), RuntimeError, "process_group", None,
                   "initialised torch.distributed")
