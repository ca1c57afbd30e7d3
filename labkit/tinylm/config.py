"""TinyLM's configuration, its parameter counts, and the one table of its linear layers (notebook 00;
labs 02-04 read the table instead of parsing parameter names).

    LINEAR_LAYERS(cfg), in forward order:
        path                 layer type   tensor-parallel style   shape [out, in]
        tok_emb              embedding    vocab                   [vocab, d_model]  (rows are looked up)
        layers.i.attn.wq     attention    column                  [n_heads * head_dim, d_model]
        layers.i.attn.wk     attention    column                  [n_kv_heads * head_dim, d_model]
        layers.i.attn.wv     attention    column                  [n_kv_heads * head_dim, d_model]
        layers.i.attn.wo     attention    row                     [d_model, n_heads * head_dim]
        layers.i.mlp.w_gate  mlp          column                  [d_ff, d_model]
        layers.i.mlp.w_up    mlp          column                  [d_ff, d_model]
        layers.i.mlp.w_down  mlp          row                     [d_model, d_ff]
        lm_head              head         vocab                   [vocab, d_model]  (tied: tok_emb's weight)

Column-parallel layers split their output features across ranks, row-parallel ones their input features
(Megatron-LM, Shoeybi et al. 2019); "vocab" splits the vocabulary rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterator

import torch.nn as nn

from .._checks import check_bool, check_positive, check_positive_int, check_type
from ..rng import Rng

@dataclass(frozen=True)
class TinyLMConfig:
    """The shape of a TinyLM; checks itself (positive sizes, heads that divide, an even head width)."""
    vocab_size: int = 256
    """token ids are in [0, vocab_size): 256 for the byte-level tokenizer"""
    d_model: int = 128
    """width of the residual stream (elements per token)"""
    n_layers: int = 4
    """decoder blocks"""
    n_heads: int = 4
    """query heads; head_dim = d_model / n_heads"""
    n_kv_heads: int = 2
    """key/value heads, shared by n_heads / n_kv_heads query heads each (grouped-query attention)"""
    d_ff: int = 384
    """hidden width of the SwiGLU MLP"""
    max_seq_len: int = 256
    """the context: the most positions one sequence may have (tokens)"""
    rope_theta: float = 10000.0
    """base of the rotary position frequencies"""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon"""
    tie_embeddings: bool = True
    """the output layer reuses the embedding matrix"""

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head_dim ({self.d_model // self.n_heads}) must be even for rotary positions")
        for name in ("rope_theta", "norm_eps"):
            check_positive(name, getattr(self, name))
        check_bool("tie_embeddings", self.tie_embeddings)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TinyLMConfig":
        if not isinstance(d, dict):
            raise TypeError(f"d must be a dict of TinyLMConfig fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TinyLMConfig field(s) {unknown}; expected some of {sorted(known)}")
        return cls(**d)


def param_counts(cfg: TinyLMConfig) -> dict[str, int]:
    """Parameters by layer type, from the config alone: embedding, attention, mlp, norm (and total).

    The mixed-precision lab (03) quantizes each type differently, so it needs this split.
    """
    check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
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
    """A small random valid config (for exercise checks and tests); `rng` is a labkit.rng.Rng."""
    check_type("rng", rng, Rng, "a labkit.rng.Rng")
    n_kv = 1 + rng.below(4)
    n_heads = n_kv * (1 + rng.below(4))
    head_dim = 2 * (1 + rng.below(16))
    return TinyLMConfig(vocab_size=1 + rng.below(512), d_model=n_heads * head_dim, n_layers=1 + rng.below(8),
                        n_heads=n_heads, n_kv_heads=n_kv, d_ff=1 + rng.below(1024),
                        max_seq_len=1 + rng.below(512), tie_embeddings=bool(rng.below(2)))


LAYER_TYPES = ("embedding", "attention", "mlp", "head")
TP_STYLES = ("vocab", "column", "row")


@dataclass(frozen=True)
class LinearLayer:
    """One weight matrix of TinyLM: its module path, layer type, tensor-parallel style and shape [out, in]."""
    path: str
    layer_type: str
    tp_style: str
    shape: tuple[int, int]

    @property
    def layer(self) -> int | None:
        """The block index for layers.i.*, None for tok_emb and lm_head."""
        return int(self.path.split(".")[1]) if self.path.startswith("layers.") else None


_SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "head_dim")


def linear_layers(cfg) -> list[LinearLayer]:
    """Every weight matrix of a TinyLM with config `cfg`, in forward order (see the module docstring).
    `cfg` may also be any architecture with the same fields (a labkit.specs.ModelSpec of a Llama-style
    model): notebook 02 lays out a 70B model's tensors from this table."""
    missing = [f for f in _SHAPE_FIELDS if not hasattr(cfg, f)]
    if missing:
        raise TypeError(f"cfg must be a TinyLMConfig or a ModelSpec (fields {_SHAPE_FIELDS}), "
                        f"got {type(cfg).__name__} without {missing}")
    d, q, kv, ff, v = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff, cfg.vocab_size
    out = [LinearLayer("tok_emb", "embedding", "vocab", (v, d))]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        out += [LinearLayer(p + "attn.wq", "attention", "column", (q, d)),
                LinearLayer(p + "attn.wk", "attention", "column", (kv, d)),
                LinearLayer(p + "attn.wv", "attention", "column", (kv, d)),
                LinearLayer(p + "attn.wo", "attention", "row", (d, q)),
                LinearLayer(p + "mlp.w_gate", "mlp", "column", (ff, d)),
                LinearLayer(p + "mlp.w_up", "mlp", "column", (ff, d)),
                LinearLayer(p + "mlp.w_down", "mlp", "row", (d, ff))]
    return out + [LinearLayer("lm_head", "head", "vocab", (v, d))]


def iter_linears(model: nn.Module, types: tuple[str, ...] = LAYER_TYPES,
                 skip_tied: bool = True) -> Iterator[tuple[LinearLayer, nn.Module]]:
    """(table entry, module) for every weight matrix of a TinyLM whose type is in `types`, in forward order.
    With skip_tied, a tied lm_head (it shares tok_emb's weight) is left out: it is not a matrix of its own.
    The module may be an nn.Linear, an nn.Embedding or a quantized replacement (labkit.quant)."""
    cfg = check_tinylm(model).cfg
    check_bool("skip_tied", skip_tied)
    if isinstance(types, str):
        raise TypeError(f"types must be a tuple of layer types such as ('mlp',), got {types!r}")
    bad = [t for t in types if t not in LAYER_TYPES]
    if bad:
        raise ValueError(f"types must be some of {LAYER_TYPES}, got {tuple(types)!r}")
    for entry in linear_layers(cfg):
        if entry.layer_type not in types or (skip_tied and entry.path == "lm_head" and cfg.tie_embeddings):
            continue
        yield entry, model.get_submodule(entry.path)


def check_tinylm(model) -> nn.Module:
    """`model` itself if it is a TinyLM (an nn.Module with a TinyLMConfig .cfg, quantized copies included),
    else a TypeError: what every function that takes a model checks first."""
    if not isinstance(model, nn.Module) or not isinstance(getattr(model, "cfg", None), TinyLMConfig):
        raise TypeError(f"model must be a TinyLM (an nn.Module with a TinyLMConfig .cfg), got {type(model).__name__}")
    return model


def layer_type(param_name: str) -> str:
    """The layer type of a TinyLM parameter name ("layers.0.attn.wq.weight" -> "attention"): one of
    LAYER_TYPES, or "norm" for the RMSNorm weights. Read from the table, not parsed by substring."""
    if not isinstance(param_name, str):
        raise TypeError(f"param_name must be a str, got {type(param_name).__name__}")
    parts = param_name.removesuffix(".weight").split(".")
    if len(parts) >= 3 and parts[0] == "layers" and parts[1].isdigit():  # layers.<i>.<module in the block>
        kind = _BLOCK_TYPES.get(".".join(parts[2:]))
    else:
        kind = _TOP_TYPES.get(".".join(parts))
    if kind is None:
        raise ValueError(f"param_name {param_name!r} is not a TinyLM parameter")
    return kind


_ONE_BLOCK = linear_layers(TinyLMConfig(n_layers=1))
_BLOCK_TYPES = {e.path.split(".", 2)[2]: e.layer_type for e in _ONE_BLOCK if e.layer is not None}
_BLOCK_TYPES.update({"attn_norm": "norm", "mlp_norm": "norm"})
_TOP_TYPES = {e.path: e.layer_type for e in _ONE_BLOCK if e.layer is None} | {"norm": "norm"}
