"""The library's tensor parallelism: the same Megatron split of TinyLM with DTensor's parallelize_module
(ColwiseParallel / RowwiseParallel on a cpu DeviceMesh), to check the course's labkit.parallel.tensor
against it (notebook 04, section 3). The plan is read from TinyLM's table of linear layers: "column"
-> ColwiseParallel, "row" -> RowwiseParallel; the embedding and output layer stay replicated.
"""

from __future__ import annotations

import torch

from ..tinylm import TinyLM, TinyLMConfig, linear_layers
from .distributed import Pool, shared_pool
from .tensor import rebuild_model, tp_inputs


def dtensor_plan(cfg: TinyLMConfig) -> dict:
    """{module path: ColwiseParallel() or RowwiseParallel()} for every attention and MLP matrix."""
    # imported here: torch.distributed.tensor takes 0.5 s, which every process importing labkit.parallel paid
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    styles = {"column": ColwiseParallel, "row": RowwiseParallel}
    return {e.path: styles[e.tp_style]() for e in linear_layers(cfg) if e.tp_style in styles}


@torch.no_grad()
def dtensor_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, tokens: torch.Tensor) -> torch.Tensor:
    """One rank of dtensor_logits: TinyLM parallelized by DTensor, its logits for `tokens`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    model = rebuild_model(cfg, state)
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, dtensor_plan(cfg))
    return model(tokens)


def dtensor_logits(model: TinyLM, tokens: torch.Tensor, tp: int, pool: Pool | None = None) -> torch.Tensor:
    """TinyLM's logits [B, T, vocab] with DTensor tensor parallelism of degree `tp` over real gloo ranks;
    refuses the degrees labkit.parallel.tensor refuses."""
    cfg, state = tp_inputs(model, tp, pool)
    model(tokens)
    return (pool or shared_pool(tp)).run(dtensor_worker, cfg, state, tokens)[0]

