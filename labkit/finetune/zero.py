"""ZeRO stage 1 on real ranks (notebook 09, section 5): data parallel training with the optimizer states
sharded over the ranks (Rajbhandari et al. 2020, arXiv:1910.02054), on lab 04's gloo Pool.

    flat parameters [P] (padded to a multiple of world)   rank 0 owns [0, P/2), rank 1 owns [P/2, P)
    every step, on every rank r:
      forward + backward on its B / world rows of the global batch       -> full gradient g_r [P]
      reduce-scatter(sum of g_r) / world                                 -> mean gradient of its shard [P/2]
      the inner optimizer (AdamW) on its shard (m and v for it only)     -> new shard of the parameters
      all-gather the shards                                              -> every rank holds all parameters

ZeroOne is that step as an optimizer over any inner optimizer class, shaped like torch's
ZeroRedundancyOptimizer: `ZeroOne(model.parameters(), torch.optim.AdamW, lr=1e-3)`, then zero_grad, backward and
step as usual. Each rank holds the full weights and gradients but only 1/world of Adam's m and v: 4 + 4 + 8 / world
bytes per parameter instead of 16. The same run with torch.distributed.optim.ZeroRedundancyOptimizer (gradients
all-reduced, each rank's optimizer steps its whole tensors and broadcasts them) is the library's check on ours;
both are compared with one process training on the whole global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._checks import check_positive_int, check_type, fail
from ..tinylm import TinyLM, TinyLMConfig
from .memory import lm_loss, optimizer_state_bytes


class ZeroOne(torch.optim.Optimizer):
    """ZeRO stage 1 (module docstring) on every rank of an initialised process group (`process_group`, the
    default group if None). Each param group's trainable parameters are flattened into one vector padded to a
    multiple of world; `optim`, an `optimizer_class(**defaults)`, steps this rank's slice of each (one flat
    parameter per group, the group's settings copied in at every step, so schedulers work on param_groups).

    step(closure): runs the closure (gradients enabled, its loss returned), averages the gradients over the ranks
    with a reduce-scatter (give each rank's own gradients; gradients already averaged by DDP are averaged again
    unchanged; a parameter without a gradient counts as zeros), steps the shard, all-gathers the parameters into
    every rank's tensors. The shard is read from the parameters at each step, so loading weights needs nothing
    more. An elementwise optimizer (SGD, Adam, AdamW, AdamW8bit) steps a flat shard as it steps the tensors; one
    that looks at whole tensors (LAMB's trust ratio, Adafactor's factored moments) does not.
    state_dict() is this rank's: its shard's optimizer state, the groups' settings, rank and world."""

    def __init__(self, params, optimizer_class: type = torch.optim.AdamW, process_group=None, **defaults):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            fail("optimizer_class", optimizer_class, "a torch.optim.Optimizer subclass such as torch.optim.AdamW",
                 TypeError)
        if not dist.is_initialized():
            fail("process_group", process_group, "a group of an initialised torch.distributed (init_process_group, "
                 "or a worker of labkit.parallel.Pool)", RuntimeError)
        self.process_group = process_group
        self.rank, self.world = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.optim: torch.optim.Optimizer | None = None
        self._shards: list[dict] = []  # per group: its trainable parameters, their total size, this rank's slice
        super().__init__(params, defaults)
        self.optim = optimizer_class([self._inner_group(i) for i in range(len(self.param_groups))], **defaults)
        self._copy_settings(self.optim.param_groups, self.param_groups)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        params = [p for p in group["params"] if p.requires_grad]
        if not params or len({(p.dtype, p.device) for p in params}) != 1:
            fail(f"param_groups[{len(self.param_groups) - 1}]", [(p.dtype, str(p.device)) for p in params],
                 "at least one trainable parameter, all of one dtype on one device (they share a flat vector)")
        total = sum(p.numel() for p in params)
        size = -(-total // self.world)  # ceil: the flat vector is padded to world * size
        self._shards.append({"params": params, "total": total, "size": size, "shard": params[0].new_zeros(size)})
        if self.optim is not None:
            self.optim.add_param_group(self._inner_group(len(self.param_groups) - 1))
            self._copy_settings(self.optim.param_groups[-1:], self.param_groups[-1:])

    def _inner_group(self, i: int) -> dict:
        return {"params": [self._shards[i]["shard"]]} | {k: v for k, v in self.param_groups[i].items()
                                                       if k != "params"}

    @staticmethod
    def _copy_settings(source: list[dict], target: list[dict]) -> None:
        for src, dst in zip(source, target):
            dst.update({k: v for k, v in src.items() if k != "params"})

    def _flat(self, i: int, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Group i's tensors (parameters or gradients) as one vector padded to world * size."""
        sh = self._shards[i]
        out = sh["shard"].new_zeros(self.world * sh["size"])
        out[:sh["total"]] = torch.cat([t.reshape(-1) for t in tensors])
        return out

    @torch.no_grad()
    def step(self, closure=None):
        """One ZeRO-1 step (class docstring). Returns the closure's loss, None without one."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._copy_settings(self.param_groups, self.optim.param_groups)
        for i, sh in enumerate(self._shards):
            mine = slice(self.rank * sh["size"], (self.rank + 1) * sh["size"])
            sh["shard"].copy_(self._flat(i, [p.detach() for p in sh["params"]])[mine])
            grads = self._flat(i, [p.grad if p.grad is not None else torch.zeros_like(p) for p in sh["params"]])
            sh["shard"].grad = torch.empty_like(sh["shard"])
            dist.reduce_scatter_single(sh["shard"].grad, grads, group=self.process_group)  # sum of each slice
            sh["shard"].grad /= self.world
        self.optim.step()
        for sh in self._shards:
            flat = sh["shard"].new_empty(self.world * sh["size"])
            dist.all_gather_single(flat, sh["shard"], group=self.process_group)
            offset = 0
            for p in sh["params"]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        return loss

    def state_dict(self) -> dict:
        """This rank's checkpoint (as DeepSpeed writes one optimizer file per rank): {"shard": optim's state_dict,
        "param_groups": the groups' settings, "rank", "world"}."""
        return {"shard": self.optim.state_dict(), "param_groups": super().state_dict()["param_groups"],
                "rank": self.rank, "world": self.world}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what state_dict() returned on the same rank of a group of the same size."""
        check_type("state_dict", state_dict, dict)
        if not {"shard", "param_groups", "rank", "world"} <= state_dict.keys():
            fail("state_dict", sorted(state_dict), "ZeroOne.state_dict()'s keys: shard, param_groups, rank, world")
        if (state_dict["rank"], state_dict["world"]) != (self.rank, self.world):
            fail("state_dict", f"rank {state_dict['rank']} of {state_dict['world']}",
                 f"this rank's own state_dict (rank {self.rank} of {self.world})")
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        self.optim.load_state_dict(state_dict["shard"])


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
    """One rank training with ZeroOne over AdamW on its B / world rows of each global batch. Returns its flat
    parameters after the last step and its optimizer bytes (the states of the shard it owns)."""
    model = _model(cfg, state)
    opt = ZeroOne(model.parameters(), torch.optim.AdamW, lr=lr, weight_decay=weight_decay, foreach=False)
    for tokens in batches:
        if tokens.shape[0] % world:
            fail("batches", tuple(tokens.shape), f"global batches whose size divides by world = {world}")
        rows = tokens.shape[0] // world
        opt.zero_grad(set_to_none=True)
        lm_loss(model, tokens[rank * rows:(rank + 1) * rows]).backward()
        opt.step()
    return {"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "optimizer_bytes": optimizer_state_bytes(opt.optim)}


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
