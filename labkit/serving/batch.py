"""One engine step as the model sees it: several sequences of different lengths packed into one forward over
the paged KV pool (notebook 06, section 2). The engine side (scheduler, block manager) writes a StepInput; the
model side (labkit.serving.runner, one per tensor-parallel rank) runs TinyLM on it through a PagedBatch, the
BatchedCache that stores each new key and value in its slot and runs attention per sequence. A step gives
StepOutputs (one per sampled token); StepCost models its seconds where a result must not depend on the machine.

    sequences        a (decode)   b (prefill chunk of 3)   c (decode)
    tokens  [N=5]    a7          b0 b1 b2                  c40          one row: the linear layers see 5 tokens
    positions        7           0  1  2                   40
    slots            slot of each token's position through its sequence's block table
    query_lens       1           3                         1
    context_lens     8           3                         41           positions each one attends to

Attention: the decode rows (query length 1) sorted by context length, longest first, and cut into a few
groups (decode_groups); each group is one scaled_dot_product_attention call over its rows' gathered keys,
padded to the group's longest context and masked. One call for every decode row would gather and attend
over the longest row's context for each of them: with continuous batching, mixed lengths made 30-40% of
those keys padding. Each prefill chunk is its own causal call (a chunk after cached tokens sees them all).

    32 decode rows by context   250 244 231 | 64 63 62 61 ... 34 33 31     two calls: 3 rows padded to 250,
                                           ^ cut                         29 rows padded to 64
        the cut saves at most (250 - 64) x 29 rows = 5,394 key positions > split_keys (2,048): the two calls
        gather 3 x 250 + 29 x 64 = 2,606 positions (2,116 real ones); one call would gather 32 x 250 = 8,000.

The pool is never read through another sequence's block table, so no request can see another's keys and
values (shared prefix blocks hold identical tokens by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._checks import check_int, check_positive, fail

Pools = tuple[torch.Tensor, torch.Tensor]  # k, v: [n_layers, n_kv_heads, num_blocks * block_size, head_dim]


@dataclass
class StepInput:
    """Everything a rank needs for one forward (picklable: it travels to tensor-parallel ranks).

    tokens, positions, slots: int64 [N]; query_lens, context_lens, block_tables: one entry per sequence, in the
    order of the packed tokens; sample_rows: the sequences (indices) whose last token's logits are wanted.
    swap_out: (key, blocks) to copy to host memory before anything is written; drop: keys whose host copy is
    not needed (aborted); copies: copy-on-write block copies (src, dst); swap_in: (key, first, blocks):
    host blocks first, first + 1, ... of key go back into `blocks` (the ones before `first` were prefix hits).
    embeds: None, or (rows int64 [n] into the packed tokens, values [n, d_model]): image features that replace
    those tokens' embeddings (lab 07, labkit.serving.mm.step_embeds)."""
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    copies: list[tuple[int, int]] = field(default_factory=list)
    swap_out: list[tuple[str, list[int]]] = field(default_factory=list)
    swap_in: list[tuple[str, int, list[int]]] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    embeds: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    def logit_rows(self) -> torch.Tensor:
        """int64 indices into the packed tokens: the last token of each sequence in sample_rows."""
        ends = torch.tensor(self.query_lens).cumsum(0) - 1
        return ends[self.sample_rows]


@dataclass(frozen=True)
class StepOutput:
    """One token a request produced in a step; finished and finish_reason say whether it was its last."""
    request_id: str
    token_id: int
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class StepCost:
    """Modelled seconds per step: overhead + per_token x tokens computed + per_seq x sequences in the batch
    (a stand-in for measured time where a result must not depend on the machine)."""
    overhead: float = 2e-3
    per_token: float = 2e-5
    per_seq: float = 5e-5

    def __post_init__(self):
        for name in ("overhead", "per_token", "per_seq"):
            check_positive(name, getattr(self, name), "seconds", allow_zero=True)

    def seconds(self, num_tokens: int, num_seqs: int) -> float:
        return self.overhead + self.per_token * num_tokens + self.per_seq * num_seqs if num_tokens else 0.0


SPLIT_KEYS = 2048  # key positions a new decode group must save to pay for its calls (benchmarks/RESULTS.md, lab 06)


def slot_table(block_tables: list[list[int]], lengths: list[int], block_size: int) -> torch.Tensor:
    """int64 [n_seqs, max(lengths)]: slot of each position of each sequence, padded with slot 0 (masked)."""
    width = -(-max(lengths) // block_size)
    used = [blocks[:-(-n // block_size)] for blocks, n in zip(block_tables, lengths)]
    table = torch.tensor([u + [0] * (width - len(u)) for u in used], dtype=torch.long)  # [S, blocks]
    slots = (table[:, :, None] * block_size + torch.arange(block_size)).reshape(len(lengths), -1)  # [S, blocks*bs]
    return slots[:, :max(lengths)]


def decode_groups(lengths: list[int], split_keys: int = SPLIT_KEYS) -> list[list[int]]:
    """Indices of `lengths` (the context lengths of the decode rows) in groups, longest first, each group padded
    to its first row's length. Walking down the sorted lengths, row c starts a new group when (longest of the
    current group - c) x (rows from c to the end) > `split_keys`: a bound on the key positions the cut saves,
    against the cost of one more gather and attention call (per layer), in key positions."""
    check_int("split_keys", split_keys, 0, unit="key positions")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups = [[order[0]]] if order else []
    for left, i in zip(range(len(order) - 1, 0, -1), order[1:]):
        if (lengths[groups[-1][0]] - lengths[i]) * left > split_keys:
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


class PagedBatch:
    """labkit.tinylm.BatchedCache over one rank's pools for one StepInput (built per step, used once)."""

    def __init__(self, step: StepInput, pools: Pools, block_size: int, split_keys: int = SPLIT_KEYS):
        self.step, (self.k_pool, self.v_pool), self.block_size = step, pools, block_size
        q_lens, ctx = step.query_lens, step.context_lens
        if not q_lens or len(ctx) != len(q_lens) or len(step.block_tables) != len(q_lens) \
                or sum(q_lens) != step.num_tokens or any(q < 1 or q > c for q, c in zip(q_lens, ctx)):
            fail("step", f"query_lens {q_lens[:8]}, context_lens {ctx[:8]} for {step.num_tokens} tokens",
                 "one query length (1 .. its context) per sequence, summing to the packed tokens")
        starts = [0] + torch.tensor(q_lens).cumsum(0).tolist()[:-1]
        decode = [i for i, q in enumerate(q_lens) if q == 1]
        self.decode = []  # per group: packed index of each row [G], slots [G, W], valid keys [G, 1, 1, W] or None
        for group in decode_groups([ctx[i] for i in decode], split_keys):
            seqs = [decode[j] for j in group]
            lens = [ctx[i] for i in seqs]
            slots = slot_table([step.block_tables[i] for i in seqs], lens, block_size)
            mask = None if lens[-1] == lens[0] else (torch.arange(lens[0]) < torch.tensor(lens)[:, None])[:, None, None]
            self.decode.append((torch.tensor([starts[i] for i in seqs]), slots, mask))
        self.prefill = [(starts[i], q_lens[i], ctx[i], step.block_tables[i]) for i, q in enumerate(q_lens) if q > 1]
        self.prefill_slots = [slot_table([table], [c], block_size)[0] for _, _, c, table in self.prefill]

    def positions(self, n_tokens: int) -> torch.Tensor:
        return self.step.positions

    def advance(self, n_tokens: int) -> None:
        pass  # the engine's block manager records what was computed (mark_computed), not the pool

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """See labkit.tinylm.BatchedCache.attend."""
        k_pool, v_pool = self.k_pool[layer], self.v_pool[layer]            # [Hkv, slots, hd]
        k_pool.index_copy_(1, self.step.slots, k[0].to(k_pool.dtype))
        v_pool.index_copy_(1, self.step.slots, v[0].to(v_pool.dtype))
        out = torch.empty_like(q)                                          # [1, H, N, hd]
        for rows, slots, mask in self.decode:
            G, W = slots.shape
            flat = slots.reshape(-1)
            kd = k_pool.index_select(1, flat).view(-1, G, W, k.shape[-1]).transpose(0, 1)  # [G, Hkv, W, hd]
            vd = v_pool.index_select(1, flat).view(-1, G, W, k.shape[-1]).transpose(0, 1)
            qd = q[0].index_select(1, rows).transpose(0, 1)[:, :, None]   # [G, H, 1, hd]
            od = F.scaled_dot_product_attention(qd, kd.to(q.dtype), vd.to(q.dtype), attn_mask=mask, enable_gqa=True)
            out[0].index_copy_(1, rows, od[:, :, 0].transpose(0, 1))     # [H, G, hd]
        for (start, n, c, _), slots in zip(self.prefill, self.prefill_slots):
            ks = k_pool.index_select(1, slots)[None].to(q.dtype)           # [1, Hkv, c, hd]
            vs = v_pool.index_select(1, slots)[None].to(q.dtype)
            qs = q[:, :, start:start + n]                                   # [1, H, n, hd]
            if n == c:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            else:  # a chunk after c - n cached positions: query i sees positions <= c - n + i
                mask = torch.ones(n, c, dtype=torch.bool).tril(diagonal=c - n)
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[:, :, start:start + n] = o
        return out
