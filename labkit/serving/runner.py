"""The model side of the engine (notebook 06, section 2): one model, its paged KV pools and the host memory
that swapped-out blocks go to. It runs one StepInput per call and returns the logits of the tokens to sample;
it never decides anything (the scheduler and the block manager on the engine side do). With tensor
parallelism every rank holds one ModelRunner over its shard and its own KV heads (labkit.serving.tp).

    execute(step):  1. swap_out: copy those blocks to host memory   (before anything is overwritten)
                    2. drop:     forget the host copies of aborted requests
                    3. copies:   copy-on-write block copies
                    4. swap_in:  host memory -> the new blocks
                    5. TinyLM forward over the packed tokens (PagedBatch writes the new K/V, attends), with
                       embeds= (image features over their placeholder tokens) only when the step has some
                    -> logits [len(step.sample_rows), vocab] in float32
"""

from __future__ import annotations

from typing import Protocol

import torch

from .._checks import check_positive_int, check_type, fail
from ..kv_cache import check_block_size, slots_of
from ..tinylm import TinyLMConfig
from .batch import PagedBatch, StepInput


class Runner(Protocol):
    """What the Engine needs of a model runner: ModelRunner (this process) and TPRunner (over gloo ranks) are
    two. num_blocks x block_size is the KV pool it allocated: the engine's block manager is built from it."""
    cfg: TinyLMConfig
    num_blocks: int
    block_size: int

    def execute(self, step: StepInput) -> torch.Tensor: ...

    def close(self) -> None: ...


def check_runner(runner) -> "Runner":
    """`runner` if it has what the Engine needs (Runner), else a TypeError saying what is missing."""
    missing = [a for a in ("cfg", "num_blocks", "block_size", "execute", "close") if not hasattr(runner, a)]
    if missing or not isinstance(runner.cfg, TinyLMConfig) or not callable(runner.execute):
        lacks = "; it lacks " + ", ".join(missing) if missing else ""
        fail("runner", type(runner).__name__, "a model runner (cfg: TinyLMConfig, num_blocks, block_size, "
             f"execute(StepInput), close()), e.g. ModelRunner or TPRunner{lacks}", TypeError)
    return runner


def check_pools(pools, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) if both are contiguous tensors of `shape` and `dtype` whose bytes do not overlap."""
    if not (isinstance(pools, tuple) and len(pools) == 2 and all(isinstance(p, torch.Tensor) for p in pools)):
        fail("pools", type(pools).__name__, "a pair (k, v) of torch.Tensors, or None", TypeError)
    for name, p in zip("kv", pools):
        if tuple(p.shape) != tuple(shape) or p.dtype != dtype or not p.is_contiguous():
            fail(f"pools[{'kv'.index(name)}]", f"{p.dtype} {tuple(p.shape)}", f"a contiguous {dtype} tensor of "
                 f"shape {tuple(shape)} (the {name.upper()} pool: layers, KV heads, slots, head_dim)")
    (a, b), n = sorted(p.data_ptr() for p in pools), pools[0].numel() * pools[0].element_size()
    if b < a + n:
        fail("pools", "two views sharing bytes", "K and V pools that do not overlap")
    return pools


class ModelRunner:
    """`model` (a TinyLM, or a tensor-parallel shard with the same forward) and a KV pool of `num_blocks` blocks
    of `block_size` tokens for `cfg`'s KV heads (the shard's, under tensor parallelism), in `dtype`.

    pools: (k, v), the pools to use instead of allocating them, each [n_layers, n_kv_heads, num_blocks *
    block_size, head_dim] in `dtype`, contiguous and not overlapping (lab 07: views of a rank's pre-planned
    arena); None: two zeroed pools are allocated (lab 06)."""

    def __init__(self, model, num_blocks: int, block_size: int, cfg: TinyLMConfig | None = None,
                 dtype: torch.dtype = torch.float32, pools: tuple[torch.Tensor, torch.Tensor] | None = None):
        if not callable(model) or not isinstance(getattr(model, "cfg", None), TinyLMConfig):
            fail("model", type(model).__name__, "a TinyLM (or a tensor-parallel shard of one)", TypeError)
        cfg = model.cfg if cfg is None else cfg
        check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
        check_positive_int("num_blocks", num_blocks)
        check_block_size(block_size)
        self.model, self.cfg, self.num_blocks, self.block_size = model, cfg, num_blocks, block_size
        shape = (cfg.n_layers, cfg.n_kv_heads, num_blocks * block_size, cfg.head_dim)
        if pools is None:
            self.k, self.v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        else:
            self.k, self.v = check_pools(pools, shape, dtype)
        self.host: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # swapped-out K/V per key: [L, Hkv, n*bs, hd]
        self.steps = 0

    def swap_out(self, key: str, blocks: list[int]) -> None:
        """Copy `blocks` (every layer's K and V) to host memory under `key` (a request id)."""
        if key in self.host:
            fail("key", key, "a sequence that is not swapped out already")
        slots = slots_of(blocks, len(blocks) * self.block_size, self.block_size)  # every slot of those blocks
        self.host[key] = (self.k.index_select(2, slots), self.v.index_select(2, slots))

    def swap_in(self, key: str, first: int, blocks: list[int]) -> None:
        """Copy `key`'s host blocks first, first + 1, ... into `blocks` and forget the host copy."""
        if key not in self.host:
            fail("key", key, "a swapped-out sequence")
        k, v = self.host[key]
        a, b = first * self.block_size, (first + len(blocks)) * self.block_size
        if first < 0 or b > k.shape[2]:
            fail("blocks", f"{len(blocks)} blocks from host block {first}",
                 f"within the {k.shape[2] // self.block_size} blocks {key!r} swapped out")
        del self.host[key]
        slots = slots_of(blocks, len(blocks) * self.block_size, self.block_size)
        self.k.index_copy_(2, slots, k[:, :, a:b])
        self.v.index_copy_(2, slots, v[:, :, a:b])

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block `src` into block `dst`, every layer, K and V (copy-on-write)."""
        a, b, n = src * self.block_size, dst * self.block_size, self.block_size
        self.k[:, :, b:b + n] = self.k[:, :, a:a + n]
        self.v[:, :, b:b + n] = self.v[:, :, a:a + n]

    @torch.no_grad()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Run one step (see the module docstring); logits [len(step.sample_rows), vocab], float32."""
        check_type("step", step, StepInput, "a labkit.serving.batch.StepInput")
        for key, blocks in step.swap_out:
            self.swap_out(key, blocks)
        for key in step.drop:
            self.host.pop(key, None)
        for src, dst in step.copies:
            self.copy_block(src, dst)
        for key, first, blocks in step.swap_in:
            self.swap_in(key, first, blocks)
        self.steps += 1
        if not step.num_tokens:
            return torch.empty(0, self.cfg.vocab_size)
        extra = {} if step.embeds is None else {"embeds": step.embeds}  # a text-only step calls forward as lab 06
        batch = PagedBatch(step, (self.k, self.v), self.block_size)
        logits = self.model(step.tokens[None], batch, **extra)[0]  # [N, V]
        return logits.index_select(0, step.logit_rows()).float()

    def close(self) -> None:
        """Nothing to stop in this process (the pools go with the object); TPRunner's stops its ranks."""

    def nbytes(self) -> int:
        """Bytes of the KV pools (keys + values)."""
        return 2 * self.k.numel() * self.k.element_size()
