"""TinyVLM, the model the course releases on day 0 (notebook 07): a ViT image encoder, a LLaVA-1.5 projector and
a TinyLM decoder with one operator the earlier labs' runtime lacks (QK-norm).

    image [3, 32, 32] -> 16 patches of 8x8x3 -> patch_embed + positions -> [LayerNorm -> attention (all patches
    see each other) -> + ; LayerNorm -> GELU MLP -> +] x num_layers -> LayerNorm      (vision_tower, ViT)
    -> linear_1 -> GELU -> linear_2                                                    (multi_modal_projector)
    -> one d_model vector per patch, written over the image placeholder tokens' embeddings
    tokens [image x 16, "c", "o", "l", ...] -> TinyLM blocks whose attention RMS-normalises each head's q and k
    before RoPE (Qwen3; Henry et al. 2020)     -> logits                     (language_model)

Which function computes QK-norm comes from an operator table (labkit.day0.operators): a runtime without the
operator refuses the model by name instead of running it wrongly.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_type, fail
from ..tinylm import Attention, TinyLM, linear_layers
from .config import TextConfig, TinyVLMConfig, VisionConfig
from .operators import OPERATORS, check_operators, require


def _act(name: str):
    return (lambda x: F.gelu(x, approximate="tanh")) if name == "gelu_tanh" else F.gelu


class QKNormAttention(Attention):
    """TinyLM's attention with QK-norm: q and k of every head are RMS-normalised over head_dim (one weight
    [head_dim] each, shared by the heads) by the operator table's "qk_norm" before the rotary positions."""

    def __init__(self, cfg: TextConfig, qk_norm):
        super().__init__(cfg)
        self.qk_norm_op, self.eps = qk_norm, cfg.norm_eps
        self.q_norm = nn.Module()
        self.q_norm.weight = nn.Parameter(torch.ones(cfg.head_dim))
        self.k_norm = nn.Module()
        self.k_norm.weight = nn.Parameter(torch.ones(cfg.head_dim))

    def qkv(self, x):
        q, k, v = super().qkv(x)
        return self.qk_norm_op(q, self.q_norm.weight, self.eps), self.qk_norm_op(k, self.k_norm.weight, self.eps), v


class LanguageModel(TinyLM):
    """The decoder: a TinyLM (same forward, same caches, same tensor-parallel split) whose attention applies
    QK-norm when cfg.qk_norm; forward(tokens, cache, embeds) as TinyLM's."""

    def __init__(self, cfg: TextConfig, operators: dict | None = None):
        check_type("cfg", cfg, TextConfig, "a labkit.day0.TextConfig")
        super().__init__(cfg)
        if cfg.qk_norm:
            op = require(OPERATORS if operators is None else operators, "qk_norm", "text_config.qk_norm", True)
            for block in self.layers:
                block.attn = QKNormAttention(cfg, op)
            self.apply(self._init)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x):
        n, p, d = x.shape
        q, k, v = self.qkv(x).view(n, p, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [n, h, p, hd]
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch (no mask)
        return self.proj(out.transpose(1, 2).reshape(n, p, d))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = _act(cfg.hidden_act)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = VisionAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """ViT: pixels [n, C, S, S] -> patch features [n, num_patches, hidden_size]."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.hidden_size)
        self.pos_emb = nn.Parameter(torch.randn(cfg.num_patches, cfg.hidden_size) * 0.02)
        self.layers = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        c, s, p = self.cfg.num_channels, self.cfg.image_size, self.cfg.patch_size
        n, g = pixels.shape[0], s // p
        # [n, P, C*p*p], row-major patches
        patches = pixels.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, c * p * p)
        x = self.patch_embed(patches) + self.pos_emb
        for block in self.layers:
            x = block(x)
        return self.norm(x)


class Projector(nn.Module):
    """LLaVA-1.5's projector (Liu et al. 2023, "Improved Baselines"): linear_1 -> GELU -> linear_2."""

    def __init__(self, cfg: TinyVLMConfig):
        super().__init__()
        self.linear_1 = nn.Linear(cfg.vision_config.hidden_size, cfg.text_config.d_model)
        self.linear_2 = nn.Linear(cfg.text_config.d_model, cfg.text_config.d_model)
        self.act = _act(cfg.projector_hidden_act)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class TinyVLM(nn.Module):
    """The released model. `operators`: the runtime's operator table (labkit.day0.operators); a table without
    an operator the config needs is refused (UnsupportedOperatorError names it)."""

    def __init__(self, cfg: TinyVLMConfig, operators: dict | None = None):
        super().__init__()
        check_type("cfg", cfg, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")
        ops = OPERATORS if operators is None else operators
        check_operators(cfg, ops)
        self.config = cfg
        self.language_model = LanguageModel(cfg.text_config, ops)
        self.vision_tower = VisionTower(cfg.vision_config)
        self.multi_modal_projector = Projector(cfg)

    def check_pixels(self, pixels) -> torch.Tensor:
        v = self.config.vision_config
        want = (v.num_channels, v.image_size, v.image_size)
        if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
            fail("pixels", type(pixels).__name__, f"a float tensor [n, {', '.join(map(str, want))}]", TypeError)
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != want:
            fail("pixels", f"shape {tuple(pixels.shape)}", f"[n, {', '.join(map(str, want))}] (labkit.day0.to_pixels)")
        return pixels

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image features in the decoder's space: pixels float [n, 3, S, S] in [0, 1] -> [n, tokens_per_image,
        d_model] (the vision tower, then the projector)."""
        pixels = self.check_pixels(pixels)
        return self.multi_modal_projector(self.vision_tower(pixels * 2 - 1))  # [0, 1] -> [-1, 1]

    def image_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Flattened positions (B*T) of the image placeholder tokens, in order."""
        return (tokens.reshape(-1) == self.config.image_token_id).nonzero().flatten()

    def forward(self, tokens: torch.Tensor, cache=None, pixels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T] holding tokens_per_image placeholders per image, the images
        in `pixels` [n, 3, S, S] in the order their placeholders appear (the single-process reference)."""
        rows = self.image_rows(tokens) if isinstance(tokens, torch.Tensor) else None
        if pixels is None:
            if rows is not None and rows.numel():
                fail("pixels", None, f"the {rows.numel() // self.config.tokens_per_image} image(s) whose "
                     f"placeholder tokens the prompt holds")
            return self.language_model(tokens, cache)
        feats = self.encode_images(pixels).reshape(-1, self.config.text_config.d_model)  # [n * tokens_per_image, d]
        if rows.numel() != feats.shape[0]:
            fail("pixels", f"{pixels.shape[0]} image(s)", f"{rows.numel() // self.config.tokens_per_image} "
                 f"(the prompt holds {rows.numel()} placeholder tokens, {self.config.tokens_per_image} per image)")
        return self.language_model(tokens, cache, embeds=(rows, feats))


def tp_plan(cfg: TinyVLMConfig) -> dict[str, str]:
    """How each stored tensor is split across tensor-parallel ranks: "column"/"row"/"vocab" (TinyLM's table,
    labkit.tinylm.linear_layers), "replicated" (norms, QK-norm weights: every rank holds all of it) or
    "encoder" (the vision tower and projector: they run beside the engine, not on the ranks)."""
    check_type("cfg", cfg, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")
    styles = {e.path + ".weight": e.tp_style for e in linear_layers(cfg.text_config)}
    with torch.device("meta"):
        names = list(TinyVLM(cfg).state_dict())
    plan = {}
    for name in names:
        local = name.removeprefix("language_model.")
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            plan[name] = "encoder"
        elif local == "lm_head.weight" and cfg.text_config.tie_embeddings:
            continue  # tied to tok_emb: not stored
        else:
            plan[name] = styles.get(local, "replicated")
    return plan
