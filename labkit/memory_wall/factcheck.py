"""Notebook 01's fact-check: one function per claim of the course's source material, each returning the
claim (quoted), the arithmetic behind the verdict line by line, the verdict and the conditions under which
the claim holds, every sentence built from the numbers it rests on.

The source material is two technical articles: one on deploying large models locally on unified-memory
hardware, one on adapting a trillion-parameter open model on the day of its release. The words in
quotation marks are theirs; the words around them give the setting the article states.

    check = gpt3_memory()      # a FactCheck
    check.show()               # prints CLAIM / arithmetic / VERDICT / HOLDS IF (labkit.course.verdict)
    check.numbers              # the figures behind it, for asserts and for further work

Units: bytes (GB = 1e9, TB = 1e12, TiB = 2**40), bytes/s, tokens/s, US dollars, days.
"""

from __future__ import annotations

import math

from .cost import breakeven_days
from .footprint import PRECISIONS, decode_bytes_per_step, decode_tokens_per_s, footprint
from .offload import stream_shares
from .roofline import decode_ceiling, weight_bytes
from ..course import FactCheck
from ..specs import device, model

GB, TB = 1e9, 1e12
Q4_0, Q4_1, G128 = "int4-g32 sym (Q4_0)", "int4-g32 asym (Q4_1)", "int4-g128 asym"
BAND = (0.3, 0.5)  # the "30-50%" of the transfer claim
SECTION5_OFFLOADED = tuple(range(0, 41, 2))  # notebook 01, section 5: layers offloaded of Llama-2-70B's 80


def gpt3_memory() -> FactCheck:
    """"GPT-3 (175B) needs 128 GB VRAM + 256 GB system memory": FP16 and Q4_0 footprints, 2,048 tokens."""
    g3 = model("gpt3-175b")
    f16, f4 = footprint(g3, "fp16", 1, 2048), footprint(g3, Q4_0, 1, 2048)
    gpu, budget = 128 * GB, (128 + 256) * GB
    stream_s = (f16["total"] - gpu) / device("pcie4-x16").bandwidth
    fits, q4_alone = f16["total"] <= budget, f4["total"] <= gpu
    arithmetic = [
        f"FP16 weights {f16['weights'] / GB:.0f} GB + KV cache for 2,048 tokens {f16['kv_cache'] / GB:.1f} GB "
        f"+ activations {f16['activations'] / GB:.1f} GB = {f16['total'] / GB:.0f} GB "
        f"{'<=' if fits else '>'} 128 + 256 = 384 GB",
        f"Q4_0 weights {f4['weights'] / GB:.0f} GB ({f4['total'] / GB:.0f} GB with KV cache and activations): "
        + ("fits in 128 GB of GPU memory alone" if q4_alone else "more than 128 GB of GPU memory"),
        f"streaming the {f16['total'] / GB - 128:.0f} GB that do not fit over PCIe 4.0 x16: {stream_s:.1f} s per token"]
    if not fits:
        judgement = f"False: FP16 needs {f16['total'] / GB:.0f} GB, more than the 384 GB named."
    else:
        judgement = (f"Plausible as one configuration, not a requirement: it is FP16 with offloading, and slow "
                     f"({stream_s:.1f} s per token)"
                     + ("; at 4 bits 128 GB of GPU memory holds it all." if q4_alone else "."))
    return FactCheck(
        '"GPT-3 (175B) needs 128 GB VRAM + 256 GB system memory."', arithmetic, judgement,
        "FP16 weights, a short context (2,048 tokens) and batch 1"
        + ("; at 4 bits 128 GB of GPU memory suffices without offloading." if q4_alone else "."),
        {"fp16_total_bytes": f16["total"], "q4_0_total_bytes": f4["total"], "stream_s_per_token": stream_s})


def dense_320b_speed(target: float = 20.0, bandwidth: float = 1.2e12, context: int = 2048) -> FactCheck:
    """"20 tokens/s for a 320B-parameter model", INT4 on 1.2 TB/s unified memory: the decode ceiling, and what
    would have to be true for 20 tokens/s (a batch, active parameters, tokens per step)."""
    d320 = model("dense-320b")
    need = {p: decode_bytes_per_step(d320, p, 1, context) for p in ("int4", Q4_0)}
    ceiling = decode_ceiling(need["int4"], bandwidth)
    with_scales = decode_ceiling(need[Q4_0], bandwidth)
    max_bytes = bandwidth / target
    active = max_bytes / (PRECISIONS[Q4_0] / 8)  # parameters read per token at Q4_0's 4.5 bits
    batch = next(b for b in range(1, 1025) if decode_tokens_per_s(d320, "int4", b, context, bandwidth) >= target)
    per_step = math.ceil(target / ceiling)
    arithmetic = [
        f"bytes per token: {need['int4'] / GB:.0f} GB (4 bits) or {need[Q4_0] / GB:.0f} GB (Q4_0 with scales), "
        "KV cache included",
        f"ceiling: {bandwidth / TB:.1f} TB/s / {need['int4'] / GB:.0f} GB = {ceiling:.1f} tokens/s; "
        f"{with_scales:.1f} with scales",
        f"{target:.0f} tokens/s needs <= {max_bytes / GB:.0f} GB read per token: about {active / 1e9:.0f}B active "
        "parameters at 4.5 bits"]
    if ceiling >= target:
        judgement = f"Possible: the ceiling is {ceiling:.0f} tokens/s, above {target:.0f}."
    else:
        judgement = (f"False for one stream of a dense 320B model: the ceiling is {ceiling:.0f} tokens/s, "
                     f"{target / ceiling:.1f}x short of {target:.0f}, before any overhead.")
    return FactCheck(
        f'"{target:.0f} tokens/s for a 320B-parameter model", with INT4 weights on a {bandwidth / TB:.1f} TB/s '
        "unified memory.", arithmetic, judgement,
        f"it counts tokens/s of a batch ({batch}+ sequences share each read of the weights), or the model is a "
        f"mixture of experts with about {active / 1e9:.0f}B active parameters, or speculative decoding (a small "
        f"draft model proposes tokens that the big one checks in one step) accepts ~{per_step} tokens per step.",
        {"ceiling": ceiling, "batch_needed": batch, "active_params": active, "tokens_per_step": per_step})


def _band(offloaded, shares) -> tuple[int, int] | None:
    inside = [k for k, s in zip(offloaded, shares) if BAND[0] <= s <= BAND[1]]
    return (min(inside), max(inside)) if inside else None


def transfer_share() -> FactCheck:
    """"Data transfers between CPU and GPU account for 30-50% of total inference time": Llama-2-70B in BF16 on
    one H200 with some layers streamed over PCIe, decoding and prefilling (section 5's settings)."""
    m, h200 = model("llama-2-70b"), device("h200")
    pcie4, pcie5 = device("pcie4-x16").bandwidth, device("pcie5-x16").bandwidth
    peak = h200.peak_flops["bf16"]
    decode_k, prefill_k = (0, 1, 10, 40), (4, 10, 20)
    decode = dict(zip(decode_k, stream_shares(m.n_params, m.n_layers, decode_k, h200.bandwidth, pcie4)))
    prefill = dict(zip(prefill_k, stream_shares(m.n_params, m.n_layers, prefill_k, h200.bandwidth, pcie5, 2048, peak)))
    bands = {tokens: _band(SECTION5_OFFLOADED, stream_shares(m.n_params, m.n_layers, SECTION5_OFFLOADED,
                                                             h200.bandwidth, pcie5, tokens, peak))
             for tokens in (1, 2048, 8192)}
    arithmetic = [
        "Llama-2-70B BF16 on an H200, batch-1 decode, layers streamed over PCIe 4.0: "
        + ", ".join(f"{k} offloaded -> {s:.0%}" for k, s in decode.items()),
        "prefill of 2,048 tokens (compute-bound), layers streamed over PCIe 5.0: "
        + ", ".join(f"{k} offloaded -> {s:.0%}" for k, s in prefill.items()),
        f"with every layer resident only token ids and logits cross the link: {decode[0]:.0%}"]
    prefills = "; ".join(f"{tokens:,} tokens, {b[0]}-{b[1]} layers" for tokens, b in bands.items() if tokens > 1 and b)
    judgement = (f"Not a general figure: for decoding with offloaded weights transfers take {decode[1]:.0%} or more "
                 f"of the time (one layer of {m.n_layers} suffices); with none offloaded {decode[0]:.0%}. "
                 + ("30-50% is a prefill-heavy setting." if bands[1] is None and prefills else
                    "Decoding reaches 30-50% too." if bands[1] else "30-50% does not occur in these settings."))
    return FactCheck(
        '"Data transfers between CPU and GPU account for 30-50% of total inference time."', arithmetic, judgement,
        f"long prompts are processed with part of the layers streamed (section 5: {prefills or 'never'}), or "
        "transfers overlap with compute, or what crosses the link is KV cache rather than weights.",
        {"decode": decode, "prefill": prefill, "bands": bands})


def trillion_fp16(n_params: float = 3e12, claimed_tb: float = 6.0) -> FactCheck:
    """"A 3-trillion-parameter model needs about 6 TB in FP16": its weights, our moe-3t preset's footprint,
    and the devices that takes."""
    w = weight_bytes(n_params, 16)
    moe = model("moe-3t")
    serving = footprint(moe, "fp16", 1, 8192)["total"]
    h200 = device("h200").memory_bytes
    n_h200 = math.ceil(w / h200)
    arithmetic = [
        f"{n_params:.0e} x 2 bytes = {w / TB:.1f} TB = {w / 2**40:.2f} TiB of weights".replace("e+12", "e12"),
        f"our moe-3t preset: {moe.n_params / 1e12:.2f}T parameters -> {serving / TB:.2f} TB with an 8k-token KV cache",
        f"that is {n_h200} H200s ({h200 / GB:.0f} GB each) for the weights alone"]
    close = abs(w / TB - claimed_tb) <= 0.05 * claimed_tb
    judgement = (f"True for the weights ({w / TB:.1f} TB, decimal); serving needs KV cache and activations on top."
                 if close else f"Off: the weights alone are {w / TB:.1f} TB, not {claimed_tb:.0f}.")
    return FactCheck(
        f'"A {n_params / 1e12:.0f}-trillion-parameter model needs about {claimed_tb:.0f} TB in FP16."', arithmetic,
        judgement,
        "TB means 1e12 bytes and only weights are counted; mixed-precision training with Adam needs ~16 bytes "
        f"per parameter ({16 * n_params / TB:.0f} TB; Rajbhandari et al., ZeRO, 2020).",
        {"weight_bytes": w, "serving_bytes": serving, "h200s": n_h200})


def int4_compression() -> FactCheck:
    """"4-bit asymmetric quantization: 8:1 compression": the ratio against FP32 and FP16, with and without
    the scales and zero points every group stores (lab 03 measures the error and the accuracy)."""
    codes, q4_1, g128 = 4, PRECISIONS[Q4_1], PRECISIONS[G128]
    ratios = {(base, bits): base / bits for base in (32, 16) for bits in (codes, q4_1, g128)}
    arithmetic = [
        f"FP32 -> 4-bit codes: 32 / 4 = {ratios[32, codes]:.1f}; FP16 -> 4-bit codes: {ratios[16, codes]:.1f}",
        f"asymmetric needs a scale and a minimum (or zero point) per group: llama.cpp's Q4_1 is {q4_1:.1f} bits "
        f"per weight -> {ratios[32, q4_1]:.1f}:1 from FP32, {ratios[16, q4_1]:.1f}:1 from FP16",
        f"with groups of 128 (fp16 scale and zero, as in GPTQ/AWQ): {g128:.2f} bits -> {ratios[32, g128]:.1f}:1 "
        f"from FP32, {ratios[16, g128]:.1f}:1 from FP16"]
    shipped = f"{ratios[16, q4_1]:.1f}-{ratios[16, g128]:.1f}:1"
    judgement = (f"Only against FP32 and without counting scales; asymmetric INT4 stored as models ship (FP16) is "
                 f"{shipped}." if ratios[32, codes] == 8 else f"False: the codes alone give {ratios[32, codes]:.1f}:1.")
    return FactCheck(
        '"4-bit asymmetric quantization: 8:1 compression" (its "42% lower error" and "98.7% accuracy retained" are '
        "lab 03's)", arithmetic, judgement,
        "the baseline is FP32 and the per-group scales and zero points are not counted (lab 03 measures the error).",
        {"ratios": ratios})


def cost_roi(local: float = 5300, cloud_per_day: float = 2100, claimed_days: float = 182.5) -> FactCheck:
    """The cost table, local $5,300 once against cloud $2,100 per day, "ROI within 6 months" (182.5 days)."""
    days = breakeven_days(local, cloud_per_day)
    implied = local / claimed_days
    gpu = device("rtx-4090")
    arithmetic = [
        f"break-even after ${local:,.0f} / ${cloud_per_day:,.0f} per day = {days:.1f} days",
        f"a 6-month break-even implies a cloud bill of ${implied:.0f} per day",
        f"${cloud_per_day:,.0f} per day is ${cloud_per_day / 24:.2f} per hour, a multi-GPU server's price range; "
        f"${local:,.0f} is a workstation with one consumer GPU such as an RTX 4090 ({gpu.memory_bytes / GB:.0f} GB, "
        f"{gpu.bandwidth / TB:.2f} TB/s; launched at $1,599)"]
    if days <= claimed_days:
        judgement = (f"Inconsistent: the table's own figures give {days:.1f} days, {claimed_days / days:.0f}x sooner "
                     "than 6 months, and the two sides do not serve the same models.")
    else:
        judgement = f"False: the table's own figures give {days:.0f} days, more than 6 months."
    return FactCheck(
        f'Local hardware at "${local:,.0f}" once against cloud at "${cloud_per_day:,.0f}/day": "ROI within 6 months".',
        arithmetic, judgement,
        f"the cloud side is a single GPU at about ${implied:.0f} per day and the local box can hold the same model.",
        {"breakeven_days": days, "implied_cloud_per_day": implied})


CLAIMS = (gpt3_memory, dense_320b_speed, transfer_share, trillion_fp16, int4_compression, cost_roi)
