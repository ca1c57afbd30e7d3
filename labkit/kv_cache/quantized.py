"""Quantized KV cache (notebook 05, section 6): INT8 and INT4 (labkit.quant's asymmetric quantizer) per token
or per channel, and FP8 (torch.float8_e4m3fn, largest value 448; torch.float8_e5m2, largest 57344).

    per token     one scale and zero point per token and head, over its head_dim elements
    per channel   one scale and zero point per channel (an element of head_dim) and head, over groups of
                  `group` consecutive tokens; the last len % group tokens stay in full precision until their
                  group fills (KIVI's residual, Liu et al., ICML 2024)
    fp8           a plain cast, no scale (what a kv_cache_dtype="fp8" with scale 1.0 does)

KIVI found that keys quantize better per channel (a few channels carry large values across all tokens) and
values per token; `kivi_table` measures both on TinyLM's own keys and values. QuantizedKVCache *simulates*
storage: it keeps the exact keys and values and returns them after a quantize-dequantize round trip (the
same numbers a store of codes would give back, since each token's or group's codes depend only on its own
values); `bits_per_element` gives the memory a real store would take, scales and zero points (FP16) included.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .._checks import check_choice, check_positive_int, check_type, fail
from ..quant import quant_error, quantize
from ..tinylm import KVCache, TinyLMConfig

FORMATS = ("int8", "int4", "int2", "fp8-e4m3", "fp8-e5m2")
AXES = ("token", "channel")
FP8 = {"fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}


def _bits(fmt: str) -> int:
    return int(fmt.removeprefix("int"))


def fake_quantize(x: torch.Tensor, fmt: str, axis: str = "token", group: int = 32) -> torch.Tensor:
    """x [..., T, head_dim] after a quantize-dequantize round trip (see the module docstring), in x's dtype."""
    check_type("x", x, torch.Tensor)
    check_choice("fmt", fmt, FORMATS)
    check_choice("axis", axis, AXES)
    check_positive_int("group", group)
    if fmt in FP8:
        return x.to(FP8[fmt]).to(x.dtype)
    T, D = x.shape[-2:]
    if axis == "token":
        rows = x.reshape(-1, D).float()                                      # [... * T, D]
        return quantize(rows, _bits(fmt), "asym", "channel").dequantize().reshape(x.shape).to(x.dtype)
    full = T // group * group
    out = x.clone()
    if full:
        cols = x[..., :full, :].transpose(-1, -2).reshape(-1, full).float()  # [... * D, full tokens]
        back = quantize(cols, _bits(fmt), "asym", group).dequantize()
        out[..., :full, :] = back.reshape(*x.shape[:-2], D, full).transpose(-1, -2).to(x.dtype)
    return out


def bits_per_element(fmt: str, axis: str = "token", group: int = 32, head_dim: int = 32) -> float:
    """Storage bits per cached element: the codes plus an FP16 scale and zero point per group (head_dim elements
    per token, `group` tokens per channel); the residual of per-channel groups is not counted."""
    check_choice("fmt", fmt, FORMATS)
    check_choice("axis", axis, AXES)
    if fmt in FP8:
        return 8.0
    per_group = check_positive_int("head_dim", head_dim) if axis == "token" else check_positive_int("group", group)
    return _bits(fmt) + 32 / per_group


class QuantizedKVCache(KVCache):
    """A contiguous KVCache whose `update` returns every key and value after fake_quantize (keys and values each
    with their own axis), simulating a quantized store (module docstring)."""

    def __init__(self, cfg: TinyLMConfig, fmt: str, key_axis: str = "token", value_axis: str = "token",
                 group: int = 32, batch_size: int = 1, max_len: int | None = None):
        super().__init__(cfg, batch_size, max_len)
        self.fmt, self.group = check_choice("fmt", fmt, FORMATS), check_positive_int("group", group)
        self.key_axis, self.value_axis = check_choice("key_axis", key_axis, AXES), check_choice("value_axis",
                                                                                                value_axis, AXES)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k_all, v_all = super().update(layer, k, v)
        return (fake_quantize(k_all, self.fmt, self.key_axis, self.group),
                fake_quantize(v_all, self.fmt, self.value_axis, self.group))


class KVQuantModel(nn.Module):
    """`model` whose every forward runs through a fresh QuantizedKVCache, so that labkit.tinylm.perplexity and
    task_correct measure what a quantized KV cache does to it (the weights stay exact)."""

    def __init__(self, model: nn.Module, fmt: str, key_axis: str = "token", value_axis: str = "token",
                 group: int = 32):
        super().__init__()
        self.model, self.cfg = model, model.cfg
        self.settings = dict(fmt=check_choice("fmt", fmt, FORMATS), key_axis=check_choice("key_axis", key_axis, AXES),
                             value_axis=check_choice("value_axis", value_axis, AXES), group=group)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cache = QuantizedKVCache(self.cfg, batch_size=tokens.shape[0], max_len=tokens.shape[1], **self.settings)
        return self.model(tokens, cache)


@torch.no_grad()
def collect_kv(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TinyLM's own keys and values for `tokens` [B, T]: each [n_layers, B, n_kv_heads, T, head_dim] (after RoPE)."""
    cache = KVCache(model.cfg, tokens.shape[0], tokens.shape[1])
    model(tokens, cache)
    return cache.k.clone(), cache.v.clone()


def kivi_table(k: torch.Tensor, v: torch.Tensor, formats=("int4", "int2"), group: int = 32) -> list[dict]:
    """SQNR (dB, higher is better) of keys and values `k`, `v` [..., T, head_dim] quantized per token and per
    channel, one row per format; only whole groups of tokens are compared (the residual is exact)."""
    check_type("k", k, torch.Tensor)
    check_type("v", v, torch.Tensor)
    check_positive_int("group", group, "tokens")
    if k.dim() < 2 or k.shape != v.shape:
        fail("v", tuple(v.shape), f"a tensor of k's shape {tuple(k.shape)} [..., T, head_dim]")
    if k.shape[-2] < group:
        fail("k", f"{k.shape[-2]} tokens", f"at least one whole group of {group} tokens [..., T, head_dim]")
    T = k.shape[-2] // group * group
    k, v = k[..., :T, :], v[..., :T, :]
    rows = []
    for fmt in formats:
        row = {"format": fmt}
        for name, x in (("keys", k), ("values", v)):
            for axis in AXES:
                err = quant_error(x.reshape(-1, x.shape[-1]),
                                  fake_quantize(x, fmt, axis, group).reshape(-1, x.shape[-1]))
                row[f"{name} per {axis}"] = err["sqnr_db"]
        rows.append(row)
    return rows


@torch.no_grad()
def attention_output_error(model: nn.Module, tokens: torch.Tensor, **settings) -> list[float]:
    """Per layer: relative error ||out_q - out|| / ||out|| of the attention block's output with a quantized KV
    cache (`settings` as KVQuantModel's) against the exact one, on `tokens` [B, T]. Layer 0 sees exact inputs;
    later layers also inherit the error of the layers before them."""
    outs: dict[int, list[torch.Tensor]] = {}
    hooks = [layer.attn.register_forward_hook(lambda mod, args, out, i=i: outs.setdefault(i, []).append(out))
             for i, layer in enumerate(model.layers)]
    try:
        model(tokens)
        KVQuantModel(model, **settings)(tokens)
    finally:
        for h in hooks:
            h.remove()
    return [float((q - e).norm() / e.norm()) for e, q in (outs[i] for i in range(len(model.layers)))]


KV_SETTINGS = {  # notebook 05's quality sweep: name -> KVQuantModel settings
    "int8 per token": dict(fmt="int8"),
    "fp8-e4m3": dict(fmt="fp8-e4m3"),
    "int4 per token": dict(fmt="int4"),
    "int4 KIVI (K channel, V token)": dict(fmt="int4", key_axis="channel"),
    "int2 per token": dict(fmt="int2"),
    "int2 KIVI (K channel, V token)": dict(fmt="int2", key_axis="channel"),
}


def quality_sweep(model: nn.Module, tasks: list, text, settings: dict | None = None, head_dim: int | None = None,
                  progress: bool = False) -> list[dict]:
    """Per setting: bits per cached element, KV memory against FP16, perplexity on `text` and the tasks kept,
    as a paired retention interval against the exact cache (labkit.quant.retention). One row per setting, the
    exact cache first; "retention" holds the labkit.quant Retention (None for the exact row): print the rows
    with quality_table, compare two settings with retention_words."""
    from tqdm.auto import tqdm

    from ..quant import retention
    from ..tinylm import perplexity, task_correct

    settings = KV_SETTINGS if settings is None else settings
    head_dim = model.cfg.head_dim if head_dim is None else head_dim
    base_ok = task_correct(model, tasks)
    rows = [{"setting": "exact (FP32)", "bits": 32.0, "vs FP16": 2.0, "ppl": perplexity(model, text),
             "tasks": f"{sum(base_ok)}/{len(tasks)}", "retained (95%)": "-", "retention": None}]
    for name, s in tqdm(settings.items(), desc="KV settings", disable=not progress):
        qmodel = KVQuantModel(model, **s)
        ok = task_correct(qmodel, tasks)
        r = retention(ok, base_ok)
        bits = bits_per_element(s["fmt"], s.get("key_axis", "token"), s.get("group", 32), head_dim)
        if s.get("value_axis", "token") != s.get("key_axis", "token"):
            bits = (bits + bits_per_element(s["fmt"], s.get("value_axis", "token"), s.get("group", 32), head_dim)) / 2
        rows.append({"setting": name, "bits": bits, "vs FP16": bits / 16, "ppl": perplexity(qmodel, text),
                     "tasks": f"{sum(ok)}/{len(tasks)}",
                     "retained (95%)": f"{r.retained:.1%} ({r.low:.1%} to {r.high:.1%})", "retention": r})
    return rows


def quality_table(rows: list[dict]) -> str:
    """quality_sweep's rows as a text table (without the Retention objects)."""
    from ..course import display

    return display.table([{k: v for k, v in r.items() if k != "retention"} for r in rows])


def retention_words(rows: list[dict], a: str, b: str) -> str:
    """Settings `a` and `b` of quality_sweep's rows compared by their paired 95% intervals: which retains more
    only when the intervals do not overlap, else that the tasks do not separate them."""
    by_name = {r["setting"]: r.get("retention") for r in rows}
    for name in (a, b):
        if by_name.get(name) is None:
            fail("a" if name == a else "b", name,
                 f"one of the quantized settings {[n for n, r in by_name.items() if r]}")
    ra, rb = by_name[a], by_name[b]
    if ra.low > rb.high:
        return f"{a} retains more than {b} (the 95% intervals do not overlap)"
    if rb.low > ra.high:
        return f"{b} retains more than {a} (the 95% intervals do not overlap)"
    return f"{a} and {b}: the 95% intervals overlap, so these tasks show no difference in retention"
