"""Model presets: real models described by their architecture.

Used by notebook 01_memory_wall (and by 02, which scales TinyLM's traces to 7B and 70B layouts).
Parameter counts are *computed* from the architecture (layers, widths, heads, vocabulary, experts) and
tested against the totals the model authors published. `kv_bytes_per_token` is also the reference of
notebook 01's first exercise (labkit.memory_wall.exercises). Units: parameters, bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from .._checks import check_bool, check_choice, check_positive, check_positive_int, check_type, fail
from ..paths import TINYLM_CHECKPOINT
from ..tinylm import param_counts, read_config

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
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
    the authors published (parameters), which tests compare with the computed counts; for a course stand-in
    (`hypothetical`: its source starts with "hypothetical") they are the totals the course sized it to, an
    assumption and not a publication.

    DeepSeek-style mixtures (DeepSeek-V3, Kimi K2): moe_d_ff is an expert's width (0: d_ff);
    n_shared_experts run for every token beside the routed ones; the first `first_dense_layers` layers keep a
    dense MLP of width d_ff. Multi-head latent attention (MLA, DeepSeek-V2, arXiv:2405.04434, section 2.1)
    when kv_lora_rank > 0: keys and values are rebuilt from one compressed latent of kv_lora_rank elements
    per token and layer, plus a shared rotary key of qk_rope_head_dim elements, and only those are cached;
    queries are compressed to q_lora_rank (0: no query compression); each head has a qk_nope_head_dim +
    qk_rope_head_dim wide query and key and a v_head_dim wide value.

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
    moe_d_ff: int = 0
    n_shared_experts: int = 0
    first_dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self):
        """Refuse what no transformer has: a wrong type is a TypeError, an impossible value a ValueError."""
        check_type("name", self.name, str)
        if not self.name:
            fail("name", self.name, "a non-empty str")
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "context", "n_experts",
                  "experts_per_token"):
            object.__setattr__(self, f, check_positive_int(f, getattr(self, f)))  # numpy ints stored as int
        for f in ("positions", *MLA_FIELDS, "moe_d_ff", "n_shared_experts", "first_dense_layers"):
            object.__setattr__(self, f, check_positive_int(f, getattr(self, f), allow_zero=True))
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
        if self.first_dense_layers >= self.n_layers:
            fail("first_dense_layers", self.first_dense_layers, f"< n_layers ({self.n_layers})")
        if self.n_experts == 1:
            for f in ("moe_d_ff", "n_shared_experts", "first_dense_layers"):
                if getattr(self, f):
                    fail(f, getattr(self, f), "0 for a dense model (n_experts=1)")
        if self.kv_lora_rank:
            for f in MLA_FIELDS[2:]:
                if not getattr(self, f):
                    fail(f, getattr(self, f), "a positive int when kv_lora_rank > 0 (multi-head latent attention)")
            if self.n_kv_heads != self.n_heads or self.bias:
                raise ValueError(f"multi-head latent attention has one latent for all heads and no biases: "
                                 f"n_kv_heads must equal n_heads ({self.n_heads}) and bias be False, got "
                                 f"n_kv_heads={self.n_kv_heads}, bias={self.bias}")
        elif any(getattr(self, f) for f in MLA_FIELDS):
            f = next(f for f in MLA_FIELDS if getattr(self, f))
            fail(f, getattr(self, f), "0 unless kv_lora_rank > 0 (multi-head latent attention)")
        if self.published_active is not None and self.published_params is not None \
                and self.published_active > self.published_params:
            fail("published_active", self.published_active, f"<= published_params ({self.published_params:g})")

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (kv_lora_rank > 0)."""
        return self.kv_lora_rank > 0

    @property
    def hypothetical(self) -> bool:
        """True for a course stand-in (its published_params is the course's assumption, not a publication)."""
        return self.source.startswith("hypothetical")

    @property
    def head_dim(self) -> int:
        """Width of one attention head's query and key: d_model / n_heads (MLA: nope + rope widths)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.d_model // self.n_heads

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.n_layers - self.first_dense_layers if self.n_experts > 1 else 0

    def _mlp(self, width: int) -> int:
        """Parameters of one MLP (or one expert) of `width` hidden units."""
        n_mats = 3 if self.mlp == "swiglu" else 2
        return n_mats * self.d_model * width + ((n_mats - 1) * width + self.d_model if self.bias else 0)

    def _attention(self) -> tuple[int, int]:
        """(linear-layer parameters, norm parameters) of one layer's attention."""
        d, h = self.d_model, self.n_heads
        if not self.is_mla:
            q_out, kv_out = h * self.head_dim, self.n_kv_heads * self.head_dim
            return 2 * d * q_out + 2 * d * kv_out + (q_out + 2 * kv_out + d if self.bias else 0), 0
        q = h * self.head_dim
        q_proj = d * self.q_lora_rank + self.q_lora_rank * q if self.q_lora_rank else d * q
        kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * h * (
            self.qk_nope_head_dim + self.v_head_dim)
        return q_proj + kv + h * self.v_head_dim * d, self.q_lora_rank + self.kv_lora_rank

    def counts(self) -> dict[str, int]:
        """Parameters by layer type (embedding, attention, mlp, norm, router) and their total; `expert_mlp`
        is one expert of one layer (one MLP for a dense model)."""
        d = self.d_model
        expert = self._mlp(self.moe_d_ff or self.d_ff)
        attention, attention_norms = self._attention()
        norm_size = 2 * d if self.norm == "layernorm" else d
        experts_per_layer = self.n_experts + self.n_shared_experts
        out = {
            "embedding": self.vocab_size * d * (1 if self.tied_embeddings else 2) + self.positions * d,
            "attention": self.n_layers * attention,
            "mlp": (self.n_layers - self.moe_layers) * self._mlp(self.d_ff) + self.moe_layers * experts_per_layer
            * expert,
            "norm": (2 * self.n_layers + 1) * norm_size + self.n_layers * attention_norms,
            "router": self.moe_layers * d * self.n_experts,
        }
        out["total"] = sum(out.values())
        out["expert_mlp"] = expert
        return out

    @property
    def n_params(self) -> int:
        """All parameters, as stored."""
        return self.counts()["total"]

    @property
    def active_params(self) -> int:
        """Parameters read to produce one token: all but the experts that the router did not pick."""
        c = self.counts()
        idle = self.moe_layers * (self.n_experts - self.experts_per_token) * c["expert_mlp"]
        return c["total"] - idle

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> int:
        """KV-cache bytes per token of context for one sequence. MLA caches one latent of kv_lora_rank +
        qk_rope_head_dim elements per layer (DeepSeek-V3: (512 + 64) x 61 x 2 bytes = 70,272)."""
        if not self.is_mla:
            return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, bytes_per_element)
        b = check_positive("bytes_per_element", bytes_per_element)
        return math.ceil((self.kv_lora_rank + self.qk_rope_head_dim) * self.n_layers * b)


@cache
def _tinylm() -> ModelSpec:
    cfg = read_config(TINYLM_CHECKPOINT)
    return ModelSpec("tinylm", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size,
                     cfg.max_seq_len, tied_embeddings=cfg.tie_embeddings,
                     published_params=param_counts(cfg)["total"], source="data/tinylm/config.json (this course)")


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
              source="hypothetical: the 320B model of \"Hardware Challenges in Large Model Deployment\", given "
                     "Llama-3-405B widths and 100 layers"),
    ModelSpec("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072, published_params=405e9,
              source="Llama Team, The Llama 3 Herd of Models (arXiv:2407.21783), Table 3: 126 layers, model "
                     "dimension 16,384, FFN 53,248, 128 heads, 8 KV heads; 405B parameters"),
    ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 131072, n_experts=256, experts_per_token=8,
              moe_d_ff=2048, n_shared_experts=1, first_dense_layers=3, q_lora_rank=1536, kv_lora_rank=512,
              qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, published_params=671e9,
              published_active=37e9,
              source="DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv:2412.19437), section 4.2: 61 layers, "
                     "hidden 7168, 128 heads, MLA d_c=512, d_h^R=64, 1 shared + 256 routed experts of 2048, "
                     "top-8, first 3 layers dense; 671B total, 37B active (the 14B multi-token-prediction "
                     "module is not counted)"),
    ModelSpec("kimi-k2", 61, 7168, 64, 64, 18432, 163840, 131072, n_experts=384, experts_per_token=8,
              moe_d_ff=2048, n_shared_experts=1, first_dense_layers=1, q_lora_rank=1536, kv_lora_rank=512,
              qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, published_params=1.04e12,
              published_active=32e9,
              source="Kimi Team, Kimi K2: Open Agentic Intelligence (arXiv:2507.20534), Table 2, and the "
                     "released config.json: 61 layers, hidden 7168, 64 heads, MLA, 384 experts of 2048, top-8, "
                     "1 shared, first layer dense; 1.04T total, 32B activated"),
    ModelSpec("moe-3t", 77, 12288, 96, 8, 16384, 128256, 8192, n_experts=64, experts_per_token=2,
              published_params=3e12,
              source="hypothetical: the 3-trillion-parameter model of \"Engineering Trillion-Parameter Model "
                     "Instant Adaptation on Domestic AI Hardware\" as a 64-expert, top-2 MoE"),
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
