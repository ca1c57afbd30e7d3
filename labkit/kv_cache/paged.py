"""Paged attention: TinyLM's KV-cache contract on top of a BlockManager (notebook 05, section 3; the serving
lab runs batches on it). Keys and values live in one physical pool per layer, addressed by slot:

    pool k, v: [n_layers, n_kv_heads, num_blocks * block_size, head_dim]
    slot of position p of a sequence = block_table[p // block_size] * block_size + p % block_size

    block table [5, 2]  (block_size 4)      positions 0 1 2 3 | 4 5 6
                                            slots    20 21 22 23 | 8 9 10

`update` writes the new keys and values into their slots, then gathers every position of the sequence in
order through the block table (an index_select), so attention sees exactly the tensors a contiguous cache
would hold. `paged_attention` computes attention block by block from the pool without gathering first (an
online softmax over blocks, as vLLM's paged-attention kernel does), for comparison with torch's
scaled_dot_product_attention.

Life of a sequence: `start(seq_id, prompt)` allocates its blocks (returns the tokens the prefix cache holds),
`select([seq_id, ...])` picks the batch of the next forward, the block manager's `append` reserves each new
token's slot before the forward that computes it, `advance` (TinyLM calls it) tells the manager which tokens
are now computed (only then do full blocks enter the prefix cache), `free` ends it. How many tokens of a
sequence are computed is the block manager's state (`num_computed`), not the cache's: a sequence freed
through either one is gone from both. The forward must feed the tokens the manager holds for the sequence.
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch

from .._checks import check_int, check_positive_int, check_type, fail, is_int
from ..tinylm import TinyLMConfig, check_prompt, check_tinylm
from .blocks import BlockManager, blocks_needed


def slots_of(block_table: Sequence[int], length: int, block_size: int) -> torch.Tensor:
    """int64 slots [length] of positions 0 .. length - 1 through `block_table` (see the module docstring)."""
    check_positive_int("block_size", block_size)
    check_positive_int("length", length, allow_zero=True)
    table = torch.as_tensor(list(block_table), dtype=torch.long)
    if table.numel() and table.min() < 0:
        fail("block_table", list(block_table), "non-negative block ids")
    if length > table.numel() * block_size:
        fail("length", length, f"<= {table.numel() * block_size} (the table's {table.numel()} blocks of {block_size})")
    return (table[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:length]  # [n_blocks * bs] -> [L]


def gather(pool: torch.Tensor, block_table: Sequence[int], length: int, block_size: int) -> torch.Tensor:
    """The keys (or values) of one sequence in position order, [n_kv_heads, length, head_dim], from one layer's
    pool [n_kv_heads, num_blocks * block_size, head_dim]. Notebook 05's exercise PAGED_GATHER."""
    check_type("pool", pool, torch.Tensor)
    check_positive_int("block_size", block_size)
    if pool.dim() != 3 or pool.shape[1] % block_size:
        fail("pool", tuple(pool.shape), f"[n_kv_heads, num_blocks * {block_size}, head_dim]")
    check_positive_int("length", length)
    check_table(block_table, pool.shape[1] // block_size, length, block_size)
    return pool.index_select(1, slots_of(block_table, length, block_size))


def check_table(block_table, num_blocks: int, length: int, block_size: int) -> list[int]:
    """`block_table` as a list of block ids in [0, num_blocks), with enough blocks for `length` positions."""
    if isinstance(block_table, (str, bytes)) or not isinstance(block_table, Sequence) \
            or not all(is_int(b) for b in block_table):
        fail("block_table", block_table, "a list of block ids (ints)", TypeError)
    if not all(0 <= b < num_blocks for b in block_table):
        fail("block_table", list(block_table), f"block ids in [0, {num_blocks}) (the pool's blocks)")
    if len(block_table) < blocks_needed(length, block_size):
        fail("length", length, f"<= {len(block_table) * block_size} (the table's {len(block_table)} blocks "
                               f"of {block_size})")
    return list(block_table)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: Sequence[int],
                    length: int, block_size: int) -> torch.Tensor:
    """softmax(q K^T / sqrt(head_dim)) V for one sequence, read block by block from the pools (an online softmax:
    a running maximum, denominator and weighted sum per query, rescaled as each block arrives).

    q: [n_heads, T, head_dim], the queries of positions length - T .. length - 1 (causal: query i sees
    positions <= length - T + i); k_pool, v_pool: [n_kv_heads, slots, head_dim]; n_heads a multiple of
    n_kv_heads (grouped-query attention: query head h reads KV head h // (n_heads / n_kv_heads)).
    Returns [n_heads, T, head_dim] in float32."""
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        check_type(name, t, torch.Tensor)
        if t.dim() != 3:
            fail(name, tuple(t.shape), "a 3-D tensor ([heads, T or slots, head_dim])")
    check_positive_int("block_size", block_size)
    H, T, D = q.shape
    Hkv = k_pool.shape[0]
    if H % Hkv or k_pool.shape != v_pool.shape or k_pool.shape[2] != D or k_pool.shape[1] % block_size:
        raise ValueError(f"q [n_heads, T, head_dim] and pools [n_kv_heads, slots, head_dim] do not match: "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    check_int("length", length, T, len(block_table) * block_size)
    block_table = check_table(block_table, k_pool.shape[1] // block_size, length, block_size)
    qf = q.float().reshape(Hkv, H // Hkv * T, D) / math.sqrt(D)         # [Hkv, group * T, D]
    query_pos = (length - T + torch.arange(T)).repeat(H // Hkv)          # [group * T]
    running_max = torch.full(qf.shape[:2], -math.inf)
    denom, acc = torch.zeros(qf.shape[:2]), torch.zeros(qf.shape)
    for i, block in enumerate(block_table[:-(-length // block_size)]):
        pos = i * block_size + torch.arange(block_size)
        k = k_pool[:, block * block_size:(block + 1) * block_size].float()  # [Hkv, bs, D]
        v = v_pool[:, block * block_size:(block + 1) * block_size].float()
        scores = qf @ k.transpose(1, 2)                                      # [Hkv, group * T, bs]
        scores = scores.masked_fill(pos[None, None, :] > query_pos[None, :, None], -math.inf)
        new_max = torch.maximum(running_max, scores.amax(-1))
        keep = torch.exp(running_max - new_max)                              # 0 where nothing was seen yet
        p = torch.exp(scores - new_max[..., None])
        denom = denom * keep + p.sum(-1)
        acc = acc * keep[..., None] + p @ v
        running_max = new_max
    return (acc / denom[..., None]).reshape(H, T, D)


class PagedKVCache:
    """TinyLM's KV cache (labkit.tinylm.Cache) whose keys and values live in the blocks of `block_manager`.

    One pool serves every sequence the manager holds; `select` names the batch the next forward runs (all of
    the same length: TinyLM's forward takes one position offset; sequences of different lengths need the
    per-row positions the serving lab adds). Pool: [n_layers, n_kv_heads, num_blocks * block_size, head_dim]
    per K and V, in `dtype`. Copies queued by copy-on-write are carried out before the next write."""

    def __init__(self, cfg: TinyLMConfig, block_manager: BlockManager, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
        check_type("block_manager", block_manager, BlockManager, "a labkit.kv_cache.BlockManager")
        check_type("dtype", dtype, torch.dtype, "a torch.dtype (torch.float32, torch.bfloat16, ...)")
        if not dtype.is_floating_point:
            fail("dtype", dtype, "a floating-point torch.dtype (quantized storage: labkit.kv_cache.quantized)")
        if not block_manager.vocab_size_given and block_manager.vocab_size != cfg.vocab_size:
            held = [t for s in block_manager.seq_ids for t in block_manager.tokens(s)]
            if max(held, default=0) >= cfg.vocab_size:
                fail("block_manager", f"a manager holding token {max(held)}",
                     f"a BlockManager whose tokens are in the model's vocabulary [0, {cfg.vocab_size})")
            block_manager.vocab_size = cfg.vocab_size  # tied: the manager now refuses ids the model cannot embed
        elif block_manager.vocab_size != cfg.vocab_size:
            fail("block_manager", f"a BlockManager with vocab_size {block_manager.vocab_size}",
                 f"a BlockManager with the model's vocab_size {cfg.vocab_size} (or vocab_size=None, tied here)")
        self.cfg, self.block_manager = cfg, block_manager
        self.block_size = block_manager.block_size
        shape = (cfg.n_layers, cfg.n_kv_heads, block_manager.num_blocks * self.block_size, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._batch: list[Hashable] = []
        self._write: list[torch.Tensor] = []   # per batch row: slots of the new positions (set at layer 0)
        self._read: list[torch.Tensor] = []    # per batch row: slots of every position

    # --- sequences ----------------------------------------------------------------------------------------

    def _known(self, name: str, seq_id) -> Hashable:
        if not (is_int(seq_id) or isinstance(seq_id, str)):
            fail(name, seq_id, "a sequence id (an int or a str)", TypeError)
        if seq_id not in self.block_manager.seq_ids:
            fail(name, seq_id, "a sequence this manager holds")
        return seq_id

    def start(self, seq_id, token_ids: Sequence[int]) -> int:
        """Allocate `seq_id`'s blocks for its prompt; returns how many leading tokens are already cached (their
        keys and values are in the shared blocks: the forward starts after them)."""
        return self.block_manager.allocate(seq_id, token_ids)

    def fork(self, parent_id, child_id) -> None:
        """`child_id` continues `parent_id` (parallel sampling): shares its blocks, copied on the first write."""
        self._known("parent_id", parent_id)
        self.block_manager.fork(parent_id, child_id)

    def free(self, seq_id) -> None:
        self._known("seq_id", seq_id)
        self.block_manager.free(seq_id)
        self._batch = [s for s in self._batch if s != seq_id]

    def select(self, seq_ids: Sequence) -> "PagedKVCache":
        """The sequences (batch rows, in order) the next forward computes; returns the cache."""
        if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence) or not seq_ids:
            fail("seq_ids", seq_ids, "a non-empty list of sequence ids", TypeError)
        for s in seq_ids:
            self._known("seq_ids[i]", s)
        if len(set(seq_ids)) != len(seq_ids):
            fail("seq_ids", list(seq_ids), "distinct sequence ids")
        self._batch = list(seq_ids)
        return self

    def computed(self, seq_id) -> int:
        """Positions of `seq_id` whose keys and values are stored."""
        return self.block_manager.num_computed(seq_id)

    # --- TinyLM's cache contract --------------------------------------------------------------------------

    @property
    def length(self) -> int:
        """Positions already cached for the selected sequences (they must agree)."""
        if not self._batch:
            raise ValueError("no sequence selected: call PagedKVCache.select([seq_id, ...]) before the forward")
        lengths = {self.block_manager.num_computed(s) for s in self._batch}
        if len(lengths) > 1:
            raise ValueError(f"the selected sequences have different cached lengths {sorted(lengths)}: TinyLM's "
                             f"forward takes one position offset per batch")
        return lengths.pop()

    @property
    def max_len(self) -> int:
        return self.cfg.max_seq_len

    @property
    def batch_size(self) -> int:
        return len(self._batch)

    def _prepare(self, T: int) -> None:
        """At layer 0: carry out queued copies and compute each row's slots for this forward."""
        for src, dst in self.block_manager.take_copies():
            a, b = src * self.block_size, dst * self.block_size
            self.k[:, :, b:b + self.block_size] = self.k[:, :, a:a + self.block_size]
            self.v[:, :, b:b + self.block_size] = self.v[:, :, a:a + self.block_size]
        self._write, self._read = [], []
        for s in self._batch:
            start, reserved = self.block_manager.num_computed(s), self.block_manager.num_tokens(s)
            if start + T > reserved:
                raise ValueError(f"sequence {s!r} has {reserved} slots reserved, this forward needs {start + T}: "
                                 f"reserve each new token with block_manager.append first")
            slots = slots_of(self.block_manager.block_table(s), start + T, self.block_size)
            self._read.append(slots)
            self._write.append(slots[start:])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """See labkit.tinylm.Cache.update: k, v [B, n_kv_heads, T, head_dim] -> every position's keys and values."""
        check_int("layer", layer, 0, self.cfg.n_layers - 1)
        expected = (self.batch_size, self.cfg.n_kv_heads, k.shape[2] if k.dim() == 4 else -1, self.cfg.head_dim)
        if k.shape != v.shape or tuple(k.shape) != expected:
            raise ValueError(f"k and v must be [batch {self.batch_size}, n_kv_heads {self.cfg.n_kv_heads}, T, "
                             f"head_dim {self.cfg.head_dim}], got {tuple(k.shape)} and {tuple(v.shape)}")
        if layer == 0:
            self._prepare(k.shape[2])
        elif not self._write or len(self._write[0]) != k.shape[2]:
            raise ValueError("update(0, ...) must come first in every forward (TinyLM calls the layers in order)")
        k_pool, v_pool = self.k[layer], self.v[layer]
        ks, vs = [], []
        for b, (write, read) in enumerate(zip(self._write, self._read)):
            k_pool[:, write] = k[b].to(k_pool.dtype)
            v_pool[:, write] = v[b].to(v_pool.dtype)
            ks.append(k_pool.index_select(1, read))
            vs.append(v_pool.index_select(1, read))
        return torch.stack(ks).to(k.dtype), torch.stack(vs).to(k.dtype)  # [B, Hkv, start + T, hd]

    def advance(self, n_tokens: int) -> None:
        if not self._write or n_tokens != len(self._write[0]):
            fail("n_tokens", n_tokens, "the number of positions the last forward wrote")
        for s in self._batch:  # the K/V are written: only now may the manager cache these blocks
            self.block_manager.mark_computed(s, self.block_manager.num_computed(s) + n_tokens)
        self._write = []

    def rewind(self, length: int) -> None:
        """Forget the selected sequences' positions from `length` on; their slots stay reserved and are written
        again by the next forward (re-running a decode for timing, as KVCache.rewind does)."""
        check_int("length", length, 0, self.length)
        for s in self._batch:
            self.block_manager.mark_computed(s, length)

    def nbytes(self) -> int:
        """Bytes of the pool (keys + values), whatever the sequences use."""
        return 2 * self.k.numel() * self.k.element_size()


def _check_request(model, prompt, max_new_tokens: int, cache: "PagedKVCache", seq_id) -> list[int]:
    """paged_generate's checks, all before anything is allocated (as labkit.tinylm.generate checks its own)."""
    check_tinylm(model)
    check_type("cache", cache, PagedKVCache, "a labkit.kv_cache.PagedKVCache")
    if model.cfg != cache.cfg:
        fail("cache", "a PagedKVCache for another config", "a PagedKVCache built with this model's cfg")
    check_positive_int("max_new_tokens", max_new_tokens)
    prompt = check_prompt(prompt, model.cfg.vocab_size)
    V, ctx = model.cfg.vocab_size, model.cfg.max_seq_len
    bad = [t for t in prompt if not 0 <= t < V]
    if bad:
        fail("prompt", bad[0], f"token ids in [0, {V}) (the model's vocabulary); this id is not")
    if not prompt or len(prompt) + max_new_tokens > ctx:
        fail("prompt", f"{len(prompt)} tokens + max_new_tokens {max_new_tokens}",
             f"between 1 and {ctx} tokens in all (the model's context)")
    if not (is_int(seq_id) or isinstance(seq_id, str)):
        fail("seq_id", seq_id, "a sequence id (an int or a str)", TypeError)
    if seq_id in cache.block_manager.seq_ids:
        fail("seq_id", seq_id, "a new sequence id (this one is already allocated)")
    return [int(t) for t in prompt]


@torch.no_grad()
def paged_generate(model, prompt: Sequence[int], max_new_tokens: int, cache: PagedKVCache, seq_id=0,
                   return_logits: bool = False):
    """Greedy continuation of `prompt` by `max_new_tokens` through a PagedKVCache. On success the sequence stays
    in the cache (free it yourself); on any failure (bad input is refused before allocating; running out of
    blocks mid-generation raises OutOfBlocksError) it is freed, so nothing uncomputed stays behind. Returns the
    new token ids, and with return_logits their logits [max_new_tokens, vocab]."""
    prompt = _check_request(model, prompt, max_new_tokens, cache, seq_id)
    cached = cache.start(seq_id, prompt)
    try:
        cache.select([seq_id])
        device = model.tok_emb.weight.device
        logits = model(torch.tensor([prompt[cached:]], device=device), cache)[0, -1]
        out, rows = [], []
        for step in range(max_new_tokens):
            rows.append(logits)
            out.append(int(logits.argmax()))
            if step == max_new_tokens - 1:
                break
            cache.block_manager.append(seq_id, out[-1])
            logits = model(torch.tensor([[out[-1]]], device=device), cache)[0, -1]
    except BaseException:
        cache.free(seq_id)
        raise
    return (out, torch.stack(rows)) if return_logits else out
