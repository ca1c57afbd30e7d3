"""Model presets: real models described by their architecture.

Used by notebook 01_memory_wall (and by 02, which scales TinyLM's traces to 7B and 70B layouts).
Parameter counts are *computed* from the architecture (layers, widths, heads, vocabulary, experts) and
tested against the totals the model authors published. Device figures come from data/hardware.json,
each entry naming its source. Units: bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache

from .._checks import check_positive, check_positive_int
from ..paths import TINYLM_CHECKPOINT
from ..tinylm import TinyLMConfig, param_counts

TINYLM_JSON = TINYLM_CHECKPOINT.with_suffix(".json")


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_element: float = 2) -> int:
    """Bytes the KV cache grows by per token of context, per sequence: a key and a value vector of
    `head_dim` elements for every KV head of every layer, 2 * n_layers * n_kv_heads * head_dim elements.
    Fractional element sizes (0.5 for INT4) are allowed; the result is rounded up to whole bytes."""
    for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        check_positive_int(name, v)
    b = check_positive("bytes_per_element", bytes_per_element)
    return math.ceil(2 * n_layers * n_kv_heads * head_dim * b)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory is concerned.

    context: the longest sequence (tokens) the model was trained for; mlp: "gelu" (two matrices, GPT-3/OPT) or "swiglu" (three, Llama/Mixtral); norm: "layernorm" (weight and
    bias) or "rmsnorm" (weight only); bias: linear layers carry biases; positions: learned position
    embeddings (0 for rotary); n_experts / experts_per_token: a mixture of experts replaces each MLP by
    n_experts MLPs of which experts_per_token run for each token (plus a router)."""
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    context: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False
    tied_embeddings: bool = False
    positions: int = 0
    n_experts: int = 1
    experts_per_token: int = 1
    published_params: float | None = None
    published_active: float | None = None
    source: str = ""

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "context", "n_experts",
                  "experts_per_token"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        if isinstance(self.positions, bool) or not isinstance(self.positions, int) or self.positions < 0:
            raise ValueError(f"positions must be an integer >= 0, got {self.positions!r}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads must divide d_model and n_kv_heads must divide n_heads, got d_model="
                             f"{self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"experts_per_token must be <= n_experts ({self.n_experts}), "
                             f"got {self.experts_per_token}")
        if self.mlp not in ("gelu", "swiglu") or self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu' and norm 'layernorm' or 'rmsnorm', "
                             f"got mlp={self.mlp!r}, norm={self.norm!r}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: d_model / n_heads."""
        return self.d_model // self.n_heads

    def counts(self) -> dict[str, int]:
        """Parameters by layer type (embedding, attention, mlp, norm, router) and their total."""
        d, hd = self.d_model, self.head_dim
        q_out, kv_out = self.n_heads * hd, self.n_kv_heads * hd
        attention = d * q_out + 2 * d * kv_out + q_out * d
        n_mats = 3 if self.mlp == "swiglu" else 2
        expert = n_mats * d * self.d_ff
        if self.bias:
            attention += q_out + 2 * kv_out + d
            expert += (n_mats - 1) * self.d_ff + d
        norm_size = 2 * d if self.norm == "layernorm" else d
        router = d * self.n_experts if self.n_experts > 1 else 0
        out = {
            "embedding": self.vocab_size * d * (1 if self.tied_embeddings else 2) + self.positions * d,
            "attention": self.n_layers * attention,
            "mlp": self.n_layers * self.n_experts * expert,
            "norm": (2 * self.n_layers + 1) * norm_size,
            "router": self.n_layers * router,
        }
        out["total"] = sum(out.values())
        out["expert_mlp"] = expert  # one expert of one layer
        return out

    @property
    def n_params(self) -> int:
        """All parameters, as stored."""
        return self.counts()["total"]

    @property
    def active_params(self) -> int:
        """Parameters read to produce one token: all but the experts that the router did not pick."""
        c = self.counts()
        idle = self.n_layers * (self.n_experts - self.experts_per_token) * c["expert_mlp"]
        return c["total"] - idle

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> int:
        """KV-cache bytes per token of context for one sequence."""
        return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, bytes_per_element)


@cache
def _tinylm() -> ModelSpec:
    cfg = TinyLMConfig.from_dict(json.loads(TINYLM_JSON.read_text())["config"])
    return ModelSpec("tinylm", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size,
                     cfg.max_seq_len, tied_embeddings=cfg.tie_embeddings,
                     published_params=param_counts(cfg)["total"], source="data/tinylm.json (this course)")


_LLAMA2 = "Touvron et al., Llama 2 (arXiv:2307.09288); count from the Hugging Face safetensors index"
_LLAMA3 = "Meta Llama 3 model card (github.com/meta-llama/llama3); count from the Hugging Face safetensors index"
MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    ModelSpec("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, mlp="gelu", norm="layernorm", bias=True,
              tied_embeddings=True, positions=2048, published_params=175.0e9,
              source="Brown et al., Language Models are Few-Shot Learners (arXiv:2005.14165), Table 2.1"),
    ModelSpec("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, mlp="gelu", norm="layernorm", bias=True,
              tied_embeddings=True, positions=2050, published_params=13e9,
              source="Zhang et al., OPT: Open Pre-trained Transformer Language Models (arXiv:2205.01068), Table 1"),
    ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, published_params=6_738_415_616, source=_LLAMA2),
    ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, published_params=68_976_648_192,
              source=_LLAMA2),
    ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, published_params=8_030_261_248, source=_LLAMA3),
    ModelSpec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, published_params=70_553_706_496,
              source=_LLAMA3),
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, n_experts=8, experts_per_token=2,
              published_params=46.7e9, published_active=12.9e9,
              source="Jiang et al., Mixtral of Experts (arXiv:2401.04088): 47B total, 13B active; "
                     "mistral.ai/news/mixtral-of-experts: 46.7B total, 12.9B per token"),
    ModelSpec("dense-320b", 100, 16384, 128, 8, 53248, 128256, 8192, published_params=320e9,
              source="hypothetical: the source material's 320B model, given Llama-3-405B widths and 100 layers"),
    ModelSpec("moe-3t", 77, 12288, 96, 8, 16384, 128256, 8192, n_experts=64, experts_per_token=2,
              published_params=3e12,
              source="hypothetical: the source material's 3-trillion-parameter model as a 64-expert, top-2 MoE"),
]}


def model(name: str) -> ModelSpec:
    """The preset called `name` (lower case, dashes: "gpt3-175b", "llama-2-7b", "mixtral-8x7b", "tinylm")."""
    if name == "tinylm":
        return _tinylm()
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"name must be one of {sorted([*MODELS, 'tinylm'])}, got {name!r}")
    return MODELS[name]


def model_names() -> list[str]:
    """The names model() accepts, largest-first except TinyLM last."""
    return [*MODELS, "tinylm"]
