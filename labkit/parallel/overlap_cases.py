"""The three overlaps of communication with compute that large-model training and serving use, each run on
real gloo ranks against the same work without overlap (notebook 04, section 6; benchmarks/parallel_overlap.py).

    pipeline   stage s computes micro-batch i while micro-batch i's activations go to stage s+1 and
               micro-batch i+1's arrive (isend / irecv posted ahead) instead of blocking send, recv, compute
    tp         two independent micro-batches A and B, each layer a matmul then a TP all-reduce: A's
               all-reduce runs while B's matmul computes, and B's while A's next matmul does
                   sequential   A.mm A.ar B.mm B.ar | A.mm A.ar B.mm B.ar | ...
                   overlapped   A.mm B.mm A.mm B.mm ...
                                    A.ar B.ar A.ar B.ar                  (async_op=True, wait before use)
    buckets    a backward pass produces one gradient per layer, last layer first; gradients are packed in
               buckets of `bucket_layers` layers and each bucket is all-reduced (as DDP does): as soon as it
               is full (overlapped) or after the whole backward (sequential). Small buckets overlap more
               but pay one message latency each; large ones pay few latencies but overlap little.

Every worker runs warm-up, then `repeats` rounds, the two modes in alternating order each round (a busy
moment hits both alike), and returns each round's time of the slowest rank, so notebook verdicts can ask
whether the repeats separate (labkit.course.evidence).
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from .._checks import check_choice, check_int, check_positive_int, check_type, fail
from ..course import evidence
from .distributed import Pool, shared_pool
from .linkmodel import LinkModel

CASES = ("pipeline", "tp", "buckets")
MODES = ("sequential", "overlapped")


def _layer(x: torch.Tensor, w: torch.Tensor, depth: int) -> torch.Tensor:
    """`depth` matmuls with a tanh: one layer's compute (deterministic, bounded values)."""
    for _ in range(depth):
        x = torch.tanh(x @ w)
    return x


def _rounds(run_one: Callable[[str], object], repeats: int) -> tuple[dict, dict]:
    """({mode: [seconds of the slowest rank, per round]}, {mode: the last round's result}), after a warm-up
    round; modes alternate their order every round."""
    times: dict[str, list[float]] = {m: [] for m in MODES}
    result = {}
    for r in range(repeats + 1):
        for mode in (MODES if r % 2 else MODES[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            result[mode] = run_one(mode)
            if r:
                times[mode].append(time.perf_counter() - t0)
    slowest = torch.tensor([times[m] for m in MODES], dtype=torch.float64)  # [mode, round]
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {m: slowest[i].tolist() for i, m in enumerate(MODES)}, result


# ---- (a) pipeline: send the next micro-batch's activations while this one computes ----------------------------

def pipeline_worker(rank: int, world: int, microbatches: int, rows: int, width: int, depth: int,
                    repeats: int) -> dict:
    """Stage `rank` of a `world`-stage chain; stage 0 makes micro-batch i from a seed, the last stage returns
    the sum of its outputs per micro-batch ("result", the same in both modes) and the round times."""
    g = torch.Generator().manual_seed(100 + rank)
    w = torch.randn(width, width, generator=g) / width ** 0.5
    inputs = [torch.randn(rows, width, generator=torch.Generator().manual_seed(i)) for i in range(microbatches)]
    first, last = rank == 0, rank == world - 1

    def run(mode: str) -> list[float]:
        outs, sends = [], []
        recvs = [None] * microbatches
        if not first and mode == "overlapped":
            recvs[0] = _irecv(rows, width, rank - 1)
        for i in range(microbatches):
            if first:
                x = inputs[i]
            elif mode == "overlapped":
                buf, work = recvs[i]
                if i + 1 < microbatches:
                    recvs[i + 1] = _irecv(rows, width, rank - 1)  # the next one arrives while this computes
                work.wait()
                x = buf
            else:
                x = torch.empty(rows, width)
                dist.recv(x, rank - 1)
            y = _layer(x, w, depth)
            if last:
                outs.append(float(y.double().sum()))
            elif mode == "overlapped":
                sends.append((dist.isend(y, rank + 1), y))  # y is kept alive (and never overwritten) until sent
            else:
                dist.send(y, rank + 1)
        for work, _ in sends:
            work.wait()
        return outs

    seconds, result = _rounds(run, repeats)
    return {"seconds": seconds, "result": result}


def _irecv(rows: int, width: int, src: int) -> tuple:
    buf = torch.empty(rows, width)
    return buf, dist.irecv(buf, src)


# ---- (b) tensor parallel: one micro-batch's all-reduce under the other's matmuls --------------------------------

def tp_worker(rank: int, world: int, layers: int, rows: int, width: int, depth: int, repeats: int) -> dict:
    """Two micro-batches through `layers` row-parallel layers (matmuls, then an all-reduce averaged over the
    ranks); "result": the two final outputs (the same in both modes)."""
    g = torch.Generator().manual_seed(200 + rank)
    ws = [torch.randn(width, width, generator=g) / width ** 0.5 for _ in range(layers)]
    start = [torch.randn(rows, width, generator=torch.Generator().manual_seed(j)) for j in range(2)]

    def run(mode: str) -> list[torch.Tensor]:
        xs, pending = list(start), [None, None]
        for w in ws:
            for j in range(2):
                if pending[j] is not None:
                    pending[j].wait()  # micro-batch j's all-reduce must be done before its next matmul
                    xs[j] /= world
                xs[j] = _layer(xs[j], w, depth)
                pending[j] = dist.all_reduce(xs[j], async_op=True)
                if mode == "sequential":
                    pending[j].wait()
                    xs[j] /= world
                    pending[j] = None
        for j in range(2):
            if pending[j] is not None:
                pending[j].wait()
                xs[j] /= world
        return xs

    seconds, result = _rounds(run, repeats)
    return {"seconds": seconds, "result": result}


# ---- (c) bucketed gradient all-reduce ---------------------------------------------------------------------------

def bucket_worker(rank: int, world: int, layers: int, rows: int, width: int, depth: int, bucket_layers: int,
                  keep_grads: bool, repeats: int) -> dict:
    """A backward pass over `layers` layers (last first), each producing a rows x width gradient, all-reduced
    (summed) in buckets of `bucket_layers` layers; "result": the summed gradients, flat, layer order (the
    same in both modes); "local": this rank's own gradients when keep_grads (for a test's brute-force sum)."""
    g = torch.Generator().manual_seed(300 + rank)
    ws = [torch.randn(width, width, generator=g) / width ** 0.5 for _ in range(layers)]
    xs = [torch.randn(rows, width, generator=g) for _ in range(layers)]
    order = list(range(layers))[::-1]  # backward visits the last layer first
    buckets = [order[i:i + bucket_layers] for i in range(0, layers, bucket_layers)]
    numel = rows * width

    def run(mode: str) -> torch.Tensor:
        grads, works, flats = {}, [], []
        for bucket in buckets:
            for layer in bucket:
                grads[layer] = _layer(xs[layer], ws[layer], depth)
            flat = torch.cat([grads[layer].reshape(-1) for layer in bucket])  # [len(bucket) * rows * width]
            flats.append(flat)
            if mode == "overlapped":
                works.append(dist.all_reduce(flat, async_op=True))
        if mode == "sequential":
            for flat in flats:
                dist.all_reduce(flat)
        for work in works:
            work.wait()
        out = torch.empty(layers * numel)
        for bucket, flat in zip(buckets, flats):
            for k, layer in enumerate(bucket):
                out[layer * numel:(layer + 1) * numel] = flat[k * numel:(k + 1) * numel]
        return out

    seconds, result = _rounds(run, repeats)
    out = {"seconds": seconds, "result": result, "buckets": len(buckets), "bucket_bytes": bucket_layers * numel * 4}
    if keep_grads:
        out["local"] = torch.cat([_layer(xs[layer], ws[layer], depth).reshape(-1) for layer in range(layers)])
    return out


# ---- running them -----------------------------------------------------------------------------------------------

def run_case(case: str, world: int = 2, pool: Pool | None = None, repeats: int = 5, **sizes) -> dict:
    """Run one case on `world` real ranks: {"seconds": {mode: [slowest rank's seconds per round]}, "ranks":
    every rank's full answer}. sizes: pipeline(microbatches, rows, width, depth), tp(layers, rows, width,
    depth), buckets(layers, rows, width, depth, bucket_layers, keep_grads); defaults are notebook-sized."""
    check_choice("case", case, CASES)
    check_int("repeats", repeats, low=1)
    if pool is not None:
        check_type("pool", pool, Pool)
        world = pool.world
    defaults = {"pipeline": dict(microbatches=6, rows=256, width=256, depth=4),
                "tp": dict(layers=4, rows=256, width=256, depth=2),
                "buckets": dict(layers=8, rows=128, width=256, depth=3, bucket_layers=2, keep_grads=False)}[case]
    unknown = set(sizes) - set(defaults)
    if unknown:
        fail("sizes", sorted(unknown), f"keyword sizes among {sorted(defaults)} for case {case!r}")
    args = {**defaults, **sizes}
    for name, v in args.items():
        if name != "keep_grads":
            check_positive_int(name, v)
    if case == "buckets" and args["bucket_layers"] > args["layers"]:
        fail("bucket_layers", args["bucket_layers"], f"at most the {args['layers']} layers")
    if case == "pipeline" and world < 2:
        fail("world", world, "at least 2 ranks (a pipeline of one stage sends nothing)")
    worker = {"pipeline": pipeline_worker, "tp": tp_worker, "buckets": bucket_worker}[case]
    ranks = (pool or shared_pool(world)).run(worker, *args.values(), repeats)
    return {"seconds": ranks[0]["seconds"], "ranks": ranks}


def verdict(seconds: dict) -> str:
    """One line on `seconds` ({mode: repeats}, as run_case returns): the ratio of the medians and a direction
    only when the repeats separate (labkit.course.evidence), else "unreliable on this run (why)"."""
    check_type("seconds", seconds, dict)
    c = evidence.compare("overlapped", seconds.get("overlapped", []), "sequential", seconds.get("sequential", []),
                         " s")
    n = min(len(seconds["overlapped"]), len(seconds["sequential"]))
    said = ("faster in every run" if c.lower == "overlapped" else "slower in every run" if c.reliable
            else c.unreliable())
    return f"overlapped is {c.ratio:.2f}x as fast as sequential in the medians of {n} runs: {said}"


def bucket_timeline(layers: int, layer_seconds: float, grad_bytes: float, bucket_layers: int, n: int,
                    link: LinkModel, mode: str = "overlapped") -> float:
    """Predicted seconds of the bucketed backward of bucket_worker with the alpha-beta model: bucket b is
    ready when its last layer is computed; its all-reduce starts when it is ready and the link is free
    (overlapped) or after the whole backward (sequential), and takes link.collective of its bytes."""
    check_choice("mode", mode, MODES)
    check_positive_int("layers", layers)
    check_positive_int("bucket_layers", bucket_layers)
    check_type("link", link, LinkModel)
    free = compute_end = 0.0
    for start in range(0, layers, bucket_layers):
        k = min(bucket_layers, layers - start)
        compute_end += k * layer_seconds
        ready = compute_end if mode == "overlapped" else layers * layer_seconds
        free = max(free, ready) + link.collective("all_reduce", k * grad_bytes, n)
    return max(free, compute_end)
