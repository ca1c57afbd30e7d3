"""Model presets: real models described by their architecture.

Used by notebook 01_memory_wall (and by 02, which scales TinyLM's traces to 7B and 70B layouts).
Parameter counts are *computed* from the architecture (layers, widths, heads, vocabulary, experts) and
tested against the totals the model authors published. `kv_bytes_per_token` is also the reference of
notebook 01's first exercise (labkit.memory_wall.exercises). Units: parameters, bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache

from .._checks import check_bool, check_choice, check_positive, check_positive_int, check_type, fail
from ..paths import TINYLM_CHECKPOINT
from ..tinylm import TinyLMConfig, param_counts

TINYLM_JSON = TINYLM_CHECKPOINT.with_suffix(".json")
MLPS = ("gelu", "swiglu")          # two matrices (GPT-3, OPT) or three (Llama, Mixtral)
NORMS = ("layernorm", "rmsnorm")   # weight and bias, or weight only


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

    context: the longest sequence (tokens) the model was trained for; mlp: "gelu" (two matrices, GPT-3/OPT)
    or "swiglu" (three, Llama/Mixtral); norm: "layernorm" (weight and bias) or "rmsnorm" (weight only);
    bias: linear layers carry biases; positions: learned position embeddings (0 for rotary);
    n_experts / experts_per_token: a mixture of experts replaces each MLP by n_experts MLPs of which
    experts_per_token run for each token (plus a router); published_params / published_active: the totals
    the authors published (parameters), which tests compare with the computed counts.
    Validates itself: wrong types raise TypeError, impossible or inconsistent values ValueError."""
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
        """Refuse what no transformer has: a wrong type is a TypeError, an impossible value a ValueError."""
        check_type("name", self.name, str)
        if not self.name:
            fail("name", self.name, "a non-empty str")
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "context", "n_experts",
                  "experts_per_token"):
            object.__setattr__(self, f, check_positive_int(f, getattr(self, f)))  # numpy ints stored as int
        object.__setattr__(self, "positions", check_positive_int("positions", self.positions, allow_zero=True))
        check_choice("mlp", self.mlp, MLPS)
        check_choice("norm", self.norm, NORMS)
        check_bool("bias", self.bias)
        check_bool("tied_embeddings", self.tied_embeddings)
        for f in ("published_params", "published_active"):
            if getattr(self, f) is not None:
                check_positive(f, getattr(self, f), unit="parameters")
        check_type("source", self.source, str)
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads must divide d_model and n_kv_heads must divide n_heads, got d_model="
                             f"{self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}")
        if self.experts_per_token > self.n_experts:
            fail("experts_per_token", self.experts_per_token, f"<= n_experts ({self.n_experts})")
        if self.published_active is not None and self.published_params is not None \
                and self.published_active > self.published_params:
            fail("published_active", self.published_active, f"<= published_params ({self.published_params:g})")

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
    names = sorted([*MODELS, "tinylm"])
    if not isinstance(name, str):
        fail("name", name, f"one of {tuple(names)}", TypeError)
    check_choice("name", name, names)
    return _tinylm() if name == "tinylm" else MODELS[name]


def model_names() -> list[str]:
    """The names model() accepts, largest-first except TinyLM last."""
    return [*MODELS, "tinylm"]
