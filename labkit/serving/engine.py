"""The serving engine (notebook 06, sections 2-5): requests in, one scheduler step and one batched forward per
step(), tokens out. It owns the requests (Sequence), the scheduler (queues) and the block manager (blocks);
the model runner owns the model and the KV pools (one per tensor-parallel rank).

    engine = Engine(model, policy="continuous")      # or Engine(model, config=EngineConfig(...))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=20, temperature=0))
    while engine.has_unfinished():
        for out in engine.step(): ...          # StepOutput(request_id, token_id, finished, finish_reason)

Time. Every request's arrival and token times are on the engine's clock, in seconds:
    "wall"       the real time since the engine started (the HTTP service)
    "measured"   advances by the measured wall time of each step; idle time between arrivals is skipped
                 (offline replays of a trace: real compute times without sleeping)
    StepCost     advances by a modelled time per step (deterministic: tests and analytic notebook cells)
The engine is not thread-safe: one thread calls it (labkit.serving.service serialises the HTTP requests).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from typing import Callable, Iterable, Iterator, Sequence as Seq

import torch

from .._checks import check_number, check_positive_int, check_type, fail
from ..kv_cache import BlockManager
from ..tinylm import check_tinylm
from .batch import StepCost, StepInput, StepOutput  # StepCost, StepOutput: re-exported (lab 06 API)
from .mm import MultiModalInput, step_embeds
from .config import EngineConfig
from .runner import ModelRunner, Runner, check_runner
from .sampling import SamplingParams, make_generator, sample_batch
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence, Status, check_request


class Engine:
    """A TinyLM serving engine over a paged KV cache. Give `model` (a TinyLM, run in this process by a
    ModelRunner the engine builds) or `runner` (a Runner that already allocated its pool: ModelRunner,
    labkit.serving.tp's TPRunner); `config` (EngineConfig) and/or its fields as keywords say the rest
    (Engine(model, max_num_seqs=8, clock=StepCost())). With a runner, the block manager is built from the
    runner's pool (num_blocks x block_size): a config that asks for another pool is refused. Requests may carry
    images (add_request(mm=...), labkit.serving.mm). close() closes the runner (a TPRunner's ranks)."""

    def __init__(self, model=None, *, runner: Runner | None = None, config: EngineConfig | None = None, **options):
        if (model is None) == (runner is None):
            fail("model", model, "a TinyLM, or None with a runner (exactly one of the two)", TypeError)
        config = EngineConfig.build(config, **options)
        if runner is None:
            self.cfg = check_tinylm(model).cfg
            self.config = config.resolve(self.cfg)
            runner = ModelRunner(model, self.config.num_blocks, self.config.block_size)
        else:
            self.cfg = check_runner(runner).cfg
            self.config = config.resolve(self.cfg, pool=(runner.num_blocks, runner.block_size))
        c = self.config
        self.runner = runner
        self.block_manager = BlockManager(c.num_blocks, c.block_size, c.enable_prefix_caching, self.cfg.vocab_size,
                                          c.hash_mm)
        self.scheduler = Scheduler(self.block_manager, c)
        self.seed, self.clock = c.seed, c.clock
        self._t0 = time.perf_counter()
        self._now = 0.0
        self.requests: dict[str, Sequence] = {}  # every request until release() forgets a finished one
        self._ids = itertools.count()
        self._drops: list[str] = []
        self.steps = 0
        self.generated_tokens = 0
        self.num_requests = 0
        # one entry per step: time, seconds, tokens, the requests in the batch (the last history_limit steps)
        self.history: deque[dict] = deque(maxlen=c.history_limit)

    def close(self) -> None:
        """Close the runner (a TPRunner stops its rank processes); a one-process engine has nothing to stop."""
        self.runner.close()

    # --- time ---------------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The engine's clock, seconds (see the module docstring)."""
        return time.perf_counter() - self._t0 if self.clock == "wall" else self._now

    def advance_to(self, t: float) -> None:
        """Skip idle time up to `t` seconds (offline clocks only; the wall clock runs by itself)."""
        if self.clock == "wall":
            fail("clock", "wall", 'an offline clock ("measured" or a StepCost) to skip idle time')
        self._now = max(self._now, check_number("t", t, low=0.0))

    # --- requests -----------------------------------------------------------------------------------------

    def add_request(self, prompt: Seq[int], params: SamplingParams | None = None, request_id: str | None = None,
                    priority: int = 0, arrival: float | None = None, mm: Seq[MultiModalInput] = ()) -> str:
        """Queue a request; returns its id (request_id, or "req-N" when None). `mm`: its images (placeholder
        ranges of the prompt with their features, labkit.serving.mm). Everything is checked before anything is
        queued."""
        generated = False
        params = SamplingParams() if params is None else params
        while request_id is None or request_id in self.requests and generated:  # never a name a caller used
            request_id, generated = f"req-{next(self._ids)}", True
        seq = Sequence(request_id, prompt, params, self.now if arrival is None else arrival, priority, mm)
        if request_id in self.requests:
            fail("request_id", request_id, "a new request id (this one is already taken)")
        check_request(seq, self.cfg)
        self.scheduler.add(seq)  # refuses (LargerThanPoolError) a request larger than the whole KV pool
        if not params.greedy:
            seed = params.seed if params.seed is not None else int.from_bytes(
                hashlib.sha256(f"{self.seed}:{request_id}".encode()).digest()[:7], "little")  # stable per request
            seq.generator = make_generator(seed)
        self.requests[request_id] = seq
        self.num_requests += 1
        return request_id

    def get(self, request_id: str) -> Sequence:
        """The request `request_id` (a Sequence: its tokens, state and timestamps)."""
        if request_id not in self.requests:
            fail("request_id", request_id, "the id of a request this engine was given")
        return self.requests[request_id]

    def release(self, request_id: str) -> Sequence:
        """Forget a finished request (a long-running service calls it, so memory does not grow); returns it."""
        seq = self.get(request_id)
        if not seq.finished:
            fail("request_id", request_id, "a finished request (abort it first)")
        return self.requests.pop(request_id)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; False if it is unknown or already finished."""
        seq = self.requests.get(request_id)
        if seq is None or seq.finished:
            return False
        self._end(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        """Is there work for step(): a request not finished, or an aborted request's host copy to drop?"""
        return self.scheduler.num_unfinished > 0 or bool(self._drops)

    # --- one step -----------------------------------------------------------------------------------------

    def _step_input(self, sched: SchedulerOutput) -> StepInput:
        bm, bs = self.block_manager, self.block_manager.block_size
        tokens, positions, slots, tables = [], [], [], []
        for s in sched.scheduled:
            table = bm.block_table(s.seq.request_id)
            pos = range(s.start, s.start + s.num_tokens)
            tokens += s.seq.tokens[s.start:s.start + s.num_tokens]
            positions += pos
            slots += [table[p // bs] * bs + p % bs for p in pos]
            tables.append(table)
        drops, self._drops = self._drops, []
        return StepInput(torch.tensor(tokens, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                         torch.tensor(slots, dtype=torch.long), [s.num_tokens for s in sched.scheduled],
                         [s.start + s.num_tokens for s in sched.scheduled], tables,
                         [i for i, s in enumerate(sched.scheduled) if s.samples], bm.take_copies(),
                         sched.swap_out, [(k, f, b) for k, f, b in sched.swap_in], drops, step_embeds(sched.scheduled))

    def step(self) -> list[StepOutput]:
        """One scheduler step and one batched forward; the tokens it produced (see the module docstring)."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule(self.now)
        step = self._step_input(sched)
        try:
            logits = self.runner.execute(step)
            sampled = [sched.scheduled[i].seq for i in step.sample_rows]
            tokens = sample_batch(logits, [s.params for s in sampled], [s.generator for s in sampled]) \
                if sampled else []
        except BaseException as e:
            self._fail_step(sched, step, e)
            raise
        for s in sched.scheduled:
            self.block_manager.mark_computed(s.seq.request_id, s.start + s.num_tokens)
        seconds = time.perf_counter() - t0
        if self.clock == "measured":
            self._now += seconds
        elif isinstance(self.clock, StepCost):
            self._now += self.clock.seconds(step.num_tokens, step.num_seqs)
        now, outputs = self.now, []
        for seq, token in zip(sampled, tokens):
            seq.output.append(token)
            seq.token_times.append(now)
            reason = "stop" if token in seq.params.stop_token_ids else \
                "length" if seq.num_output_tokens >= seq.params.max_tokens else None
            if reason:
                self.scheduler.finish(seq)
                seq.finish(reason)
            outputs.append(StepOutput(seq.request_id, token, reason is not None, reason))
        self.steps += 1
        self.generated_tokens += len(tokens)
        self.history.append({"time": now, "seconds": seconds, "tokens": step.num_tokens,
                             "batch": [(s.seq.request_id, s.num_tokens) for s in sched.scheduled],
                             "preempted": [s.request_id for s in sched.preempted]})
        return outputs

    def _fail_step(self, sched: SchedulerOutput, step: StepInput, error: BaseException) -> None:
        """The runner (or sampling) raised: the step's requests end with finish_reason "error" and their blocks
        are freed (their KV holds no known state), host copies still to drop are kept for the next step, and
        every other request goes on: the engine stays usable."""
        self._drops = step.drop + self._drops
        keys = [s.seq.request_id for s in sched.scheduled] + [k for k, _ in step.swap_out] + \
            [k for k, _, _ in step.swap_in]
        why = f"the model runner failed: {type(error).__name__}: {error}"
        for rid in dict.fromkeys(keys):
            seq = self.requests.get(rid)
            if seq is not None and not seq.finished:
                self._end(seq, "error", why)

    def _end(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        if seq.status is Status.SWAPPED:
            self._drops.append(seq.request_id)  # its host copy goes with the next step
        self.scheduler.abort(seq)
        seq.finish(reason, error)

    # --- whole runs ---------------------------------------------------------------------------------------

    def warmup(self) -> None:
        """One one-token forward through the runner (every rank), then everything is as before: the service
        reports healthy only after this succeeded."""
        bm, rid = self.block_manager, "__warmup__"
        bm.allocate(rid, [0])
        try:
            table = bm.block_table(rid)
            one = torch.zeros(1, dtype=torch.long)
            self.runner.execute(StepInput(one, one, torch.tensor([table[0] * bm.block_size]), [1], [1], [table],
                                          [0]))
        finally:
            bm.free(rid)

    def run_until_done(self, max_steps: int | None = None) -> None:
        """Step until every request has finished (at most max_steps steps)."""
        if max_steps is not None:
            check_positive_int("max_steps", max_steps, allow_zero=True)
        for _ in range(max_steps) if max_steps is not None else itertools.count():
            if not self.has_unfinished():
                return
            self.step()

    def generate(self, prompts: Iterable[Seq[int]], params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[list[int]]:
        """Offline: run `prompts` to completion together; their output token ids, in order. All or nothing: when
        one request is refused, or a step fails, every one of them is taken out again (the engine stays usable)."""
        prompts = list(prompts)
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            fail("params", f"{len(params)} SamplingParams", f"one per prompt ({len(prompts)})")
        ids: list[str] = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.add_request(p, sp))
            self.run_until_done()
        except BaseException:  # a refusal, a runner that failed, an interrupt: none of these requests stays
            for rid in ids:
                self.abort(rid)
                self.release(rid)
            raise
        return [self.requests[i].output for i in ids]

    def replay(self, trace, params: SamplingParams | None = None) -> Iterator[list[StepOutput]]:
        """Replay `trace` (objects with request_id, arrival, prompt, max_tokens and priority: labkit.serving.
        workload.TraceRequest) on an offline clock, one step per next(): each request is added once the clock
        reaches its arrival, idle time is skipped; each next() returns that step's outputs. `params` (default
        greedy) gives every other sampling field. The trace is checked here, before any step. run() drives it to
        the end; benchmarks/serving_batching.py drives several engines' replays in turns, on one thread."""
        if self.clock == "wall":
            fail("clock", "wall", 'an offline clock ("measured" or a StepCost) to replay a trace')
        base = SamplingParams(temperature=0) if params is None else check_type("params", params, SamplingParams)
        trace = list(trace)
        fields = ("request_id", "arrival", "prompt", "max_tokens", "priority")
        for i, r in enumerate(trace):
            if not all(hasattr(r, f) for f in fields):
                fail(f"trace[{i}]", r, f"a request with {', '.join(fields)} (labkit.serving.TraceRequest)", TypeError)
        ids = [r.request_id for r in trace]
        taken = [i for i in ids if i in self.requests] + [i for n, i in enumerate(ids) if i in ids[:n]]
        if taken:
            fail("trace", f"request id {taken[0]!r} twice (or already in this engine)", "distinct new request ids")
        return self._replay(sorted(trace, key=lambda r: r.arrival), base)

    def _replay(self, pending: list, base: SamplingParams) -> Iterator[list[StepOutput]]:
        while pending or self.has_unfinished():
            if not self.has_unfinished() and pending[0].arrival > self.now:
                self.advance_to(pending[0].arrival)
            while pending and pending[0].arrival <= self.now:
                r = pending.pop(0)
                sp = SamplingParams(**{**base.__dict__, "max_tokens": r.max_tokens})
                self.add_request(list(r.prompt), sp, r.request_id, r.priority, r.arrival)
            yield self.step()

    def run(self, trace, params: SamplingParams | None = None, progress: Callable | None = None) -> list[Sequence]:
        """replay(trace, params) to the end, calling progress(engine) after every step; the finished requests,
        in trace order."""
        if progress is not None and not callable(progress):
            fail("progress", progress, "a function progress(engine), called after every step, or None", TypeError)
        trace = list(trace)
        for _ in self.replay(trace, params):
            if progress is not None:
                progress(self)
        return [self.requests[r.request_id] for r in trace]

    def stats(self) -> dict:
        """What /metrics reports: queue lengths, KV usage, prefix-cache tokens, preemptions, totals."""
        bm = self.block_manager
        used = bm.num_used_blocks
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "swapped": len(self.scheduler.swapped), "kv_blocks_used": used, "kv_blocks_total": bm.num_blocks,
                "kv_usage": used / bm.num_blocks, "prefix_cache_queries": bm.prompt_tokens,
                "prefix_cache_hits": bm.cached_tokens, "preemptions": self.scheduler.num_preemptions,
                "steps": self.steps, "generated_tokens": self.generated_tokens,
                "requests": self.num_requests}
