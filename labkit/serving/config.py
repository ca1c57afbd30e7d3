"""EngineConfig: the one owner of an engine's configuration (notebook 06; `python -m labkit.serving` and lab 07's
service build theirs from it). Checked once, then resolved against the model and the runner's pool:

    EngineConfig(max_num_seqs=8)            what the caller asked for (None: "the default for this model")
        .resolve(cfg)                       -> num_blocks = max_num_seqs full contexts, block_size 16, budget
        .resolve(cfg, pool=(64, 8))         -> the pool a runner allocated (ModelRunner / TPRunner report it);
                                               a num_blocks or block_size that disagrees with it is refused

The engine's block manager and the runner's KV pools are built from the same resolved numbers, so a block
table can never point past the pool (nano-vllm's model runner writes config.num_kvcache_blocks the same way).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .._checks import check_bool, check_choice, check_int, check_positive, check_positive_int, check_type, fail
from ..kv_cache import blocks_needed, check_block_size
from ..tinylm import TinyLMConfig
from .batch import StepCost
SCHEDULING_POLICIES = ("static", "continuous", "chunked")  # labkit.serving.scheduler's docstring says what each does
PREEMPTION_MODES = ("recompute", "swap")
QUEUE_ORDERS = ("fcfs", "shortest_prompt", "shortest_job")  # the order inside a priority: scheduler's docstring

DEFAULT_BLOCK_SIZE = 16
"""tokens per KV block when neither the caller nor the runner says (vLLM's default on GPUs)"""


@dataclass(frozen=True)
class EngineConfig:
    """What an Engine runs with. None means "derive it": num_blocks -> room for max_num_seqs full contexts (no
    request is ever preempted), block_size -> 16, max_num_batched_tokens -> one whole context per step (at
    least max_num_seqs), or 64 under chunked prefill. clock: "wall", "measured" or a StepCost (Engine's
    docstring); order: who goes first among requests of one priority, one of QUEUE_ORDERS (Scheduler's
    docstring); hash_mm=False: the naive prefix cache that hashes token ids only (notebook 07)."""
    block_size: int | None = None
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    policy: str = "continuous"
    preemption: str = "recompute"
    max_wait: float | None = None
    order: str = "fcfs"
    enable_prefix_caching: bool = True
    hash_mm: bool = True
    seed: int = 0
    clock: str | StepCost = "wall"
    history_limit: int | None = None

    def __post_init__(self):
        if self.block_size is not None:
            check_block_size(self.block_size)
        if self.num_blocks is not None:
            check_positive_int("num_blocks", self.num_blocks, "KV blocks")
        check_positive_int("max_num_seqs", self.max_num_seqs, "requests")
        if self.max_num_batched_tokens is not None:
            check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens, "tokens per step")
            if self.max_num_batched_tokens < self.max_num_seqs:
                fail("max_num_batched_tokens", self.max_num_batched_tokens,
                     f">= max_num_seqs ({self.max_num_seqs}): every running request decodes one token per step")
        check_choice("policy", self.policy, SCHEDULING_POLICIES)
        check_choice("preemption", self.preemption, PREEMPTION_MODES)
        if self.max_wait is not None:
            check_positive("max_wait", self.max_wait, "seconds")
        check_choice("order", self.order, QUEUE_ORDERS)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_bool("hash_mm", self.hash_mm)
        check_int("seed", self.seed, 0)
        if not (self.clock in ("wall", "measured") or isinstance(self.clock, StepCost)):
            fail("clock", self.clock, '"wall", "measured" or a StepCost')
        if self.history_limit is not None:
            check_positive_int("history_limit", self.history_limit, "steps")

    @classmethod
    def build(cls, config: "EngineConfig | None" = None, **options) -> "EngineConfig":
        """`config` (default EngineConfig()) with `options` replacing its fields; an unknown option is refused
        with the list of the known ones."""
        config = cls() if config is None else check_type("config", config, cls, "an EngineConfig or None")
        names = [f.name for f in fields(cls)]
        for name in options:
            if name not in names:
                fail("option", name, f"one of EngineConfig's fields: {', '.join(names)}", TypeError)
        return replace(config, **options)

    def resolve(self, cfg: TinyLMConfig, pool: tuple[int, int] | None = None) -> "EngineConfig":
        """This config with every None filled in for the model `cfg`. pool: (num_blocks, block_size) of the KV
        pool a runner has already allocated; num_blocks and block_size are taken from it, and refused if this
        config asked for others."""
        check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
        block_size, num_blocks = self.block_size, self.num_blocks
        if pool is not None:
            have_blocks, have_size = pool
            for name, asked, have in (("block_size", block_size, have_size), ("num_blocks", num_blocks, have_blocks)):
                if asked is not None and asked != have:
                    fail(name, asked, f"the runner's pool ({have_blocks} blocks of {have_size} tokens), or None to "
                         f"take it from the runner")
            block_size, num_blocks = have_size, have_blocks
        block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        if num_blocks is None:
            num_blocks = self.max_num_seqs * blocks_needed(cfg.max_seq_len, block_size)
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = max(64, self.max_num_seqs) if self.policy == "chunked" else max(cfg.max_seq_len, self.max_num_seqs)
        return replace(self, block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget)

    @property
    def resolved(self) -> bool:
        """Are the pool and the token budget known (resolve() was called)?"""
        return None not in (self.block_size, self.num_blocks, self.max_num_batched_tokens)
