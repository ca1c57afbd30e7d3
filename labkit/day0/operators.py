"""Operator support (notebook 07, section 2): which operators a model needs, which ones the runtime has, and a
clear refusal when one is missing.

A runtime (vLLM, llama.cpp, the course's labkit) supports a fixed set of operators; a model released today may
need one it does not have yet. Running it anyway with a look-alike (plain attention where QK-norm was meant)
gives fluent nonsense, so the runtime refuses the model and names the operator and the config field that asks
for it. Adding support = writing the operator and checking it against a reference before it is registered.

    BASELINE_OPERATORS   what labs 00-06's runtime runs (TinyLM and its serving engine)
    OPERATORS            the baseline + "qk_norm", added for TinyVLM in lab 07
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .._checks import check_type, fail


class UnsupportedOperatorError(NotImplementedError):
    """A model needs an operator the runtime's table lacks; the message names it and the config field."""


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """QK-norm: each head's vector x[..., :] (queries or keys [B, H, T, head_dim]) divided by its root mean
    square over head_dim, times `weight` [head_dim] (Henry et al. 2020; Qwen3's q_norm / k_norm):
    x / sqrt(mean(x^2) + eps) * weight, computed in FP32 and returned in x's dtype (as Hugging Face's Qwen3
    RMSNorm does, so BF16 weights lose nothing in the mean of squares)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _not_called(*_):  # stand-in for operators the runtime implements inline (TinyLM's own modules)
    raise RuntimeError("this operator is implemented by labkit's modules; the table records that it exists")


BASELINE_OPERATORS: dict[str, Callable] = {
    "embedding": F.embedding, "linear": F.linear, "rms_norm": F.rms_norm, "rope": _not_called,
    "causal_gqa_attention": F.scaled_dot_product_attention, "swiglu": _not_called,
    "layer_norm": F.layer_norm, "gelu": F.gelu, "attention": F.scaled_dot_product_attention,
}
"""What the runtime of labs 00-06 can run: TinyLM's operators, plus the stock torch ones a ViT needs."""

OPERATORS: dict[str, Callable] = {**BASELINE_OPERATORS, "qk_norm": qk_norm}
"""The runtime after lab 07: the baseline and QK-norm."""


def required_operators(cfg) -> dict[str, str]:
    """Operator -> the part of the config that needs it, for a TinyVLMConfig."""
    from .config import TinyVLMConfig  # the config module imports nothing from here; keep the table free of it
    check_type("cfg", cfg, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")
    need = {"embedding": "text_config.vocab_size", "linear": "every layer", "rms_norm": "text_config.norm_eps",
            "rope": "text_config.rope_theta", "causal_gqa_attention": "text_config.n_kv_heads",
            "swiglu": "text_config.d_ff", "layer_norm": "vision_config.layer_norm_eps",
            "attention": "vision_config.num_heads", "gelu": "vision_config.hidden_act / projector_hidden_act"}
    if cfg.text_config.qk_norm:
        need["qk_norm"] = "text_config.qk_norm"
    return need


def check_operators(cfg, operators: dict) -> None:
    """Raise UnsupportedOperatorError for the first operator `cfg` needs that `operators` lacks."""
    if not isinstance(operators, dict) or not all(callable(f) for f in operators.values()):
        fail("operators", type(operators).__name__, "a dict of operator name -> function", TypeError)
    for op, field in required_operators(cfg).items():
        require(operators, op, field, _value(cfg, field))


def require(operators: dict, op: str, field: str, value) -> Callable:
    """operators[op], or an UnsupportedOperatorError naming the operator and the config field (= value) that
    needs it. Every module that looks an operator up goes through here (the decoder built alone included)."""
    if not isinstance(operators, dict) or op not in operators:
        raise UnsupportedOperatorError(
            f"this runtime has no operator {op!r}, which the model needs ({field} = {value}); write it, check "
            f"it against a reference, then register it: labkit.day0.register_operator({op!r}, fn, operators) "
            "(notebook 07, section 2)")
    return operators[op]


def _value(cfg, field: str):
    obj = cfg
    for part in field.split(" ")[0].split("."):
        obj = getattr(obj, part, "?")
    return obj


def register_operator(name: str, fn: Callable, operators: dict) -> dict:
    """A copy of `operators` with `fn` as `name` (the table given is not changed)."""
    check_type("name", name, str, "an operator name")
    if not callable(fn):
        fail("fn", fn, "a function", TypeError)
    check_type("operators", operators, dict, "a dict of operator name -> function")
    return {**operators, name: fn}
