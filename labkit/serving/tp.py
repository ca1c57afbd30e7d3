"""Tensor-parallel serving (notebook 06, section 6: `python -m labkit.serving --tp 2`): the engine stays in this
process and the model runs split over `tp` gloo ranks (lab 04's Pool and Megatron split, ShardedTinyLM).

    engine process                                   rank r (one spawned process each)
    scheduler, block manager, sampling               ModelRunner(ShardedTinyLM rank r, KV pools of its
      |  StepInput (picklable: tokens, slots,            n_kv_heads / tp heads, host swap space)
      |  block tables, swaps, copies)                   |
      +-- pool.run(step_worker, runner_id, step) -->  execute(step): swaps, copies, forward; two
      <-- rank 0's logits [rows to sample, vocab] --     all-reduces per layer, one all-gather of the logits

The weights travel once, when the TPRunner is built; or not at all: TPRunner.from_builder runs a build
function on every rank, which loads that rank's own slices from the files (lab 07: build_rank_model), so no
rank ever receives a weight from the engine process. Each step sends only the StepInput and brings back the
logits of the rows to sample (every rank computes the same full logits through the all-gather; rank 0's are
returned). Each rank keeps its ModelRunner in a module-level dict keyed by the runner's id, so two TPRunners
can share one Pool. A rank that fails ends the group (Pool): execute() raises the Pool's RankError naming the
rank, and the TPRunner is closed from then on, saying why. Swapped-out KV blocks live in each rank's host
memory (its own KV heads), as in vLLM.

    runner = TPRunner(model, tp=2, num_blocks=256, block_size=16)   # or tp_engine(model, 2, ...)
    engine = Engine(runner=runner)                 # the engine does not change; its blocks are the runner's
    runner = TPRunner.from_builder(build, (folder,), cfg, 2, 256, 16)  # build(rank, world, folder) on each rank
"""

from __future__ import annotations

import itertools
import os
from typing import Callable

import torch

from .._checks import check_positive, check_positive_int, check_type, fail
from ..kv_cache import check_block_size
from ..parallel import Pool, RankError, tensor
from ..tinylm import TinyLM, TinyLMConfig
from .batch import StepInput
from .config import EngineConfig
from .engine import Engine
from .runner import ModelRunner

_RUNNERS: dict[str, ModelRunner] = {}
"""In each rank's process: that rank's ModelRunner of every TPRunner built on its Pool, by runner id."""

_IDS = itertools.count()


def rebuild_shard(rank: int, world: int, cfg: TinyLMConfig, state: dict) -> tensor.ShardedTinyLM:
    """The builder of TPRunner(model, ...): rank `rank`'s shard of the full weights the engine process sent."""
    return tensor.ShardedTinyLM(tensor.rebuild_model(cfg, state), rank, world)


def setup_worker(rank: int, world: int, runner_id: str, build: Callable, build_args: tuple, cfg: TinyLMConfig,
                 num_blocks: int, block_size: int) -> int:
    """On every rank: build(rank, world, *build_args) -> its shard of the model (anything with a TinyLM cfg and
    the forward of labkit.parallel.tensor.ShardedTinyLM), then its KV pools; returns the pools' bytes."""
    sharded = build(rank, world, *build_args)
    runner = ModelRunner(sharded, num_blocks, block_size, cfg=tensor.shard_config(cfg, world),
                         pools=getattr(sharded, "kv_pools", None))  # a builder may hand over planned pools (lab 07)
    _RUNNERS[runner_id] = runner
    return runner.nbytes()


def step_worker(rank: int, world: int, runner_id: str, step: StepInput) -> torch.Tensor | None:
    """On every rank: one engine step on its shard; rank 0 returns the logits (the others' are the same)."""
    if runner_id not in _RUNNERS:
        raise KeyError(f"runner {runner_id} is not on rank {rank}: its pool was restarted since it was built")
    logits = _RUNNERS[runner_id].execute(step)
    return logits if rank == 0 else None


def close_worker(rank: int, world: int, runner_id: str) -> None:
    """On every rank: forget the runner (its shard, KV pools and host copies)."""
    _RUNNERS.pop(runner_id, None)


class TPRunner:
    """The engine's model runner over `tp` gloo ranks: anything with cfg and execute(StepInput) is one.

    model: the full TinyLM (its weights are sent once); tp: ranks, a divisor of the heads, KV heads, d_ff and
    vocabulary (refused before any process starts); num_blocks x block_size: the KV pool, on every rank
    (each holds n_kv_heads / tp heads of every block); pool: a Pool of world tp to run on (None: start one,
    closed by close()); timeout: seconds one step (or the setup) may take on the ranks."""

    def __init__(self, model: TinyLM, tp: int, num_blocks: int, block_size: int, pool: Pool | None = None,
                 timeout: float = 30):
        if pool is not None:
            check_type("pool", pool, Pool, "a labkit.parallel.Pool")
        cfg, state = tensor.tp_inputs(model, tp, pool)  # checks model, tp and the pool's world
        self._start(rebuild_shard, (cfg, state), cfg, tp, num_blocks, block_size, pool, timeout)

    @classmethod
    def from_builder(cls, build: Callable, build_args: tuple, cfg: TinyLMConfig, tp: int, num_blocks: int,
                     block_size: int, pool: Pool | None = None, timeout: float = 30) -> "TPRunner":
        """A TPRunner whose ranks build their own shard: build(rank, world, *build_args) runs on every rank (a
        module-level function, as Pool requires; lab 07's loads the rank's slices from a release). `cfg` is the
        full model's config (the engine's; tp is checked against it before any process starts)."""
        if not callable(build) or "<" in getattr(build, "__qualname__", "<"):
            fail("build", build, "a module-level function build(rank, world, *build_args) (the ranks import it)",
                 TypeError)
        check_type("build_args", build_args, tuple, "a tuple of the builder's arguments")
        check_type("cfg", cfg, TinyLMConfig, "the model's TinyLMConfig (or a subclass)")
        tensor.check_tp(cfg, tp)
        if pool is not None and check_type("pool", pool, Pool, "a labkit.parallel.Pool").world != tp:
            fail("pool", pool, f"a Pool of world {tp} (= tp)")
        runner = cls.__new__(cls)
        runner._start(build, build_args, cfg, tp, num_blocks, block_size, pool, timeout)
        return runner

    def _start(self, build, build_args, cfg, tp, num_blocks, block_size, pool, timeout) -> None:
        self.cfg, self.tp = cfg, tp
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_block_size(block_size)
        self.timeout = check_positive("timeout", timeout, unit="seconds")
        self.id = f"tp-{os.getpid()}-{next(_IDS)}"
        self.owns_pool = pool is None
        self.pool = Pool(tp, timeout=self.timeout) if pool is None else pool
        self.closed: str | None = None  # why the runner is closed (None while it runs)
        self.steps = 0
        self._built = False
        self.kv_bytes_per_rank = self._run(setup_worker, build, build_args, cfg, num_blocks, block_size)
        """bytes of each rank's KV pools (keys + values of its KV heads)"""
        self._built = True

    def _run(self, fn, *args) -> list:
        if self._built and self.closed is None and not self.pool.running:  # the group ended: our shards too
            self._close(f"its pool of {self.tp} ranks was closed since the runner was built")
        if self.closed is not None:
            raise RuntimeError(f"TPRunner {self.id} is closed ({self.closed}); build a new one")
        try:
            return self.pool.run(fn, self.id, *args, timeout=self.timeout)
        except (RankError, TimeoutError) as e:  # the Pool has ended the group: this runner's shards are gone
            self._close(f"{type(e).__name__}: {e}")
            raise

    def execute(self, step: StepInput) -> torch.Tensor:
        """One engine step on every rank: logits [len(step.sample_rows), vocab], float32 (rank 0's)."""
        check_type("step", step, StepInput, "a labkit.serving.batch.StepInput")
        logits = self._run(step_worker, step)[0]
        self.steps += 1
        return logits

    def _close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
            if self.owns_pool:
                self.pool.close()
            elif self.pool.running:
                try:
                    self.pool.run(close_worker, self.id, timeout=self.timeout)
                except (RankError, TimeoutError):
                    pass  # the Pool ended the group: the shards are gone anyway

    def close(self) -> None:
        """Free the shards and KV pools on the ranks (and stop the pool if this runner started it)."""
        self._close("close() was called")

    def __enter__(self) -> "TPRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.closed is None else "closed"
        return f"TPRunner(tp={self.tp}, num_blocks={self.num_blocks}, block_size={self.block_size}, {state})"


def tp_engine(model: TinyLM, tp: int, *, pool: Pool | None = None, timeout: float = 30,
              config: EngineConfig | None = None, **options) -> Engine:
    """An Engine whose model runs over `tp` gloo ranks (a TPRunner allocating the pool the EngineConfig
    resolves to); tp 1 is a plain Engine(model). config / options: the Engine's (EngineConfig's fields).
    Close it with engine.close()."""
    if not isinstance(model, TinyLM):
        fail("model", type(model).__name__, "a TinyLM", TypeError)
    tp = tensor.check_tp(model.cfg, tp)
    if tp == 1:
        if pool is not None:
            fail("pool", pool, "None with tp=1 (the model runs in this process)")
        return Engine(model, config=config, **options)
    return _over_ranks(model.cfg, lambda n, b: TPRunner(model, tp, n, b, pool, timeout),
                       EngineConfig.build(config, **options))


def built_tp_engine(build: Callable, build_args: tuple, cfg: TinyLMConfig, tp: int, *, pool: Pool | None = None,
                    timeout: float = 30, config: EngineConfig | None = None, **options) -> Engine:
    """tp_engine for ranks that build their own shard (TPRunner.from_builder; lab 07's service loads each
    rank's slices from the release on that rank). tp must be > 1: one process needs no ranks."""
    if tensor.check_tp(check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig"), tp) == 1:
        fail("tp", tp, "> 1 (with tp=1 build the model in this process: Engine(model))")
    return _over_ranks(cfg, lambda n, b: TPRunner.from_builder(build, build_args, cfg, tp, n, b, pool, timeout),
                       EngineConfig.build(config, **options))


def _over_ranks(cfg: TinyLMConfig, make_runner: Callable, config: EngineConfig) -> Engine:
    """An Engine over make_runner(num_blocks, block_size), the pool `config` resolves to for `cfg` (checked
    before any process starts); the runner is closed if the Engine cannot be built."""
    config = config.resolve(cfg)
    runner = make_runner(config.num_blocks, config.block_size)
    try:
        return Engine(runner=runner, config=config)
    except BaseException:
        runner.close()
        raise
