"""Overlapping communication with computation (notebook 04, section 6): m micro-batches, each a compute
phase (a chain of matmuls) followed by an all-reduce of its result, run one after the other and then with
asynchronous all-reduces (async_op=True): micro-batch i's all-reduce runs while micro-batch i+1 computes,
as DDP overlaps its bucketed gradient all-reduces with the backward pass.

    sequential:  C0 A0 C1 A1 C2 A2              m (c + a)
    overlapped:  C0 C1 C2 ..                    about c + (m-1) max(c, a) + a
                    A0 A1 A2

On this machine gloo's all-reduce runs on CPU threads that compete with the matmuls for the same 2 cores,
so the gain is bounded by that sharing; on a GPU, NCCL's collectives are kernels that take some of the SMs
(the notebook cites NCCL and DeepSeek-V3), while NVLink moves the bytes.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .._checks import check_choice, check_positive, check_positive_int
from .distributed import Pool, shared_pool

MODES = ("sequential", "overlapped")


def predicted_seconds(mode: str, microbatches: int, compute: float, comm: float) -> float:
    """The model above: seconds for `microbatches` of `compute` + `comm` seconds each."""
    check_choice("mode", mode, MODES)
    m = check_positive_int("microbatches", microbatches)
    c, a = check_positive("compute", compute, allow_zero=True), check_positive("comm", comm, allow_zero=True)
    return m * (c + a) if mode == "sequential" else c + (m - 1) * max(c, a) + a


def _compute(x: torch.Tensor, w: torch.Tensor, depth: int) -> torch.Tensor:
    for _ in range(depth):
        x = torch.tanh(x @ w)
    return x


def overlap_worker(rank: int, world: int, microbatches: int, width: int, depth: int, rows: int) -> dict:
    """Both modes on this rank, after a warm-up: seconds of each and the events
    (kind "compute" | "comm", micro-batch, start, end) on the machine-wide clock."""
    g = torch.Generator().manual_seed(rank)
    w = torch.randn(width, width, generator=g) / width ** 0.5
    xs = [torch.randn(rows, width, generator=g) for _ in range(microbatches)]
    out = {}
    for mode in ("warm-up", *MODES):
        events, pending, waited = [], None, []
        dist.barrier()
        t_start = time.perf_counter()
        for i, x in enumerate(xs):
            t0 = time.perf_counter()
            y = _compute(x, w, depth)
            events.append(("compute", i, t0, time.perf_counter()))
            if mode != "overlapped":
                t0 = time.perf_counter()
                dist.all_reduce(y)
                events.append(("comm", i, t0, time.perf_counter()))
                continue
            if pending is not None:
                events.append(_finish(*pending, waited))
            pending = (i, time.perf_counter(), *_issue(y))
        if pending is not None:
            events.append(_finish(*pending, waited))
        out[mode] = {"seconds": time.perf_counter() - t_start, "events": events, "waited": waited}
    return {m: out[m] for m in MODES}


def _issue(y: torch.Tensor) -> tuple:
    """Start an asynchronous all-reduce of y; (work, completion record) where the record receives the
    time the collective completed (a callback on its future), not the time someone waited for it."""
    work = dist.all_reduce(y, async_op=True)
    done: list[float] = []
    work.get_future().add_done_callback(lambda _f: done.append(time.perf_counter()))
    return work, done


def _finish(i: int, issued: float, work, done: list[float], waited: list[float]) -> tuple:
    """Wait for micro-batch i's all-reduce; its comm event spans issue to completion (waited gets the
    time wait() returned, for comparison)."""
    work.wait()
    work.get_future().wait()
    waited.append(time.perf_counter())
    return ("comm", i, issued, done[0] if done else waited[-1])


def run_overlap(microbatches: int = 6, width: int = 256, depth: int = 8, rows: int = 256, world: int = 2,
                pool: Pool | None = None) -> dict:
    """Sequential against overlapped on `world` real ranks: {mode: {"seconds": slowest rank's, "events":
    rank 0's, times from 0}}; each micro-batch all-reduces rows x width float32."""
    for name, v in (("microbatches", microbatches), ("width", width), ("depth", depth), ("rows", rows)):
        check_positive_int(name, v)
    runs = (pool or shared_pool(world)).run(overlap_worker, microbatches, width, depth, rows)
    out = {}
    for mode in MODES:
        events = runs[0][mode]["events"]
        t0 = min(e[2] for e in events)
        out[mode] = {"seconds": max(r[mode]["seconds"] for r in runs),
                     "events": [(k, i, a - t0, b - t0) for k, i, a, b in events],
                     "waited": [t - t0 for t in runs[0][mode]["waited"]]}
    return out
