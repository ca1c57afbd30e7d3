"""Collectives on real ranks (notebook 04, sections 1 and 2): the course's ring all-reduce built from gloo
point-to-point sends, torch.distributed's own collectives, and timing them. Every function here named
`*_worker` runs on each rank of a labkit.parallel.distributed.Pool: `pool.run(collective_worker, ...)`.

Uses the new gloo names (all_gather_single, reduce_scatter_single), which print no FutureWarning.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .._checks import check_choice, fail
from .collectives import OPS, check_all_to_all, check_ranks, ring_chunks, ring_schedule


def ring_all_reduce_p2p(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over every rank of the current group, in place, with the ring schedule of
    labkit.parallel.collectives (reduce-scatter then all-gather), each step one isend to rank + 1 and one
    irecv from rank - 1 (batch_isend_irecv). Returns t."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return t
    flat = t.view(-1)
    bounds = ring_chunks(flat.numel(), world)
    recv = torch.empty(max(b - a for a, b in bounds), dtype=t.dtype)
    for step in ring_schedule(world, flat.numel(), t.element_size()):
        if step.src != rank:
            continue
        a, b = bounds[step.chunk]
        ra, rb = bounds[(step.chunk - 1) % world]  # rank - 1 sends the chunk one below ours
        buf = recv[:rb - ra]
        ops = [dist.P2POp(dist.isend, flat[a:b].clone(), step.dst),
               dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if step.phase == "reduce-scatter":
            flat[ra:rb] += buf
        else:
            flat[ra:rb] = buf
    return t


def library_collective(op: str, x: torch.Tensor, splits: list[list[int]] | None = None) -> torch.Tensor:
    """torch.distributed's own `op` on this rank's tensor x (dim 0 is split / gathered); all_to_all uses
    row i of `splits` as its input split sizes and column i as its output split sizes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if op == "all_reduce":
        out = x.clone()
        dist.all_reduce(out)
    elif op == "all_gather":
        out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        dist.all_gather_single(out, x.contiguous())
    elif op == "reduce_scatter":
        out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_single(out, x.contiguous())
    elif op == "all_to_all":
        send = [s[rank] for s in splits] if splits else None  # column `rank`: what every rank sends me
        rows = sum(send) if send else x.shape[0]
        out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=send,
                               input_split_sizes=splits[rank] if splits else None)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return out


def collective_worker(rank: int, world: int, op: str, inputs: list[torch.Tensor],
                      splits: list[list[int]] | None = None) -> dict[str, torch.Tensor]:
    """This rank's result of `op` on inputs[rank] with torch.distributed ("library") and, for all_reduce,
    with the course's ring over point-to-point sends ("ring")."""
    out = {"library": library_collective(op, inputs[rank], splits)}
    if op == "all_reduce":
        out["ring"] = ring_all_reduce_p2p(inputs[rank].clone())
    return out


def _op_input(op: str, nbytes: int, world: int) -> torch.Tensor:
    """A float32 input of about `nbytes` for `op`: S for all_reduce / reduce_scatter (the full tensor),
    S / world for all_gather (each rank's share of the gathered S), S for all_to_all (each rank's input)."""
    numel = max(world, nbytes // 4 // world * world)
    return torch.ones(numel // world if op == "all_gather" else numel)


def _compute(seconds: float) -> None:
    """Keep this rank's core busy with small matmuls for about `seconds` (a decode step's compute)."""
    a = torch.ones(32, 32)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = a @ a * (1 / 32)


def time_worker(rank: int, world: int, op: str, sizes: list[int], repeats: int,
                after_compute: float = 0.0) -> list[float]:
    """Median seconds of `op` for each size S in bytes (see _op_input), each repeat ending at a barrier-free
    max over ranks: the slowest rank's time is the collective's time. Same list on every rank.
    after_compute > 0: every rank computes that many seconds before each timed op, as in a decode step,
    where a collective follows compute rather than another message (gloo's threads have gone idle)."""
    fn = ring_all_reduce_p2p if op == "ring_all_reduce" else (lambda t: library_collective(op, t))
    out = []
    for nbytes in sizes:
        x = _op_input("all_reduce" if op == "ring_all_reduce" else op, nbytes, world)
        fn(x.clone())  # warm-up: buffers and connections
        times = []
        for _ in range(repeats):
            dist.barrier()
            if after_compute:
                _compute(after_compute)
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.append(statistics.median(slowest.tolist()))
    return out


def real_collective(pool, op: str, inputs: list[torch.Tensor], splits=None) -> list[dict[str, torch.Tensor]]:
    """Run `op` on the ranks of `pool`, rank r starting from inputs[r]; each rank's {"library": ...,
    "ring": ...} result (see collective_worker). Refuses mismatched inputs or all-to-all splits before any
    rank starts."""
    check_choice("op", op, OPS)
    if isinstance(inputs, (list, tuple)) and len(inputs) != pool.world:
        fail("inputs", len(inputs), f"{pool.world} tensors (one per rank of the pool)")
    if op == "all_to_all":
        inputs, splits = check_all_to_all(inputs, splits, "inputs")
    else:
        inputs = check_ranks(inputs, "inputs")
    if op == "reduce_scatter" and (inputs[0].dim() == 0 or inputs[0].shape[0] % pool.world):
        fail("inputs", tuple(inputs[0].shape), f"tensors whose first dimension divides by {pool.world}")
    return pool.run(collective_worker, op, list(inputs), splits)
