"""TinyVLM's configuration: the `config.json` of the release, Hugging Face style (notebook 07, section 1).

    config.json
    {"architectures": ["TinyVLMForConditionalGeneration"], "model_type": "tinyvlm", "torch_dtype": "float32",
     "image_token_id": 256, "projector_hidden_act": "gelu", "max_images_per_prompt": 4,
     "text_config":   {TinyLM's fields + "qk_norm": true, "vocab_size": 264},
     "vision_config": {"image_size": 32, "patch_size": 8, "num_channels": 3, "hidden_size": 64, ...}}

The text config is TinyLM's with one new field (qk_norm) and a vocabulary of 264 = 256 bytes + 8 special ids
(id 256 is the image placeholder), padded to a multiple of 8 so that tensor-parallel degrees 2, 4 and 8 split it
(Megatron-LM pads its vocabulary the same way, `make_vocab_size_divisible_by`). Each image becomes
(image_size / patch_size)^2 placeholder tokens, one per patch, whose embeddings are replaced by the projected
patch features (LLaVA, Liu et al. 2023).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .._checks import check_bool, check_choice, check_int, check_positive, check_positive_int, check_type, fail
from ..tinylm import TinyLMConfig

ARCHITECTURE = "TinyVLMForConditionalGeneration"
MODEL_TYPE = "tinyvlm"
ACTIVATIONS = ("gelu", "gelu_tanh")
DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """A config.json that cannot describe a TinyVLM: names the field."""


@dataclass(frozen=True)
class TextConfig(TinyLMConfig):
    """TinyLM's fields, a 264-id vocabulary and QK-norm (RMSNorm over each head's queries and keys before the
    rotary positions, one weight [head_dim] shared by the heads, as in Qwen3: the operator labs 00-06 did not
    have)."""
    vocab_size: int = 264
    qk_norm: bool = True
    """normalise each head's q and k (weight [head_dim]) before RoPE"""

    def __post_init__(self):
        super().__post_init__()
        check_bool("qk_norm", self.qk_norm)


@dataclass(frozen=True)
class VisionConfig:
    """The ViT (Dosovitskiy et al. 2021) image encoder: square RGB images cut into square patches."""
    image_size: int = 32
    """pixels per side; images are resized to this"""
    patch_size: int = 8
    """pixels per patch side; one image token per patch"""
    num_channels: int = 3
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size"):
            check_positive_int(name, getattr(self, name))
        if self.image_size % self.patch_size:
            fail("patch_size", self.patch_size, f"a divisor of image_size={self.image_size}")
        if self.hidden_size % self.num_heads:
            fail("num_heads", self.num_heads, f"a divisor of hidden_size={self.hidden_size}")
        check_choice("hidden_act", self.hidden_act, ACTIVATIONS)
        check_positive("layer_norm_eps", self.layer_norm_eps)

    @property
    def num_patches(self) -> int:
        """Patches per image = image tokens per image."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        """Values per patch: channels x patch_size^2."""
        return self.num_channels * self.patch_size ** 2


@dataclass(frozen=True)
class TinyVLMConfig:
    """The whole release's config: the decoder, the encoder and how images enter the prompt."""
    text_config: TextConfig = TextConfig()
    vision_config: VisionConfig = VisionConfig()
    image_token_id: int = 256
    """the placeholder id; one per image patch in the prompt (above 255: no text can produce it)"""
    projector_hidden_act: str = "gelu"
    max_images_per_prompt: int = 4

    def __post_init__(self):
        check_type("text_config", self.text_config, TextConfig, "a TextConfig")
        check_type("vision_config", self.vision_config, VisionConfig, "a VisionConfig")
        check_int("image_token_id", self.image_token_id, 256, self.text_config.vocab_size - 1)
        check_choice("projector_hidden_act", self.projector_hidden_act, ACTIVATIONS)
        check_positive_int("max_images_per_prompt", self.max_images_per_prompt)
        worst = self.max_images_per_prompt * self.tokens_per_image
        if worst >= self.text_config.max_seq_len:
            fail("max_images_per_prompt", self.max_images_per_prompt,
                 f"small enough that its {worst} image tokens leave room in the {self.text_config.max_seq_len}-"
                 "token context")

    @property
    def tokens_per_image(self) -> int:
        return self.vision_config.num_patches

    def to_dict(self) -> dict:
        """config.json's contents (see the module docstring)."""
        return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "torch_dtype": "float32",
                "image_token_id": self.image_token_id, "projector_hidden_act": self.projector_hidden_act,
                "max_images_per_prompt": self.max_images_per_prompt,
                "text_config": asdict(self.text_config), "vision_config": asdict(self.vision_config)}

    @classmethod
    def from_dict(cls, d: dict) -> "TinyVLMConfig":
        """Parse config.json's contents; a ConfigError names the missing, unknown or bad field."""
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
        top = {"architectures", "model_type", "torch_dtype", "text_config", "vision_config"} | \
              {f.name for f in fields(cls)}
        _no_unknown("", d, top)
        if d.get("model_type") != MODEL_TYPE:
            raise ConfigError(f"model_type must be {MODEL_TYPE!r}, got {d.get('model_type')!r}")
        parts = {}
        for name, kind in (("text_config", TextConfig), ("vision_config", VisionConfig)):
            sub = d.get(name)
            if not isinstance(sub, dict):
                raise ConfigError(f"{name} must be a JSON object of {kind.__name__} fields, got {sub!r}")
            _no_unknown(name + ".", sub, {f.name for f in fields(kind)})
            parts[name] = _build(name, kind, sub)
        for name in ("architectures", "torch_dtype", "image_token_id", "projector_hidden_act", "max_images_per_prompt"):
            if name not in d:
                raise ConfigError(f"config field {name} is missing")
        if d["architectures"] != [ARCHITECTURE]:
            raise ConfigError(f"architectures must be [{ARCHITECTURE!r}], got {d['architectures']!r}")
        if d["torch_dtype"] not in DTYPES:
            raise ConfigError(f"torch_dtype must be one of {DTYPES}, got {d['torch_dtype']!r}")
        rest = {k: d[k] for k in ("image_token_id", "projector_hidden_act", "max_images_per_prompt")}
        return _build("config", cls, {**rest, **parts})


def _no_unknown(prefix: str, d: dict, known: set[str]) -> None:
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"unknown config field {prefix}{unknown[0]}; expected some of {sorted(known)}")


def _build(name: str, kind, values: dict):
    missing = [f.name for f in fields(kind) if f.name not in values]
    if missing:
        raise ConfigError(f"config field {name}.{missing[0]} is missing")
    try:
        return kind(**values)
    except (TypeError, ValueError) as e:  # the dataclass's own check names the field inside `name`
        raise ConfigError(f"config field {name}: {e}" if name != "config" else f"config field {e}") from None


def small_config(**text) -> TinyVLMConfig:
    """A small, fast TinyVLM config for tests (2 layers of width 32; 32x32 images in 16x16 patches: 4 tokens each)."""
    t = dict(vocab_size=264, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64) | text
    return TinyVLMConfig(TextConfig(**t), VisionConfig(image_size=32, patch_size=16, hidden_size=16, num_layers=1,
                                                       num_heads=2, intermediate_size=32), max_images_per_prompt=2)
