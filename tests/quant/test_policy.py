"""quantize_model's policies: which layers of TinyLM's table become what, the memory report against an
independent byte count from the config, the tied and untied output layer, the settings list, bad input."""
import math

import pytest
import torch
import torch.nn as nn

from labkit.quant import SETTINGS, QTensor, QuantLinear, quantize, quantize_model
from labkit.quant.linear import QuantEmbedding
from labkit.quant.policy import Setting
from labkit.quant.policy import resolve_policy
from labkit.tinylm import TinyLM, TinyLMConfig, linear_layers, param_counts, perplexity
from labkit.tinylm import corpus as data

from ..refusals import assert_refused


def small(tied: bool, seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(TinyLMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=128,
                               max_seq_len=32, tie_embeddings=tied))


@pytest.mark.parametrize("policy, error, message", [
    ({"ffn": "int4"}, ValueError,
     r"policy key must be one of \('embedding', 'attention', 'mlp', 'norm', 'head'\), got 'ffn'"),
    ({1: "int4"}, TypeError, "policy key must be one of"),
    ({"mlp": "int2"}, ValueError,
     r"policy\['mlp'\] must be one of \('fp32', 'fp16', 'bf16', 'int8', 'int4'\), got 'int2'"),
    ({"mlp": 4}, TypeError, r"policy\['mlp'\] must be one of"),
    ({"norm": "int8"}, ValueError,
     r"policy\['norm'\] must be one of \('fp32', 'fp16', 'bf16'\) \(norm weights stay floating point\)"),
    ("int4", TypeError, "policy must be a dict mapping layer type -> precision, got str"),
])
def test_policy_errors_name_the_problem(policy, error, message):
    model = small(True)
    with pytest.raises(error, match=message):
        quantize_model(model, policy)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"backend": "cuda"}, ValueError, r"backend must be one of \('auto', 'reference', 'int4pack'\), got 'cuda'"),
    ({"scheme": "nf4"}, ValueError, r"scheme must be one of \('asym', 'sym'\), got 'nf4'"),
    ({"group_size": 32.0}, TypeError, "group_size must be a positive int"),
    ({"group_size": 48}, ValueError, "group_size 48 must divide the input dimension 64"),
    ({"qtensors": [1]}, TypeError, r"qtensors must be a dict \{layer path: QTensor\} or None"),
    ({"qtensors": {"layers.0.attn.wq": None}}, ValueError, "qtensors key must be one of .*got 'layers.0.attn.wq'"),
    ({"qtensors": {"layers.0.mlp.w_up": None}}, TypeError,
     r"qtensors\['layers.0.mlp.w_up'\] must be a labkit.quant.QTensor"),
])
def test_setting_errors_name_the_problem_and_leave_the_model_alone(kwargs, error, message):
    model = small(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=message):
        quantize_model(model, {"mlp": "int4", "embedding": "int8"}, **kwargs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(model.layers[0].mlp.w_up, nn.Linear)


def test_only_tinylms_in_floating_point_are_quantized():
    with pytest.raises(TypeError, match=r"model must be a TinyLM .*got Linear"):
        quantize_model(nn.Linear(2, 2), {})
    qm, _ = quantize_model(small(True), {"mlp": "int4"})
    with pytest.raises(TypeError, match="model's layers.0.mlp.w_gate must be an nn.Linear or nn.Embedding, "
                                         "got QuantLinear"):
        quantize_model(qm, {"mlp": "int4"})


def expected_bytes(cfg: TinyLMConfig, precision: dict[str, str], group: int, scheme: str) -> int:
    """Bytes of every matrix and norm from the config alone: fp at 4 or 2 bytes per weight; integer codes
    at bits / 8 bytes plus a 2-byte scale (and a 2-byte zero point when asymmetric) per group."""
    per_weight = {"fp32": 4, "fp16": 2, "bf16": 2}
    total = 0
    for layer in linear_layers(cfg):
        if layer.layer_type == "head" and cfg.tie_embeddings:
            continue
        numel, prec = math.prod(layer.shape), precision[layer.layer_type]
        if prec in per_weight:
            total += per_weight[prec] * numel
        else:
            bits = 8 if prec == "int8" else 4
            total += numel * bits // 8 + numel // group * (2 if scheme == "sym" else 4)
    return total + per_weight[precision["norm"]] * param_counts(cfg)["norm"]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("policy, group, scheme", [
    ({"embedding": "int8", "attention": "fp16", "mlp": "int4"}, 32, "asym"),
    ({"embedding": "int4", "attention": "int4", "mlp": "int4", "norm": "bf16"}, 16, "sym"),
    ({"attention": "int8", "head": "bf16"}, 64, "asym"),
])
def test_report_counts_every_weight_once(tied, policy, group, scheme):
    model = small(tied)
    if tied and "head" in policy and policy["head"] != policy.get("embedding", "fp32"):
        with pytest.raises(ValueError, match=r"policy\['head'\] must be policy\['embedding'\]"):
            quantize_model(model, policy, group, scheme)
        return
    qm, report = quantize_model(model, policy, group, scheme)
    precision = {k: policy.get(k, "fp32") for k in ("embedding", "attention", "mlp", "norm")}
    precision["head"] = policy.get("head", precision["embedding"])
    assert report["bytes"] == expected_bytes(model.cfg, precision, group, scheme)
    assert sum(r["params"] for r in report["layers"]) == sum(p.numel() for p in model.parameters())
    assert report["fp32_bytes"] == 4 * param_counts(model.cfg)["total"]
    assert report["bits_per_weight"] == pytest.approx(8 * report["bytes"] / param_counts(model.cfg)["total"])
    by_type = {}
    for r in report["layers"]:
        by_type[r["type"]] = by_type.get(r["type"], 0) + r["params"]
    counts = param_counts(model.cfg)
    assert by_type.get("embedding", 0) + by_type.get("head", 0) == counts["embedding"]
    assert ((by_type["attention"], by_type["mlp"], by_type["norm"])
            == (counts["attention"], counts["mlp"], counts["norm"]))
    assert ("head" in by_type) == (not tied)
    tokens = torch.tensor([[1, 5, 9, 2]])
    assert qm(tokens).shape == (1, 4, 64) and torch.isfinite(qm(tokens)).all()


def test_an_untied_head_follows_the_embedding_unless_given():
    model = small(False)
    qm, _ = quantize_model(model, {"embedding": "int8"})
    assert isinstance(qm.tok_emb, QuantEmbedding) and isinstance(qm.lm_head, QuantLinear) and qm.lm_head.bits == 8
    assert not torch.equal(qm.lm_head.qweight.codes, qm.tok_emb.codes)  # two matrices of their own
    qm, report = quantize_model(model, {"embedding": "int8", "head": "fp32"})
    assert isinstance(qm.lm_head, nn.Linear) and torch.equal(qm.lm_head.weight, model.lm_head.weight)
    assert {r["name"]: r["type"] for r in report["layers"]}["lm_head"] == "head"
    assert resolve_policy({"embedding": "int4"})["head"] == "int4" and resolve_policy({})["head"] == "fp32"


def test_mixed_policy_modules_on_the_pretrained_model(pretrained):
    model, _ = pretrained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    qm, report = quantize_model(model, {"embedding": "int8", "attention": "fp16", "mlp": "int4"})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # input model untouched
    assert isinstance(qm.layers[0].mlp.w_up, QuantLinear) and qm.layers[0].mlp.w_up.bits == 4
    assert isinstance(qm.layers[0].attn.wq, nn.Linear)
    assert torch.equal(qm.layers[0].attn.wq.weight, model.layers[0].attn.wq.weight.half().float())
    assert qm.lm_head.scale is qm.tok_emb.scale  # tied: one quantized matrix
    assert torch.equal(qm.lm_head.qweight.codes, qm.tok_emb.codes)
    rows = {r["name"]: r for r in report["layers"]}
    assert rows["layers.0.mlp.w_up"]["bytes"] == 384 * 128 // 2 + 384 * 4 * 4
    assert rows["layers.0.attn.wk"]["bytes"] == 2 * 64 * 128
    assert rows["tok_emb"]["bytes"] == 256 * 128 + 256 * 4 * 4 and "lm_head" not in rows
    assert rows["layers.0.attn_norm"]["type"] == "norm" and rows["norm"]["bytes"] == 4 * 128
    assert report["fp32_bytes"] == 4 * 820_352
    tokens = torch.tensor([list(b"The old sailor")])
    assert torch.equal(qm.tok_emb(tokens), qm.tok_emb.qweight.dequantize()[tokens])
    assert qm(tokens).shape == (1, 14, model.cfg.vocab_size)


def test_fp32_policy_changes_nothing_and_int8_barely_moves_perplexity(pretrained):
    model, _ = pretrained
    tokens = torch.tensor([list(b"copy ab3 -> ab3\n12+30=42\n")])
    same, report = quantize_model(model, {})
    assert torch.equal(same(tokens), model(tokens)) and report["compression"] == 1.0
    text = data.corpus("test", 2048)
    p32 = perplexity(model, text)
    p8 = perplexity(quantize_model(model, {"embedding": "int8", "attention": "int8", "mlp": "int8"})[0], text)
    assert abs(p8 - p32) < 0.01 * p32


def test_given_qtensors_replace_round_to_nearest():
    model = small(True)
    w = model.layers[0].mlp.w_up.weight.detach()
    custom = QTensor(torch.zeros_like(w, dtype=torch.int8), torch.ones(128, 2), torch.zeros(128, 2, dtype=torch.int32),
                     4, 32, "asym", (128, 64))
    qm, _ = quantize_model(model, {"mlp": "int4"}, qtensors={"layers.0.mlp.w_up": custom})
    used = qm.layers[0].mlp.w_up.qweight
    assert torch.equal(used.codes, custom.codes) and used.scale is custom.scale
    assert torch.equal(qm.layers[0].mlp.w_gate.qweight.codes,
                       quantize(model.layers[0].mlp.w_gate.weight.detach()).codes)
    with pytest.raises(ValueError, match=r"qtensors\['layers.0.mlp.w_up'\] must be a 8-bit asym QTensor "
                                         r"of shape \(128, 64\)"):
        quantize_model(model, {"mlp": "int8"}, qtensors={"layers.0.mlp.w_up": custom})
    # a QTensor of another group size or scheme than the model's is a mistake, not silently mixed in
    for kwargs in ({"group_size": 64}, {"scheme": "sym"}):
        with pytest.raises(ValueError, match=r"must be a 4-bit \w+ QTensor of shape \(128, 64\) with group_size=\S+, "
                                             r"got 4 bits asym of shape \(128, 64\) with group_size=32"):
            quantize_model(model, {"mlp": "int4"}, qtensors={"layers.0.mlp.w_up": custom}, **kwargs)
    assert_refused(lambda: quantize_model(model, {"mlp": "int4"}, qtensors={"nope": custom}), ValueError,
                   "qtensors key", "nope", "one of ('layers.0.mlp.w_gate'")
    assert_refused(lambda: quantize_model(model, {"mlp": "fp16"}, qtensors={"layers.0.mlp.w_up": custom}), ValueError,
                   "qtensors", ["layers.0.mlp.w_up"], "empty or None: this policy quantizes no layer")


def test_settings_are_one_checked_list():
    names = [s.name for s in SETTINGS]
    assert len(set(names)) == len(names) and SETTINGS[0] == Setting("FP32", {})
    assert {"INT4 asym g32", "INT4 asym g64", "INT4 sym channel",
            "mixed: attn FP16, MLP INT4 g32, emb INT8"} <= set(names)
    mixed = SETTINGS[-1]
    assert dict(mixed.policy) == {"attention": "fp16", "mlp": "int4", "embedding": "int8"}
    with pytest.raises(TypeError):
        mixed.policy["mlp"] = "fp32"  # the list cannot drift at run time
    model = small(True)
    qm, report = SETTINGS[6].apply(model)
    assert report["bytes"] == quantize_model(model, SETTINGS[6].policy, 32, "asym")[1]["bytes"]
    with pytest.raises(ValueError, match=r"policy\['mlp'\] must be one of"):
        Setting("bad", {"mlp": "int3"})
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        Setting(None, {})
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        Setting("", {})
    with pytest.raises(TypeError, match="group_size"):
        Setting("x", {}, 32.5)
