"""TinyLM, the course model: a Llama-style decoder small enough to train on 2 CPU cores (notebook 00;
every later lab quantizes, shards, pages or serves it).

    tokens -> tok_emb -> [ RMSNorm -> attention (RoPE, GQA) -> +residual
                           RMSNorm -> SwiGLU MLP            -> +residual ] x n_layers
           -> RMSNorm -> lm_head (tied to tok_emb by default) -> logits

Grouped-query attention: n_heads query heads share n_kv_heads key/value heads (n_heads / n_kv_heads
query heads per group), which shrinks the KV cache by that factor (notebook 05).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .._checks import check_int, check_type
from .cache import BatchedCache, Cache
from .config import TinyLMConfig
from .generate import generate


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [max_seq_len, head_dim], for rotary positions (Su et al., 2021), half-split layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by position: pairs (i, i + D/2) turn by angle pos * theta^(-2i/D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def merge_embeds(x: torch.Tensor, embeds) -> torch.Tensor:
    """x [B, T, d] with the rows of `embeds` = (rows int64 [n] into the flattened B*T positions, values [n, d])
    written over the token embeddings there: how a vision-language model feeds image features in place of its
    image placeholder tokens (lab 07). None leaves x as it is."""
    if embeds is None:
        return x
    if not (isinstance(embeds, tuple) and len(embeds) == 2 and all(isinstance(e, torch.Tensor) for e in embeds)):
        raise TypeError(f"embeds must be a (rows, values) pair of tensors or None, got {type(embeds).__name__}")
    rows, values = embeds
    B, T, d = x.shape
    if rows.dtype != torch.long or rows.dim() != 1 or values.shape != (rows.numel(), d) \
            or not values.is_floating_point():
        raise ValueError(f"embeds must be rows int64 [n] and float values [n, {d}], got rows {rows.dtype} "
                         f"{tuple(rows.shape)} and values {values.dtype} {tuple(values.shape)}")
    if rows.numel() and (rows.min() < 0 or rows.max() >= B * T):
        raise ValueError(f"embeds rows must be in [0, {B * T}) (the flattened batch x time positions), got "
                         f"[{int(rows.min())}, {int(rows.max())}]")
    x = x.reshape(B * T, d).index_copy(0, rows, values.to(x.dtype))  # [B*T, d], a copy: autograd-safe
    return x.view(B, T, d)


class Attention(nn.Module):
    """Grouped-query attention with rotary positions. The head counts are read from the projections' outputs
    (width / head_dim), so a tensor-parallel rank whose wq, wk, wv hold n_heads / tp and n_kv_heads / tp heads
    runs this same code (labkit.parallel.tensor)."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, H, T, hd], keys and values [B, Hkv, T, hd] of x [B, T, d], before rotary positions
        (lab 07's QK-norm attention overrides this)."""
        B, T, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:  # [B, T, heads * hd] -> [B, heads, T, hd]
            return y.view(B, T, y.shape[-1] // self.head_dim, self.head_dim).transpose(1, 2)

        return heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))  # [B, H, T, hd], [B, Hkv, T, hd] twice

    def forward(self, x, cos, sin, cache: Cache | None = None, layer: int = 0, start: int = 0):
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(cache, BatchedCache):  # packed sequences: the cache stores k, v and attends per sequence
            return self.wo(cache.attend(layer, q, k, v).transpose(1, 2).reshape(B, T, -1))
        if cache is not None:
            k, v = cache.update(layer, k, v)  # every cached position and the new ones: [B, Hkv, start + T, hd]
        group = q.shape[1] // k.shape[1]  # query heads per key/value head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if T == 1:
            out = F.scaled_dot_product_attention(q, k, v)  # one new token sees every cached position
        elif start == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # a chunk after cached tokens: query i sits at position start + i
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU (Shazeer, 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, layer=0, start=0):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer, start)
        return x + self.mlp(self.mlp_norm(x))


def run_blocks(layers, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None, start: int = 0,
               first: int = 0, last: int | None = None, checkpoint_every: int = 0) -> torch.Tensor:
    """The residual stream x [B, T, d_model] through blocks layers[first:last] (default: all), block i writing
    layer i of `cache`: the one loop over TinyLM's blocks. TinyLM.forward runs every block, a pipeline stage
    (labkit.parallel.pipeline) its slice, the captured decode step (labkit.cluster.graph) all of them. `layers`
    is indexed, so a stage's list may hold None for the blocks it does not own.

    checkpoint_every > 0: block i with i % checkpoint_every == 0 runs through torch.utils.checkpoint
    (use_reentrant=False), which keeps only its inputs and runs it again during backward (notebook 09); only
    while autograd records and without a cache (recomputing would write the cache a second time)."""
    recompute = checkpoint_every > 0 and cache is None and torch.is_grad_enabled()
    for i in range(first, len(layers) if last is None else last):
        if recompute and i % checkpoint_every == 0:
            x = checkpoint(layers[i], x, cos, sin, cache, i, start, use_reentrant=False)
        else:
            x = layers[i](x, cos, sin, cache, i, start)
    return x


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        if not isinstance(cfg, TinyLMConfig):
            raise TypeError(f"cfg must be a TinyLMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpoint_every = 0
        self.run_blocks = run_blocks  # the block loop forward calls; compile_blocks_apart wraps it for torch.compile
        self.apply(self._init)

    @property
    def checkpoint_every(self) -> int:
        """k > 0: while autograd records, forward runs blocks 0, k, 2k, ... through torch.utils.checkpoint
        (run_blocks' checkpoint_every; labkit.finetune.checkpointing, notebook 09). 0: no block is checkpointed."""
        return self._checkpoint_every

    @checkpoint_every.setter
    def checkpoint_every(self, every: int) -> None:
        self._checkpoint_every = check_int("checkpoint_every", every, 0)

    @staticmethod
    def _init(m: nn.Module):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None, embeds=None) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T]; `embeds` (see merge_embeds) replaces some token embeddings
        with given vectors (image features, lab 07). With a cache (anything that implements
        labkit.tinylm.cache.Cache), the tokens continue the cached sequence at positions cache.length ...,
        and their keys and values are handed to the cache. With a BatchedCache, tokens [1, N] pack several
        sequences (each token at the position the cache gives it) and the cache runs attention."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
            raise TypeError(f"tokens must be a 2-D int64 tensor [batch, time], got "
                            f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be a 2-D int64 tensor [batch, time], got shape {tuple(tokens.shape)}")
        if cache is not None and not isinstance(cache, (Cache, BatchedCache)):
            raise TypeError(f"cache must implement labkit.tinylm.cache.Cache (length, max_len, update, advance) "
                            f"or BatchedCache (positions, attend, advance), or be None, got {type(cache).__name__}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        cos, sin, start = self.rope(tokens, cache)
        built = getattr(cache, "cfg", self.cfg)  # a tensor-parallel rank's cache has fewer KV heads: update checks them
        if isinstance(cache, Cache) and (built.n_layers, built.head_dim) != (self.cfg.n_layers, self.cfg.head_dim):
            raise ValueError("cache was built for another config; build it with KVCache(model.cfg, ...)")
        if isinstance(cache, Cache) and getattr(cache, "batch_size", tokens.shape[0]) != tokens.shape[0]:
            raise ValueError(f"tokens batch size {tokens.shape[0]} does not match the cache's batch size "
                             f"{cache.batch_size}")
        x = self.run_blocks(self.layers, merge_embeds(self.tok_emb(tokens), embeds), cos, sin, cache, start,
                            checkpoint_every=self.checkpoint_every)
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.lm_head(self.norm(x))

    def rope(self, tokens: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(cos, sin, start) for tokens [B, T] continuing `cache`: the rotary tables at positions start ..
        start + T - 1, or at each packed token's own position for a BatchedCache (start 0 then). Checks that
        the positions fit the context (forward checks the rest). Used by forward and by tensor-parallel shards
        (labkit.parallel), whose caches hold a shard's heads."""
        B, T = tokens.shape
        if isinstance(cache, BatchedCache):
            pos = cache.positions(T)
            if B != 1 or T < 1 or pos.shape != (T,) or pos.min() < 0 or pos.max() >= self.cfg.max_seq_len:
                raise ValueError(f"a packed batch must be tokens [1, N] with positions in [0, "
                                 f"{self.cfg.max_seq_len}) (the model's context), got tokens {tuple(tokens.shape)}")
            return self.rope_cos[pos], self.rope_sin[pos], 0
        start = 0 if cache is None else cache.length
        limit = self.cfg.max_seq_len if cache is None else min(cache.max_len, self.cfg.max_seq_len)
        if B < 1 or T < 1 or start + T > limit:
            raise ValueError(f"sequence length {start + T} (cached {start} + new {T}, batch {B}) must be in "
                             f"[1, {limit}] (the model's context is {self.cfg.max_seq_len} tokens)")
        return self.rope_cos[start:start + T], self.rope_sin[start:start + T], start

    def generate(self, prompt, max_new_tokens: int, **kw) -> list[int]:
        """labkit.tinylm.generate.generate(self, ...): new token ids after `prompt`."""
        return generate(self, prompt, max_new_tokens, **kw)


def compile_blocks_apart(model: TinyLM) -> TinyLM:
    """Have torch.compile skip the frame of `model`'s block loop (run_blocks through torch.compiler.disable,
    recursive=False) so that each block is its own graph: labkit.cluster.compiled calls this before it
    compiles, and it and notebook 08 count 6 graphs and 5 breaks per decode step. A choice of this model
    only (its attribute run_blocks); eager results are the same. Not a default: the wrapper imports
    torch._dynamo, 1.2 s of every process's start (each replica, engine process and rank). Returns `model`."""
    check_type("model", model, TinyLM, "a TinyLM")
    model.run_blocks = torch.compiler.disable(run_blocks, recursive=False)
    return model
