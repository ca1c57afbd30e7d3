"""Whole-model precision policies (notebook 03, section 6; benchmarks/quant_quality.py).

A policy maps a layer type to a precision; the layers come from TinyLM's one table of linear layers
(labkit.tinylm.iter_linears), the norm weights from labkit.tinylm.layer_type:

    policy key   layers                                       precisions
    embedding    tok_emb (and a tied lm_head: one matrix)      fp32 fp16 bf16 int8 int4
    attention    layers.i.attn.wq / wk / wv / wo               fp32 fp16 bf16 int8 int4
    mlp          layers.i.mlp.w_gate / w_up / w_down           fp32 fp16 bf16 int8 int4
    head         an untied lm_head (default: as embedding)     fp32 fp16 bf16 int8 int4
    norm         the RMSNorm weights                           fp32 fp16 bf16

Missing types stay fp32. SETTINGS is the one list of named settings (policy, group size, scheme) that
notebook 03 sweeps and benchmarks/quant_quality.py measures (labkit.quant.quality runs the sweep).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import torch
import torch.nn as nn

from .._checks import check_type, fail
from ..tinylm import iter_linears, layer_type, linear_layers
from .linear import BACKENDS, QuantEmbedding, QuantLinear
from .qtensor import QTensor, check_group_size, check_scheme, check_word, quantize, quantized_bytes

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")
POLICY_KEYS = ("embedding", "attention", "mlp", "norm", "head")
_BITS = {"int8": 8, "int4": 4}
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_policy(policy: Mapping[str, str]) -> dict[str, str]:
    """The precision of every policy key: missing keys are "fp32", except "head", which follows
    "embedding" unless given. Refuses unknown keys and precisions, and integer norms."""
    check_type("policy", policy, Mapping, "a dict mapping layer type -> precision")
    for kind, prec in policy.items():
        check_word("policy key", kind, POLICY_KEYS)
        check_word(f"policy[{kind!r}]", prec, PRECISIONS)
    if policy.get("norm", "fp32") not in FLOAT_PRECISIONS:
        fail("policy['norm']", policy["norm"], f"one of {FLOAT_PRECISIONS} (norm weights stay floating point)")
    out = {k: policy.get(k, "fp32") for k in POLICY_KEYS}
    out["head"] = policy.get("head", out["embedding"])
    return out


def _check_qtensors(qtensors, model, precision: dict[str, str], group_size, scheme: str) -> dict[str, QTensor]:
    """qtensors: None or {layer path: QTensor} for layers this policy quantizes to integers, each with the
    bits of its layer's precision and the model's group size and scheme (a mismatch is a mistake, not a
    setting: the report and the sweep name one group size and one scheme)."""
    if qtensors is None:
        return {}
    check_type("qtensors", qtensors, Mapping, "a dict {layer path: QTensor} or None")
    shapes = {e.path: (e.shape, _BITS[precision[e.layer_type]]) for e, _ in iter_linears(model)
              if precision[e.layer_type] in _BITS}
    if qtensors and not shapes:
        fail("qtensors", sorted(qtensors), "empty or None: this policy quantizes no layer to int8 or int4")
    for path, q in qtensors.items():
        check_word("qtensors key", path, tuple(shapes))
        check_type(f"qtensors[{path!r}]", q, QTensor, "a labkit.quant.QTensor")
        shape, bits = shapes[path]
        if q.shape != shape or q.bits != bits or q.group_size != group_size or q.scheme != scheme:
            raise ValueError(f"qtensors[{path!r}] must be a {bits}-bit {scheme} QTensor of shape {shape} with "
                             f"group_size={group_size!r}, got {q.bits} bits {q.scheme} of shape {q.shape} with "
                             f"group_size={q.group_size!r}")
    return dict(qtensors)


def _row(name: str, kind: str, prec: str, numel: int, q: QTensor | None = None) -> dict:
    """One line of the memory report: fp weights at 2 or 4 bytes, integer ones with fp16 scales and zeros."""
    if q is None:
        nbytes = (4 if prec == "fp32" else 2) * numel
    else:
        nbytes = quantized_bytes(numel, q.bits, q.group_len, q.scheme)
    return {"name": name, "type": kind, "precision": prec, "params": numel, "bytes": nbytes}


def quantize_model(model: nn.Module, policy: Mapping[str, str], group_size: int | str = 32, scheme: str = "asym",
                   backend: str = "reference", qtensors: Mapping[str, QTensor] | None = None) -> tuple[nn.Module, dict]:
    """A quantized copy of a TinyLM (the input model is left as it is) and a memory report.

    policy: see the module docstring. int8/int4 layers become QuantLinear (QuantEmbedding for the
    embedding; a tied lm_head shares the embedding's quantized matrix) with `group_size` and `scheme`;
    fp16/bf16 weights are rounded to that format (kept as the FP32 values of the rounded weights for CPU
    compute; counted at 2 bytes). backend: the INT4 layers' QuantLinear backend (INT8 ones use "reference").
    qtensors: optional {layer path: QTensor} from labkit.quant.gptq.gptq, used instead of round-to-nearest
    for those layers. report: {"layers": [{name, type, precision, params, bytes}], "bytes", "fp32_bytes",
    "compression", "bits_per_weight"}; bytes count scales and zero points at 2 bytes (fp16) each.
    """
    for entry, module in iter_linears(model):  # TypeError unless model is a TinyLM
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise TypeError(f"model's {entry.path} must be an nn.Linear or nn.Embedding, got "
                            f"{type(module).__name__}: quantize the floating-point model")
    precision = resolve_policy(policy)
    tied = model.cfg.tie_embeddings
    if tied and "head" in policy and precision["head"] != precision["embedding"]:
        fail("policy['head']", policy["head"], f"policy['embedding'] ({precision['embedding']!r}): this model's "
             "lm_head is tied to the embedding")
    group_size, scheme = check_group_size(group_size), check_scheme(scheme)
    check_word("backend", backend, BACKENDS)
    qtensors = _check_qtensors(qtensors, model, precision, group_size, scheme)
    norms = [name for name, _ in model.named_parameters() if layer_type(name) == "norm"]
    model = copy.deepcopy(model)
    rows = []
    for entry, module in list(iter_linears(model)):
        prec, w = precision[entry.layer_type], module.weight
        if prec in FLOAT_PRECISIONS:
            if prec != "fp32":
                w.data = w.data.to(_DTYPES[prec]).float()  # a tied lm_head shares this Parameter
            rows.append(_row(entry.path, entry.layer_type, prec, w.numel()))
            continue
        q = qtensors.get(entry.path)
        if q is None:
            q = quantize(w.detach().float(), _BITS[prec], scheme, group_size)
        layer_backend = backend if prec == "int4" else "reference"
        if entry.layer_type == "embedding":
            model.set_submodule(entry.path, QuantEmbedding(q))
            if tied:  # the tied lm_head is the same matrix: it shares the quantized codes and scales
                head = next(e for e in linear_layers(model.cfg) if e.layer_type == "head")
                model.set_submodule(head.path, QuantLinear(q, backend=layer_backend))
        else:
            model.set_submodule(entry.path, QuantLinear(q, module.bias, backend=layer_backend))
        rows.append(_row(entry.path, entry.layer_type, prec, w.numel(), q))
    for name in norms:
        p = model.get_parameter(name)
        if precision["norm"] != "fp32":
            p.data = p.data.to(_DTYPES[precision["norm"]]).float()
        rows.append(_row(name.removesuffix(".weight"), "norm", precision["norm"], p.numel()))
    total = sum(r["bytes"] for r in rows)
    params = sum(r["params"] for r in rows)
    report = {"layers": rows, "bytes": total, "fp32_bytes": 4 * params, "compression": 4 * params / total,
              "bits_per_weight": 8 * total / params}
    return model, report


@dataclass(frozen=True)
class Setting:
    """A named precision setting: a policy, a group size and a scheme (checked when built)."""
    name: str
    policy: Mapping[str, str]
    group_size: int | str = 32
    scheme: str = "asym"

    def __post_init__(self):
        if not check_type("name", self.name, str, "a non-empty str"):
            fail("name", self.name, "a non-empty str")
        resolve_policy(self.policy)
        object.__setattr__(self, "policy", MappingProxyType(dict(self.policy)))
        object.__setattr__(self, "group_size", check_group_size(self.group_size))
        check_scheme(self.scheme)

    def apply(self, model: nn.Module, backend: str = "reference") -> tuple[nn.Module, dict]:
        """quantize_model(model, policy, group_size, scheme, backend)."""
        return quantize_model(model, self.policy, self.group_size, self.scheme, backend)


def _every(precision: str) -> dict[str, str]:
    return {k: precision for k in ("embedding", "attention", "mlp")}


# The settings notebook 03 sweeps and benchmarks/quant_quality.py measures; the first one is the baseline.
SETTINGS = (
    Setting("FP32", {}),
    Setting("BF16", _every("bf16")),
    Setting("INT8 asym g32", _every("int8")),
    Setting("INT8 sym channel", _every("int8"), "channel", "sym"),
    Setting("INT4 sym g32", _every("int4"), 32, "sym"),
    Setting("INT4 sym channel", _every("int4"), "channel", "sym"),
    Setting("INT4 asym g32", _every("int4")),
    Setting("INT4 asym g64", _every("int4"), 64),
    Setting("INT4 asym g128", _every("int4"), 128),
    Setting("INT4 asym channel", _every("int4"), "channel"),
    Setting("INT4 asym g32, emb INT8", {**_every("int4"), "embedding": "int8"}),
    Setting("mixed: attn FP16, MLP INT4 g32, emb INT8", {"attention": "fp16", "mlp": "int4", "embedding": "int8"}),
)
