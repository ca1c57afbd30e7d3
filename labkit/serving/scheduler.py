"""The scheduler: which requests run in the next step and how many of their tokens (notebook 06, sections 2-3).
It owns three queues (waiting, running, swapped); the BlockManager (labkit.kv_cache) owns the blocks.

Policies, with a token budget per step (max_num_batched_tokens) and at most max_num_seqs running:

    static       a batch is admitted only when nothing runs; it runs until its longest request ends
                 (requests that arrive meanwhile wait): the batching before Orca
    continuous   every step: every running request decodes one token, then waiting requests join while
                 their whole prompt fits the budget and the blocks (Orca's iteration-level scheduling, vLLM)
    chunked      the same, but the last prompt admitted may be split to fill the budget exactly; every step
                 schedules the decodes first, then the prefill chunks of running requests, then new ones
                 (chunked prefill, Sarathi-Serve / vLLM): a long prompt never stalls the others' next tokens

Order: a lower `priority` value first; inside one priority, by `order` (EngineConfig.order):

    fcfs             earlier arrival first (first come, first served)
    shortest_prompt  fewer prompt tokens first: a short prefill gets its first token sooner
    shortest_job     fewer predicted remaining output tokens first (predicted shortest job first): the
                     prediction is max_tokens minus the tokens already produced, exact when outputs run to
                     max_tokens (the course's traces) and an upper bound otherwise; each output token is one
                     decode step, so it predicts a request's remaining time. A learned length predictor
                     (Qiu et al. 2024; Fu et al. 2024) would take its place in a real server
    ties: earlier arrival, then request id

Starvation bound (max_wait, None = none): a request that arrived `max_wait` seconds ago or more counts as the
most urgent (priority -inf; aged requests among themselves by arrival), so no later arrival is admitted before
it once it has aged, and it is admitted at the latest once the earlier arrivals ahead of it have been (aging).
Without it, a length order starves a long request as long as shorter ones keep arriving.

Out of blocks: a running request that needs a new block for its next token preempts the running request
that comes LAST in that order (lowest priority, then the latest arrival or the longest; itself if it is last)
until the block is there. Recompute frees the victim's blocks; it waits again with its output so far and is
prefilled again (prompt + output) when re-admitted. Swap copies the victim's computed blocks to host memory first; it is
swapped back in (before any new admission) when blocks allow. Either way its tokens are kept and it
finishes like the others. A request whose prompt + max_tokens needs more blocks than the whole pool could
never finish: the engine refuses it at admission (LargerThanPoolError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._checks import check_type, fail
from ..kv_cache import BlockManager, LargerThanPoolError, blocks_needed
from .config import SCHEDULING_POLICIES, EngineConfig  # noqa: F401 (SCHEDULING_POLICIES: notebook 06 reads it here)
from .sequence import Sequence, Status


@dataclass
class Scheduled:
    """`num_tokens` tokens of `seq` computed this step, starting at position `start`."""
    seq: Sequence
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Does this step reach the sequence's last token (so a new token is sampled)?"""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """One step's plan: what runs (scheduled), who was preempted, and the swaps the runner must do first."""
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[str, list[int]]] = field(default_factory=list)
    swap_in: list[tuple[str, int, list[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    """The queues and the policy (see the module docstring); admission, preemption and swapping reserve and free
    blocks through `block_manager`. The engine calls add, schedule (once per step), finish and abort. Policy,
    limits and preemption come from `config` (an EngineConfig, checked there; its token budget must be set:
    EngineConfig.resolve fills it in)."""

    def __init__(self, block_manager: BlockManager, config: EngineConfig):
        if not isinstance(block_manager, BlockManager):
            fail("block_manager", block_manager, "a labkit.kv_cache.BlockManager", TypeError)
        check_type("config", config, EngineConfig, "an EngineConfig")
        if config.max_num_batched_tokens is None:
            fail("config.max_num_batched_tokens", None,
                 "a number of tokens per step (EngineConfig.resolve fills it in)")
        self.bm = block_manager
        self.policy, self.preemption, self.max_wait = config.policy, config.preemption, config.max_wait
        self.queue_order = config.order
        self.max_num_seqs, self.max_num_batched_tokens = config.max_num_seqs, config.max_num_batched_tokens
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.num_preemptions = 0

    # --- requests in and out ------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new request; refuses one that could never fit the pool (nothing is queued then)."""
        if not isinstance(seq, Sequence):
            fail("seq", seq, "a labkit.serving.Sequence", TypeError)
        slots = seq.max_total_tokens - 1  # the last token is sampled, never fed back: its K/V are not stored
        if blocks_needed(slots, self.bm.block_size) > self.bm.num_blocks:
            raise LargerThanPoolError(
                f"request {seq.request_id!r}: prompt {seq.num_prompt_tokens} + max_tokens {seq.params.max_tokens} "
                f"tokens need {slots} KV slots = {blocks_needed(slots, self.bm.block_size)} blocks of "
                f"{self.bm.block_size}, the whole KV pool has {self.bm.num_blocks}: lower max_tokens or the prompt")
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """A running request is done: it leaves at once and its blocks are released."""
        self.running.remove(seq)
        self.bm.free(seq.request_id)

    def abort(self, seq: Sequence) -> bool:
        """Remove `seq` wherever it is; True if it held blocks (then they are freed), False otherwise. A
        swapped sequence's host copy is the caller's to drop."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        held = seq.request_id in self.bm.seq_ids
        if held:
            self.bm.free(seq.request_id)
        return held

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # --- one step -----------------------------------------------------------------------------------------

    def order(self, seq: Sequence, now: float) -> tuple:
        """Sort key: aged requests first (by arrival), then priority, then the queue order's length (0 under
        fcfs), then arrival (see the module docstring)."""
        # running too: an aged request is never the victim
        aged = self.max_wait is not None and now - seq.arrival >= self.max_wait
        if aged:
            return (-math.inf, 0, seq.arrival, seq.request_id)
        return (seq.priority, self.length(seq), seq.arrival, seq.request_id)

    def length(self, seq: Sequence) -> int:
        """What the queue order ranks by inside a priority (tokens): 0 (fcfs), the prompt's tokens
        (shortest_prompt) or the predicted remaining output tokens, max_tokens - produced (shortest_job)."""
        if self.queue_order == "shortest_prompt":
            return seq.num_prompt_tokens
        if self.queue_order == "shortest_job":
            return seq.params.max_tokens - seq.num_output_tokens
        return 0

    def schedule(self, now: float) -> SchedulerOutput:
        """Pick this step's work; reserves the slots it will write (block_manager.append / allocate)."""
        out, budget = SchedulerOutput(), self.max_num_batched_tokens
        self.running.sort(key=lambda s: self.order(s, now))
        queue, kept = list(self.running), []
        while queue:  # reserve each running request's next slots, preempting from the end of the order
            seq = queue.pop(0)
            if self._reserve(seq, queue, out, now):
                kept.append(seq)
        self.running = kept
        todo = {s.request_id: s.num_tokens - self.bm.num_computed(s.request_id) for s in kept}
        for seq in sorted(kept, key=lambda s: todo[s.request_id] > 1):  # decodes first, then prefill chunks
            n = min(todo[seq.request_id], budget) if self.policy == "chunked" else todo[seq.request_id]
            if n >= 1:  # else no budget is left: it waits for the next step, keeping its blocks
                out.scheduled.append(Scheduled(seq, self.bm.num_computed(seq.request_id), n))
                budget -= n
        if self.swapped:
            budget = self._swap_in(out, budget, now)
        if not self.swapped and not out.preempted and (self.policy != "static" or not self.running):
            self._admit(out, budget, now)
        for s in out.scheduled:
            if s.seq.first_scheduled is None:
                s.seq.first_scheduled = now
        return out

    def _reserve(self, seq: Sequence, queue: list[Sequence], out: SchedulerOutput, now: float) -> bool:
        """Reserve the slots of seq's tokens that the block manager does not hold yet (its last sampled
        token), preempting from the end of `queue` (then seq itself) while blocks are short."""
        rid = seq.request_id
        while self.bm.num_tokens(rid) < seq.num_tokens:
            while not self.bm.can_append(rid):
                victim = queue.pop() if queue else seq
                self._preempt(victim, out)
                if victim is seq:
                    return False
            self.bm.append(rid, seq.tokens[self.bm.num_tokens(rid)])
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        rid = seq.request_id
        if self.preemption == "swap":
            computed = self.bm.num_computed(rid)
            out.swap_out.append((rid, self.bm.block_table(rid)[:-(-computed // self.bm.block_size)]))
            seq.swapped_tokens = computed
            seq.status = Status.SWAPPED
            self.swapped.append(seq)
        else:
            seq.status = Status.WAITING
            self.waiting.append(seq)
        self.bm.free(rid)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]

    def _swap_in(self, out: SchedulerOutput, budget: int, now: float) -> int:
        self.swapped.sort(key=lambda s: self.order(s, now))
        while self.swapped and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.swapped[0]
            if not self.bm.can_allocate(seq.tokens, seq.mm_spans):
                break
            rid, done = seq.request_id, seq.swapped_tokens
            hits = self.bm.allocate(rid, seq.tokens, seq.mm_spans)
            host = -(-done // self.bm.block_size)   # blocks on the host
            first = min(hits // self.bm.block_size, host)  # the prefix cache's blocks are not copied back
            out.swap_in.append((rid, first, self.bm.block_table(rid)[first:host]))
            self.bm.mark_computed(rid, max(hits, done))
            self.swapped.pop(0)
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = seq.num_tokens - self.bm.num_computed(rid)
            n = min(n, budget) if self.policy == "chunked" else n
            out.scheduled.append(Scheduled(seq, self.bm.num_computed(rid), n))
            budget -= n
        return budget

    def _admit(self, out: SchedulerOutput, budget: int, now: float) -> None:
        self.waiting.sort(key=lambda s: self.order(s, now))
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.policy == "continuous" and seq.num_tokens > budget and self.running:
                break  # whole prompts only; a prompt larger than the budget runs alone in its own step
            if (self.policy == "chunked" and budget < 1) or not self.bm.can_allocate(seq.tokens, seq.mm_spans):
                break
            hits = self.bm.allocate(seq.request_id, seq.tokens, seq.mm_spans)
            n = seq.num_tokens - hits
            n = min(n, budget) if self.policy == "chunked" else n
            self.waiting.pop(0)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append(Scheduled(seq, hits, n))
            budget -= n
