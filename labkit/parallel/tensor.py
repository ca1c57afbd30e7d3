"""Tensor parallelism, Megatron-style (Shoeybi et al. 2019), on TinyLM over real gloo ranks (notebook 04,
section 3). The split of every matrix is read from TinyLM's table of linear layers (tp_style):

    column  [out, in] -> rows r*out/tp .. : each rank computes its slice of the outputs (no communication)
    row     [out, in] -> columns r*in/tp ..: each rank computes a partial sum of all outputs -> all_reduce
    vocab   [vocab, d] -> rows r*V/tp ..  : embedding: look up own rows, zeros elsewhere -> all_reduce;
                                            output layer: own slice of the logits -> all_gather

    attention: wq, wk, wv column (each rank keeps n_heads/tp query heads and n_kv_heads/tp KV heads, a whole
               GQA group), wo row -> one all_reduce;   MLP: w_gate, w_up column, w_down row -> one all_reduce

So the forward pass all-reduces [tokens, d_model] twice per layer (plus once for the embedding) and
all-gathers the logits once. As in picotron, only the layers change: ShardedTinyLM replaces each row of the
table by its parallel layer (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
VocabParallelHead: the local slice's product plus the collective) and runs TinyLM's own forward, whose
attention reads its n_heads/tp and n_kv_heads/tp heads from the sliced projections.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from .._checks import check_int, check_positive_int, fail
from ..tinylm import KVCache, TinyLM, TinyLMConfig, linear_layers
from .distributed import Pool, check_world, shared_pool


def check_tp(cfg: TinyLMConfig, tp: int) -> int:
    """`tp` if this machine can run that many ranks (check_world) and it splits TinyLM evenly (check_split)."""
    return check_split(cfg, check_world(tp, "tp"))


def check_split(cfg: TinyLMConfig, tp: int) -> int:
    """`tp` (a positive int) if it splits TinyLM evenly, on any machine: it must divide n_heads, n_kv_heads, d_ff
    and vocab_size. Real engines (vLLM, TensorRT-LLM) go past n_kv_heads by replicating KV heads: tp /
    n_kv_heads ranks then hold a copy of the same KV head, and the KV cache is stored that many times."""
    tp = check_positive_int("tp", tp)
    if cfg.n_heads % tp:
        fail("tp", tp, f"a divisor of n_heads={cfg.n_heads}: {cfg.n_heads} query heads cannot be shared "
             f"equally by {tp} ranks")
    if cfg.n_kv_heads % tp:
        fail("tp", tp, f"a divisor of n_kv_heads={cfg.n_kv_heads} (n_heads={cfg.n_heads} divides): past "
             "n_kv_heads real engines replicate KV heads instead, which this course does not")
    for name in ("d_ff", "vocab_size"):
        if getattr(cfg, name) % tp:
            fail("tp", tp, f"a divisor of {name}={getattr(cfg, name)} (the column/row split cuts it in {tp})")
    return tp


def shard(weight: torch.Tensor, style: str, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s part of a [out, in] weight: rows for "column" and "vocab", columns for "row"."""
    dim = 1 if style == "row" else 0
    if weight.shape[dim] % tp:
        fail("tp", tp, f"a divisor of the {'input' if dim else 'output'} size {weight.shape[dim]}")
    return weight.chunk(tp, dim=dim)[rank].contiguous()


def shard_config(cfg: TinyLMConfig, tp: int) -> TinyLMConfig:
    """The shape of one rank's attention: n_heads/tp query and n_kv_heads/tp KV heads of the same width
    (what the rank's KV cache holds)."""
    h, kv = cfg.n_heads // tp, cfg.n_kv_heads // tp
    return TinyLMConfig(vocab_size=cfg.vocab_size, d_model=h * cfg.head_dim, n_layers=cfg.n_layers, n_heads=h,
                        n_kv_heads=kv, d_ff=cfg.d_ff // tp, max_seq_len=cfg.max_seq_len)


class Collectives:
    """The collectives of one TP rank's layers over the current process group, counting the elements each one
    moved (`moved`). A group of one (tp 1) moves nothing but counts the same: the model runs in-process."""

    def __init__(self, tp: int):
        self.tp = tp
        self.moved = {"all_reduce": 0, "all_gather": 0}

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place."""
        self.moved["all_reduce"] += x.numel()
        if self.tp > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, part: torch.Tensor) -> torch.Tensor:
        """[B, T, n * tp] from every rank's part [B, T, n], rank r's part at columns r*n .. (r+1)*n."""
        B, T, n = part.shape
        gathered = torch.empty((self.tp * B, T, n), dtype=part.dtype)  # [tp * B, T, n]
        self.moved["all_gather"] += gathered.numel()
        if self.tp == 1:
            return part
        dist.all_gather_single(gathered, part.contiguous())
        return gathered.view(self.tp, B, T, n).permute(1, 2, 0, 3).reshape(B, T, -1)


class ColumnParallelLinear(nn.Module):
    """A column-parallel layer: `linear` holds rows r*out/tp .. of the weight, so it computes this rank's slice of
    the outputs, [.., out/tp]. No communication: the next layer (row-parallel) takes the slice as it is."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear  # an nn.Linear, or a quantized one (labkit.quant.QuantLinear, lab 07)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class RowParallelLinear(nn.Module):
    """A row-parallel layer: `linear` holds columns r*in/tp .. of the weight and takes this rank's slice of the
    inputs (a column-parallel layer's output); its partial sums of every output are all-reduced."""

    def __init__(self, linear: nn.Module, comm: Collectives):
        super().__init__()
        self.linear, self.comm = linear, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.linear(x))


class VocabParallelEmbedding(nn.Module):
    """The embedding split by vocabulary: `embedding` holds rows vocab_start .. of the table; a token this rank
    does not hold looks up zeros, and the all-reduce adds the one rank's row that holds it."""

    def __init__(self, embedding: nn.Embedding, comm: Collectives, vocab_start: int):
        super().__init__()
        self.embedding, self.comm, self.vocab_start = embedding, comm, vocab_start

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = self.embedding.weight.shape[0]
        local = tokens - self.vocab_start
        mine = (local >= 0) & (local < rows)
        return self.comm.all_reduce(self.embedding(local.clamp(0, rows - 1)) * mine[..., None])


class VocabParallelHead(nn.Module):
    """The output layer split by vocabulary: `linear` computes this rank's slice of the logits [B, T, V/tp];
    the all-gather puts the full logits [B, T, V] on every rank."""

    def __init__(self, linear: nn.Module, comm: Collectives):
        super().__init__()
        self.linear, self.comm = linear, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_last(self.linear(x))


def parallel_layer(entry, module: nn.Module, comm: Collectives, vocab_start: int) -> nn.Module:
    """The module that replaces TinyLM's `module` (holding this rank's slice) for a row of the table of
    linear layers: its tp_style (and, for "vocab", whether it is the embedding or the output layer)."""
    if entry.tp_style == "column":
        return ColumnParallelLinear(module)
    if entry.tp_style == "row":
        return RowParallelLinear(module, comm)
    if entry.layer_type == "embedding":
        return VocabParallelEmbedding(module, comm, vocab_start)
    return VocabParallelHead(module, comm)


class ShardedTinyLM(nn.Module):
    """One rank's part of a TinyLM (TP degree `tp`), built from the full model's weights: `local` is a TinyLM
    whose linear layers are replaced, from the table of linear layers, by the parallel layers above holding
    this rank's slices; its own forward runs unchanged (its attention reads the local head counts from the
    projections). forward() must run on every rank of the current group at once. `comm` counts the elements
    each collective moved."""

    def __init__(self, full: TinyLM, rank: int, tp: int, sliced: bool = False):
        super().__init__()
        cfg = full.cfg
        self.cfg, self.tp = cfg, check_tp(cfg, tp)
        self.rank = check_int("rank", rank, 0, tp - 1)
        self.local = full if sliced else copy.deepcopy(full)  # norms, rotary tables and modules
        self.vocab_start = rank * cfg.vocab_size // tp
        collectives = Collectives(tp)
        self.comm = collectives.moved
        slices: dict[int, nn.Parameter] = {}  # a tied weight is sliced once: tok_emb and lm_head share the slice
        for entry in linear_layers(cfg):
            owner, _, name = entry.path.rpartition(".")
            parent = self.local.get_submodule(owner)
            mod = getattr(parent, name)
            want = shard(torch.empty(entry.shape, device="meta"), entry.tp_style, rank, tp).shape
            if sliced and mod.weight.shape != want:
                fail("full", f"{entry.path} of shape {tuple(mod.weight.shape)}", f"rank {rank}'s slice {tuple(want)}")
            if not sliced:
                full_weight = mod.weight
                if id(full_weight) not in slices:
                    slices[id(full_weight)] = nn.Parameter(shard(full_weight.detach(), entry.tp_style, rank, tp),
                                                           requires_grad=False)
                mod.weight = slices[id(full_weight)]
            setattr(parent, name, parallel_layer(entry, mod, collectives, self.vocab_start))

    @classmethod
    def from_local(cls, local: TinyLM, rank: int, tp: int) -> "ShardedTinyLM":
        """A rank's shard from a model that already holds only that rank's slices (built with the full config
        and loaded from the rank's part of a checkpoint, lab 07): no full copy of the weights ever exists on
        the rank. Refuses a weight whose shape is not the rank's slice."""
        if not isinstance(local, TinyLM):
            fail("local", type(local).__name__, "a TinyLM holding one rank's slices", TypeError)
        return cls(local, rank, tp, sliced=True)

    def forward(self, tokens: torch.Tensor, cache=None, embeds=None) -> torch.Tensor:
        """Full logits [B, T, vocab] (the same on every rank) for tokens [B, T]: TinyLM's forward on this rank's
        layers, continuing `cache` (a KVCache built with shard_config, or a BatchedCache over this rank's KV
        heads: the serving lab) when given; `embeds` (labkit.tinylm.model.merge_embeds) overwrites token embeddings
        after the embedding's all-reduce (lab 07)."""
        return self.local(tokens, cache, embeds)


def rebuild_model(cfg: TinyLMConfig, state: dict) -> TinyLM:
    """A TinyLM in eval mode from a config and a state dict (what a rank receives)."""
    model = TinyLM(cfg)
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def logits_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, tokens: torch.Tensor,
                  embeds=None) -> dict:
    """One rank of tensor_parallel_logits: the full logits and the elements each collective moved."""
    sharded = ShardedTinyLM(rebuild_model(cfg, state), rank, world)
    return {"logits": sharded(tokens, embeds=embeds), "comm": dict(sharded.comm)}


@torch.no_grad()
def generate_worker(rank: int, world: int, cfg: TinyLMConfig, state: dict, prompt: list[int],
                    max_new_tokens: int) -> dict:
    """One rank of tensor_parallel_generate: greedy tokens with a sharded KV cache, and the seconds each
    decode step took (prefill excluded)."""
    sharded = ShardedTinyLM(rebuild_model(cfg, state), rank, world)
    cache = KVCache(shard_config(cfg, world), max_len=len(prompt) + max_new_tokens)
    logits = sharded(torch.tensor([prompt]), cache)[0, -1]
    out, seconds = [], []
    for _ in range(max_new_tokens):
        out.append(int(logits.argmax()))
        if len(out) == max_new_tokens:
            break
        t0 = time.perf_counter()
        logits = sharded(torch.tensor([[out[-1]]]), cache)[0, -1]
        seconds.append(time.perf_counter() - t0)
    return {"tokens": out, "seconds": seconds, "comm": dict(sharded.comm)}


def tp_inputs(model, tp: int, pool: Pool | None) -> tuple[TinyLMConfig, dict]:
    """Checked (config, weights to send) for a TP run over `pool` (None: the shared pool of world tp);
    refuses before any process starts."""
    if not isinstance(model, TinyLM):
        fail("model", type(model).__name__, "a TinyLM", TypeError)
    tp = check_tp(model.cfg, tp)
    if pool is not None and pool.world != tp:
        fail("pool", pool, f"a Pool of world {tp} (= tp)")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model.cfg, state


def tensor_parallel_logits(model: TinyLM, tokens: torch.Tensor, tp: int, pool: Pool | None = None,
                           embeds=None) -> torch.Tensor:
    """Runs TinyLM split over `tp` real gloo processes (Megatron split) and returns the full logits
    [B, T, vocab]. Refuses a `tp` that does not divide the heads, KV heads, d_ff or vocabulary before any
    process starts. `pool` defaults to the session's shared pool of that size. `embeds`: see
    labkit.tinylm.model.merge_embeds."""
    cfg, state = tp_inputs(model, tp, pool)
    model(tokens, embeds=embeds)  # TinyLM's own checks of the inputs, here rather than on every rank
    return (pool or shared_pool(tp)).run(logits_worker, cfg, state, tokens, embeds)[0]["logits"]


def tensor_parallel_generate(model: TinyLM, prompt: list[int], max_new_tokens: int, tp: int,
                             pool: Pool | None = None) -> dict:
    """Greedy generation with TP=`tp`: {"tokens": new ids (every rank agrees), "seconds": per decode step
    (the slowest rank's), "comm": elements moved per collective kind on rank 0}."""
    cfg, state = tp_inputs(model, tp, pool)
    check_positive_int("max_new_tokens", max_new_tokens)
    prompt = [check_int("each prompt token", t, 0, cfg.vocab_size - 1) for t in prompt]
    if not prompt or len(prompt) + max_new_tokens > cfg.max_seq_len:
        fail("max_new_tokens", max_new_tokens, f"<= {cfg.max_seq_len - len(prompt)} with a prompt of {len(prompt)}")
    runs = (pool or shared_pool(tp)).run(generate_worker, cfg, state, prompt, max_new_tokens)
    if any(r["tokens"] != runs[0]["tokens"] for r in runs):
        raise RuntimeError("ranks disagree on the generated tokens")
    seconds = [max(s) for s in zip(*(r["seconds"] for r in runs))]
    return {"tokens": runs[0]["tokens"], "seconds": seconds, "comm": runs[0]["comm"]}


def all_reduce_bytes_per_token(cfg, bytes_per_element: int = 4) -> int:
    """Bytes all-reduced per token in one TP forward pass: d_model elements, twice per layer (attention,
    MLP) plus once for a vocab-parallel embedding. Independent of tp; each rank sends 2(tp-1)/tp of it."""
    return (2 * cfg.n_layers + 1) * cfg.d_model * check_positive_int("bytes_per_element", bytes_per_element)


def predicted_step_seconds(cfg, tp: int, link, single_seconds: float, bytes_per_element: int = 4) -> float:
    """Seconds per decode step of one sequence with TP=`tp`: the single-process step's compute split tp ways,
    plus 2 n_layers + 1 all-reduces of d_model elements and one all-gather of the logits, priced by `link`
    (a labkit.parallel.linkmodel.LinkModel)."""
    check_positive_int("tp", tp)
    b = check_positive_int("bytes_per_element", bytes_per_element)
    comm = (2 * cfg.n_layers + 1) * link.collective("all_reduce", cfg.d_model * b, tp)
    return single_seconds / tp + comm + link.collective("all_gather", cfg.vocab_size * b, tp)
