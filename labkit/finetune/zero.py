"""ZeRO stage 1 on real ranks (notebook 09, section 5): data parallel training with the optimizer states
sharded over the ranks (Rajbhandari et al. 2020, arXiv:1910.02054), on lab 04's gloo Pool.

    flat parameters [P] (padded to a multiple of world)   rank 0 owns [0, P/2), rank 1 owns [P/2, P)
    every step, on every rank r:
      forward + backward on its B / world rows of the global batch       -> full gradient g_r [P]
      reduce-scatter(sum of g_r) / world                                 -> mean gradient of its shard [P/2]
      AdamW on its shard (m and v exist for the shard only)             -> new shard of the parameters
      all-gather the shards                                              -> every rank holds all parameters

Each rank holds the full weights and gradients but only 1/world of Adam's m and v: 4 + 4 + 8 / world bytes per
parameter instead of 16. The same run with torch.distributed.optim.ZeroRedundancyOptimizer (gradients
all-reduced, each rank's optimizer steps its shard and broadcasts it) is the library's check on ours; both are
compared with one process training on the whole global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._checks import check_positive_int, fail
from ..tinylm import TinyLM, TinyLMConfig
from .memory import lm_loss, optimizer_state_bytes


def _model(cfg: dict, state: dict) -> TinyLM:
    model = TinyLM(TinyLMConfig.from_dict(cfg))
    model.load_state_dict(state)
    return model


def single_process(cfg: dict, state: dict, batches: list[torch.Tensor], lr: float = 1e-3,
                   weight_decay: float = 0.01) -> tuple[torch.Tensor, int]:
    """The reference: one process, AdamW, each global batch whole. Returns (flat parameters, optimizer bytes)."""
    model = _model(cfg, state)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, foreach=False)
    for tokens in batches:
        opt.zero_grad(set_to_none=True)
        lm_loss(model, tokens).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), optimizer_state_bytes(opt)


def zero1_worker(rank: int, world: int, cfg: dict, state: dict, batches: list[torch.Tensor], lr: float = 1e-3,
                 weight_decay: float = 0.01) -> dict:
    """One rank of ZeRO stage 1 (module docstring). Returns its flat parameters after the last step and its bytes:
    optimizer states, the shard it owns."""
    model = _model(cfg, state)
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    shard = -(-total // world)  # ceil: the flat vector is padded to world * shard
    flat = torch.zeros(world * shard)
    flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
    mine = torch.nn.Parameter(flat[rank * shard:(rank + 1) * shard].clone())
    opt = torch.optim.AdamW([mine], lr=lr, weight_decay=weight_decay, foreach=False)
    for tokens in batches:
        if tokens.shape[0] % world:
            fail("batches", tuple(tokens.shape), f"global batches whose size divides by world = {world}")
        rows = tokens.shape[0] // world
        for p in params:
            p.grad = None
        lm_loss(model, tokens[rank * rows:(rank + 1) * rows]).backward()
        grads = torch.zeros(world * shard)
        grads[:total] = torch.cat([p.grad.reshape(-1) for p in params])
        mine.grad = torch.empty(shard)
        dist.reduce_scatter_single(mine.grad, grads)  # sum over ranks of each rank's slice
        mine.grad /= world
        opt.step()
        dist.all_gather_single(flat, mine.detach())
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
    return {"params": flat[:total].clone(), "optimizer_bytes": optimizer_state_bytes(opt), "shard": shard}


def zero_redundancy_worker(rank: int, world: int, cfg: dict, state: dict, batches: list[torch.Tensor],
                           lr: float = 1e-3, weight_decay: float = 0.01) -> dict:
    """The same run with torch's ZeroRedundancyOptimizer: gradients all-reduced (mean), the library's shard
    step and broadcast. Returns flat parameters and this rank's optimizer bytes."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = _model(cfg, state)
    params = list(model.parameters())
    opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr, weight_decay=weight_decay,
                                  foreach=False)
    for tokens in batches:
        rows = tokens.shape[0] // world
        opt.zero_grad(set_to_none=True)
        lm_loss(model, tokens[rank * rows:(rank + 1) * rows]).backward()
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    return {"params": torch.cat([p.detach().reshape(-1) for p in params]),
            "optimizer_bytes": optimizer_state_bytes(opt.optim)}


def random_batches(vocab: int, n: int, batch: int, seq: int, seed: int = 0) -> list[torch.Tensor]:
    """`n` global batches of random token ids [batch, seq + 1] (the parameters' agreement, not the data, is
    what section 5 checks)."""
    for name, v in (("vocab", vocab), ("n", n), ("batch", batch), ("seq", seq)):
        check_positive_int(name, v)
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq + 1), generator=g) for _ in range(n)]


def compare_zero(pool, model, steps: int = 3, batch: int = 8, seq: int = 32, lr: float = 1e-3, seed: int = 0) -> dict:
    """Train a copy of `model` for `steps` steps three ways on the same global batches: one process, our ZeRO-1 on
    `pool`'s ranks, torch's ZeroRedundancyOptimizer on the same ranks. Returns the largest parameter differences
    (ours vs single, library vs single, ours vs library) and the optimizer bytes of each (per rank for the
    sharded runs)."""
    from ..parallel import Pool

    if not isinstance(pool, Pool):
        fail("pool", pool, "a labkit.parallel.Pool", TypeError)
    cfg, state = model.cfg.to_dict(), {k: v.detach().clone() for k, v in model.state_dict().items()}
    batches = random_batches(model.cfg.vocab_size, steps, batch, seq, seed)
    single, single_bytes = single_process(cfg, state, batches, lr)
    ours = pool.run(zero1_worker, cfg, state, batches, lr)
    lib = pool.run(zero_redundancy_worker, cfg, state, batches, lr)
    return {"ours_vs_single": float((ours[0]["params"] - single).abs().max()),
            "library_vs_single": float((lib[0]["params"] - single).abs().max()),
            "ours_vs_library": float((ours[0]["params"] - lib[0]["params"]).abs().max()),
            "ranks_agree": all(torch.equal(r["params"], ours[0]["params"]) for r in ours),
            "single_bytes": single_bytes, "ours_bytes": [r["optimizer_bytes"] for r in ours],
            "library_bytes": [r["optimizer_bytes"] for r in lib], "params": int(single.numel()),
            "moved": float((single - torch.cat([p.detach().reshape(-1) for p in model.parameters()])).abs().max())}
