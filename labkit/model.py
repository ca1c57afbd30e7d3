"""TinyLM, the course model: a Llama-style decoder small enough to train on 2 CPU cores (notebook 00;
every later lab quantizes, shards, pages or serves it).

    tokens -> tok_emb -> [ RMSNorm -> attention (RoPE, GQA) -> +residual
                           RMSNorm -> SwiGLU MLP            -> +residual ] x n_layers
           -> RMSNorm -> lm_head (tied to tok_emb by default) -> logits

Grouped-query attention: n_heads query heads share n_kv_heads key/value heads (n_heads / n_kv_heads
query heads per group), which shrinks the KV cache by that factor (notebook 05).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 384
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head_dim ({self.d_model // self.n_heads}) must be even for rotary positions")
        for name in ("rope_theta", "norm_eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be a bool, got {self.tie_embeddings!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TinyLMConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TinyLMConfig field(s) {unknown}; expected some of {sorted(known)}")
        return cls(**d)


def param_counts(cfg: TinyLMConfig) -> dict[str, int]:
    """Parameters by layer type, from the config alone: embedding, attention, mlp, norm (and total).

    The mixed-precision lab (03) quantizes each type differently, so it needs this split.
    """
    d, hd = cfg.d_model, cfg.head_dim
    attention = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d
    mlp = 3 * d * cfg.d_ff
    counts = {
        "embedding": cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2),
        "attention": cfg.n_layers * attention,
        "mlp": cfg.n_layers * mlp,
        "norm": (2 * cfg.n_layers + 1) * d,
    }
    counts["total"] = sum(counts.values())
    return counts


def random_config(rng) -> TinyLMConfig:
    """A small random valid config (for exercise checks and tests); `rng` is a labkit.data.Rng."""
    n_kv = 1 + rng.below(4)
    n_heads = n_kv * (1 + rng.below(4))
    head_dim = 2 * (1 + rng.below(16))
    return TinyLMConfig(vocab_size=1 + rng.below(512), d_model=n_heads * head_dim, n_layers=1 + rng.below(8),
                        n_heads=n_heads, n_kv_heads=n_kv, d_ff=1 + rng.below(1024),
                        max_seq_len=1 + rng.below(512), tie_embeddings=bool(rng.below(2)))


def layer_type(param_name: str) -> str:
    """The layer type ("embedding", "attention", "mlp", "norm") of a TinyLM parameter name."""
    for key, kind in ((".attn.", "attention"), (".mlp.", "mlp"), ("norm", "norm"),
                      ("tok_emb", "embedding"), ("lm_head", "embedding")):
        if key in param_name:
            return kind
    raise ValueError(f"param_name {param_name!r} is not a TinyLM parameter")


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


class KVCache:
    """Contiguous KV cache: keys and values for every layer, preallocated to `max_len` positions.

        k, v: [n_layers, batch, n_kv_heads, max_len, head_dim];  positions [0, length) are filled.

    Reserving max_len up front is simple and wastes memory for short sequences: notebook 05 replaces it
    with a paged cache.
    """

    def __init__(self, cfg: TinyLMConfig, batch_size: int = 1, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        max_len = cfg.max_seq_len if max_len is None else max_len
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(max_len, int) or not 1 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"max_len must be an int in [1, {cfg.max_seq_len}], got {max_len!r}")
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.cfg = cfg
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def nbytes(self) -> int:
        """Bytes reserved by the cache (keys + values)."""
        return self.k.numel() * self.k.element_size() * 2


class Attention(nn.Module):
    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, start: int = 0):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache.k[layer, :, :, start:start + T] = k
            cache.v[layer, :, :, start:start + T] = v
            k, v = cache.k[layer, :, :, :start + T].to(q.dtype), cache.v[layer, :, :, :start + T].to(q.dtype)
        group = self.n_heads // self.n_kv_heads  # query heads per key/value head
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
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T]. With a cache, the tokens continue the cached sequence
        (positions cache.length ...), and their keys and values are appended to it."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a 2-D int64 tensor [batch, time], got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)} {getattr(tokens, 'dtype', '')}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        B, T = tokens.shape
        start = 0 if cache is None else cache.length
        limit = self.cfg.max_seq_len if cache is None else cache.max_len
        if B < 1 or T < 1 or start + T > limit:
            raise ValueError(f"sequence length {start + T} (cached {start} + new {T}, batch {B}) must be in "
                             f"[1, {limit}] (the model's context is {self.cfg.max_seq_len} tokens)")
        if cache is not None and cache.cfg != self.cfg:
            raise ValueError("cache was built for another config; build it with KVCache(model.cfg, ...)")
        if cache is not None and cache.k.shape[1] != B:
            raise ValueError(f"tokens batch size {B} does not match the cache's batch size {cache.k.shape[1]}")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        x = self.tok_emb(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, start)
        if cache is not None:
            cache.length = start + T
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 seed: int = 0, stop_token: int | None = None, use_cache: bool = True) -> list[int]:
        """Continue `prompt` (a list of token ids) by up to `max_new_tokens`; returns the new ids only.

        temperature 0 is greedy; otherwise sample from softmax(logits / temperature), restricted to the
        `top_k` most likely tokens when top_k is given, with a torch.Generator seeded by `seed`.
        Generation stops after `stop_token` if it is produced. `use_cache=False` recomputes the whole
        sequence for every new token (the baseline of notebook 05).
        """
        V, ctx = self.cfg.vocab_size, self.cfg.max_seq_len
        prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt
        if isinstance(prompt, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError(f"prompt must be a list of token ids (ints in [0, {V})); encode text with "
                             f"ByteTokenizer first, got {str(prompt)[:60]!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if not prompt or len(prompt) + max_new_tokens > ctx:
            raise ValueError(f"prompt length {len(prompt)} + max_new_tokens {max_new_tokens} must be in "
                             f"[1, {ctx}] (the model's context)")
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k <= V):
            raise ValueError(f"top_k must be None or an int in [1, {V}], got {top_k!r}")
        if stop_token is not None and (not isinstance(stop_token, int) or not 0 <= stop_token < V):
            raise ValueError(f"stop_token must be None or an int in [0, {V}), got {stop_token!r}")
        if not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        device = self.tok_emb.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        cache = KVCache(self.cfg, dtype=self.tok_emb.weight.dtype, device=device) if use_cache else None
        seq, out = list(prompt), []
        logits = self(torch.tensor([seq], device=device), cache)[0, -1]
        for step in range(max_new_tokens):
            nxt = sample(logits, temperature, top_k, gen)
            out.append(nxt)
            seq.append(nxt)
            if nxt == stop_token or step == max_new_tokens - 1:
                break
            inp = torch.tensor([[nxt]] if use_cache else [seq], device=device)
            logits = self(inp, cache)[0, -1]
        return out


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator) -> int:
    """One token id from logits [vocab]: argmax when temperature is 0, else a seeded draw."""
    logits = logits.double() / temperature if temperature > 0 else logits
    if temperature == 0 or not torch.isfinite(logits).all():  # a tiny temperature overflows: its limit is greedy
        return int(logits.argmax())
    if top_k is not None:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1).float(), 1, generator=gen))


def load_pretrained(path=None):
    """(model, tokenizer) from the committed checkpoint in data/, in eval mode, with no network.
    The loading and its checks live in labkit/checkpoint.py."""
    from .checkpoint import CHECKPOINT
    from .checkpoint import load_pretrained as load

    return load(CHECKPOINT if path is None else path)
