"""Pipeline parallelism on real ranks: TinyLM's layers cut into stages, one per gloo process, a training
step run with the GPipe or 1F1B schedule of labkit.parallel.schedule over send/recv, and the same split
run by torch.distributed.pipelining for comparison (notebook 04, section 4).

    stage 0: tok_emb + layers[0:a]    stage 1: layers[a:b]    ...    last: layers[..] + norm + lm_head + loss

Activations [micro-batch, T, d_model] go forward with isend/recv, their gradients backward. Every rank
records (kind, micro-batch, start, end) of each operation's compute (waiting excluded), on the machine-wide
monotonic clock, for the Gantt chart and the measured bubble. A tied embedding lives on the first and the
last stage: its gradient is the sum of both copies'.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_choice, check_int, check_positive_int, fail
from ..tinylm import KVCache, TinyLM, TinyLMConfig, run_blocks
from .distributed import MAX_WORLD, Pool, shared_pool
from .schedule import SCHEDULES, measured_bubble, operations, peak_in_flight
from .tensor import rebuild_model

ACT, GRAD = 0, 1  # message tags: activations forward, gradients backward


def split_layers(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """[start, end) of each stage's layers: as even as possible, the first stages one layer more."""
    n = check_positive_int("n_layers", n_layers)
    p = check_int("stages", stages, 1, n)
    base, extra = divmod(n, p)
    out, start = [], 0
    for s in range(p):
        out.append((start, start + base + (s < extra)))
        start = out[-1][1]
    return out


class Stage(nn.Module):
    """Stage `index` of `stages` of a TinyLM: token ids in on the first stage, hidden states in otherwise;
    hidden states out, logits out on the last. Holds copies of the full model's modules it runs (`layers`
    keeps every index, None where another stage owns the block), so parameter names are the full model's,
    and runs them with TinyLM's own loop (labkit.tinylm.model.run_blocks) over its slice of the blocks."""

    def __init__(self, full: TinyLM, index: int, stages: int):
        super().__init__()
        self.start, self.end = split_layers(full.cfg.n_layers, stages)[index]
        self.first, self.last = index == 0, index == stages - 1
        self.tok_emb = copy.deepcopy(full.tok_emb) if self.first else None
        self.layers = nn.ModuleList(copy.deepcopy(block) if self.start <= i < self.end else None
                                    for i, block in enumerate(full.layers))
        self.norm = copy.deepcopy(full.norm) if self.last else None
        self.lm_head = copy.deepcopy(full.lm_head) if self.last else None
        self.register_buffer("rope_cos", full.rope_cos, persistent=False)
        self.register_buffer("rope_sin", full.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """With a cache (a full-model KVCache; this stage fills its own layers), x continues the cached
        positions; the caller advances the cache."""
        start = 0 if cache is None else cache.length
        if self.first:
            x = self.tok_emb(x)  # [B, T] ids -> [B, T, d_model]
        cos, sin = self.rope_cos[start:start + x.shape[1]], self.rope_sin[start:start + x.shape[1]]
        x = run_blocks(self.layers, x, cos, sin, cache, start, self.start, self.end)
        return self.lm_head(self.norm(x)) if self.last else x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits [B, T, V] against targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _grads(stage: Stage) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}


def pipeline_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, tokens: torch.Tensor,
                    targets: torch.Tensor, schedule: str, microbatches: int) -> dict:
    """One stage of a training step with the course's schedule: its events, loss (last stage), gradients."""
    stage = Stage(rebuild_model(cfg, state).train(), rank, world)
    xs, ys = tokens.chunk(microbatches), targets.chunk(microbatches)
    shape = (xs[0].shape[0], xs[0].shape[1], cfg.d_model)
    kept, sends, events, loss = {}, [], [], 0.0
    dist.barrier()
    for kind, i in operations(schedule, world, microbatches)[rank]:
        if kind == "F":
            x = xs[i]
            if rank > 0:
                x = torch.empty(shape)
                dist.recv(x, rank - 1, tag=ACT)
                x.requires_grad_(True)
            t0 = time.perf_counter()
            out = stage(x)
            if stage.last:
                out = loss_fn(out, ys[i]) / microbatches
                loss += float(out.detach())
            else:
                sends.append(dist.isend(out.detach().contiguous(), rank + 1, tag=ACT))
            kept[i] = (x, out)
        else:
            x, out = kept.pop(i)
            grad = None
            if not stage.last:
                grad = torch.empty(shape)
                dist.recv(grad, rank + 1, tag=GRAD)
            t0 = time.perf_counter()
            out.backward(grad)
            if rank > 0:
                sends.append(dist.isend(x.grad.contiguous(), rank - 1, tag=GRAD))
        events.append((kind, i, t0, time.perf_counter()))
    for work in sends:
        work.wait()
    return {"events": events, "loss": loss, "grads": _grads(stage)}


def library_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, tokens: torch.Tensor,
                   targets: torch.Tensor, schedule: str, microbatches: int) -> dict:
    """The same step with torch.distributed.pipelining (ScheduleGPipe / Schedule1F1B on a PipelineStage)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = Stage(rebuild_model(cfg, state).train(), rank, world)
    pipe = PipelineStage(stage, rank, world, torch.device("cpu"))
    runner = (ScheduleGPipe if schedule == "gpipe" else Schedule1F1B)(pipe, microbatches, loss_fn=loss_fn)
    losses: list[torch.Tensor] = []
    if stage.first:
        runner.step(tokens)
    elif stage.last:
        runner.step(target=targets, losses=losses)
    else:
        runner.step()
    return {"loss": float(sum(losses).detach() / microbatches) if stage.last else 0.0, "grads": _grads(stage)}


@dataclass(frozen=True)
class PipelineRun:
    """A pipelined training step: the loss, gradients by the full model's parameter names, and for the
    course's schedule each stage's (kind, micro-batch, start, end) events (seconds, start at 0)."""
    schedule: str
    stages: int
    microbatches: int
    loss: float
    grads: dict
    events: list

    @property
    def bubble(self) -> float:
        """Measured idle share of the total time (labkit.parallel.schedule.measured_bubble); only for the
        course's schedules (library=True records no events)."""
        if not any(self.events):
            raise ValueError("bubble must be measured on a run of the course's schedule (library=False): "
                             "torch.distributed.pipelining's run records no events, got library=True")
        return measured_bubble(self.events)

    @property
    def peak_in_flight(self) -> list[int]:
        """Micro-batches each stage held at once."""
        return [peak_in_flight([(e[0], e[1]) for e in stage]) for stage in self.events]


def _merge(results: list[dict]) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}
    for r in results:
        for name, g in r["grads"].items():
            name = "tok_emb.weight" if name == "lm_head.weight" else name  # tied: both copies' gradients add
            grads[name] = grads[name] + g if name in grads else g
    return grads


def pipeline_step(model: TinyLM, tokens: torch.Tensor, targets: torch.Tensor, stages: int, microbatches: int,
                  schedule: str = "1f1b", library: bool = False, pool: Pool | None = None) -> PipelineRun:
    """One training step of `model` (cross-entropy of tokens [B, T] against targets [B, T]) split into
    `stages` real processes, `microbatches` micro-batches (they must divide B), with the course's
    schedule or (library=True) torch.distributed.pipelining's. The model is not changed."""
    if not isinstance(model, TinyLM) or not model.cfg.tie_embeddings:
        fail("model", type(model).__name__, "a TinyLM with tied embeddings", TypeError)
    check_int("stages", stages, 1, min(model.cfg.n_layers, MAX_WORLD))
    check_positive_int("microbatches", microbatches)
    check_choice("schedule", schedule, SCHEDULES)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape != getattr(targets, "shape", None):
        fail("tokens", getattr(tokens, "shape", tokens), "a [B, T] tensor of token ids, targets of the same shape",
             TypeError)
    for name, t in (("tokens", tokens), ("targets", targets)):
        if t.dtype != torch.long or t.numel() == 0 or int(t.min()) < 0 or int(t.max()) >= model.cfg.vocab_size:
            fail(name, f"{t.dtype} in [{int(t.min()) if t.numel() else '-'}, {int(t.max()) if t.numel() else '-'}]",
                 f"int64 token ids in [0, {model.cfg.vocab_size - 1}]")
    if tokens.shape[1] > model.cfg.max_seq_len:
        fail("tokens", tuple(tokens.shape), f"at most max_seq_len={model.cfg.max_seq_len} positions")
    if tokens.shape[0] % microbatches:
        fail("microbatches", microbatches, f"a divisor of the batch size {tokens.shape[0]}")
    if pool is not None and pool.world != stages:
        fail("pool", pool, f"a Pool of world {stages} (= stages)")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    worker = library_worker if library else pipeline_worker
    results = (pool or shared_pool(stages)).run(worker, model.cfg, state, tokens, targets, schedule, microbatches)
    events = [r.get("events", []) for r in results]
    t0 = min((e[2] for stage in events for e in stage), default=0.0)
    events = [[(k, i, a - t0, b - t0) for k, i, a, b in stage] for stage in events]
    return PipelineRun(schedule, stages, microbatches, results[-1]["loss"], _merge(results), events)


@torch.no_grad()
def decode_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, prompt: list[int],
                  max_new_tokens: int) -> dict:
    """One stage of pipeline_generate: hidden states go forward stage by stage, the last stage picks the
    greedy token and broadcasts it to every stage. Seconds per decode step (prefill excluded) on rank 0."""
    stage = Stage(rebuild_model(cfg, state), rank, world)
    cache = KVCache(cfg, max_len=len(prompt) + max_new_tokens)
    x, out, seconds = torch.tensor([prompt]), [], []
    for step in range(max_new_tokens):
        t0 = time.perf_counter()
        if rank > 0:
            x = torch.empty(1, len(prompt) if step == 0 else 1, cfg.d_model)
            dist.recv(x, rank - 1, tag=ACT)
        y = stage(x, cache)
        cache.advance(y.shape[1])
        if not stage.last:
            dist.send(y.contiguous(), rank + 1, tag=ACT)
        token = torch.tensor([int(y[0, -1].argmax()) if stage.last else 0])
        dist.broadcast(token, world - 1)
        out.append(int(token))
        x = token.view(1, 1)
        if step:
            seconds.append(time.perf_counter() - t0)
    return {"tokens": out, "seconds": seconds}


def pipeline_generate(model: TinyLM, prompt: list[int], max_new_tokens: int, stages: int,
                      pool: Pool | None = None) -> dict:
    """Greedy generation with TinyLM's layers in `stages` real processes: {"tokens", "seconds" per decode
    step (rank 0's: one token's trip through every stage and the broadcast back)}."""
    if not isinstance(model, TinyLM):
        fail("model", type(model).__name__, "a TinyLM", TypeError)
    check_int("stages", stages, 1, min(model.cfg.n_layers, MAX_WORLD))
    check_positive_int("max_new_tokens", max_new_tokens)
    prompt = [check_int("each prompt token", t, 0, model.cfg.vocab_size - 1) for t in prompt]
    if not prompt or len(prompt) + max_new_tokens > model.cfg.max_seq_len:
        fail("max_new_tokens", max_new_tokens,
             f"<= {model.cfg.max_seq_len - len(prompt)} with a prompt of {len(prompt)}")
    if pool is not None and pool.world != stages:
        fail("pool", pool, f"a Pool of world {stages} (= stages)")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    runs = (pool or shared_pool(stages)).run(decode_worker, model.cfg, state, prompt, max_new_tokens)
    return {"tokens": runs[0]["tokens"], "seconds": runs[0]["seconds"]}


def predicted_decode_seconds(cfg, stages: int, link, single_seconds: float, bytes_per_element: int = 4) -> float:
    """Seconds per decode step of one sequence over `stages` stages: the single-process step (the stages run
    one after another), plus stages - 1 sends of d_model elements and a broadcast of the token
    (ceil(log2 stages) messages), priced by `link` (a LinkModel)."""
    p = check_positive_int("stages", stages)
    hops = math.ceil(math.log2(p)) if p > 1 else 0
    return single_seconds + (p - 1) * link.send(cfg.d_model * bytes_per_element) + hops * link.send(8)
