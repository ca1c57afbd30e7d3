"""Notebook 01's fact-check: one function per claim of the course's source material, each returning the
claim (quoted), the arithmetic behind the verdict line by line, the verdict and the conditions under which
the claim holds, every sentence built from the numbers it rests on.

The source material is two technical articles: "Hardware Challenges in Large Model Deployment" (short title
"Hardware Challenges": the memory wall, unified memory, asymmetric INT4, the cost table), whose claims these
are, and "Engineering Trillion-Parameter Model Instant Adaptation on Domestic AI Hardware: From Challenges to
Production" ("Trillion-Parameter Instant Adaptation": the 3T Day-0 adaptation). The words in quotation marks
are theirs; the words around them give the setting the article states.

    check = gpt3_memory()      # a FactCheck
    check.show()               # prints CLAIM / arithmetic / VERDICT / HOLDS IF (labkit.course.verdict)
    check.numbers              # the figures behind it, for asserts and for further work

Units: bytes (GB = 1e9, TB = 1e12, TiB = 2**40), bytes/s, tokens/s, US dollars, days.
"""

from __future__ import annotations

import math

from .cost import breakeven_days
from .._checks import check_number, check_positive, check_positive_int
from .footprint import PRECISIONS, decode_bytes_per_step, decode_tokens_per_s, footprint
from .transfer import BAND, GPUS, LINKS, WORKLOADS, region, setting, step, sweep
from .roofline import decode_ceiling, weight_bytes
from ..course import FactCheck
from ..specs import device, model

GB, TB = 1e9, 1e12
Q4_0, Q4_1, G128 = "int4-g32 sym (Q4_0)", "int4-g32 asym (Q4_1)", "int4-g128 asym"


def stand_in(spec) -> str:
    """How a fact-check names a preset: a course stand-in (ModelSpec.hypothetical) is called the course's
    assumption, so that no one takes its shape or its total for a published model's."""
    return (f"the course's stand-in {spec.name} (an assumed shape, not a published model)" if spec.hypothetical
            else spec.name)


def _largest(fits, limit: int = 1 << 20) -> int:
    """The largest n in [1, limit] with fits(n) (fits is True up to some n, then False); 0 if not even 1."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, 2 * high
    high = min(high, limit + 1)
    while high - low > 1:  # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def gpt3_memory() -> FactCheck:
    """"GPT-3 (175B) needs 128 GB VRAM + 256 GB system memory": FP16 and Q4_0 footprints, 2,048 tokens, and
    how far the batch and the context can grow before FP16 stops fitting in the 384 GB named."""
    g3 = model("gpt3-175b")
    f16, f4 = footprint(g3, "fp16", 1, 2048), footprint(g3, Q4_0, 1, 2048)
    gpu, budget = 128 * GB, (128 + 256) * GB
    max_batch = _largest(lambda b: footprint(g3, "fp16", b, g3.context)["total"] <= budget)
    max_context = _largest(lambda c: footprint(g3, "fp16", 1, c)["total"] <= budget)
    stream_s = (f16["total"] - gpu) / device("pcie4-x16").bandwidth
    fits, q4_alone = f16["total"] <= budget, f4["total"] <= gpu
    arithmetic = [
        f"FP16 weights {f16['weights'] / GB:.0f} GB + KV cache for 2,048 tokens {f16['kv_cache'] / GB:.1f} GB "
        f"+ activations {f16['activations'] / GB:.1f} GB = {f16['total'] / GB:.0f} GB "
        f"{'<=' if fits else '>'} 128 + 256 = 384 GB",
        f"Q4_0 weights {f4['weights'] / GB:.0f} GB ({f4['total'] / GB:.0f} GB with KV cache and activations): "
        + ("fits in 128 GB of GPU memory alone" if q4_alone else "more than 128 GB of GPU memory"),
        f"streaming the {f16['total'] / GB - 128:.0f} GB that do not fit over PCIe 4.0 x16: {stream_s:.1f} s per token",
        f"FP16 stays within 384 GB up to batch {max_batch} at {g3.context:,} tokens, or up to {max_context:,} tokens "
        f"at batch 1 (GPT-3 was trained for {g3.context:,})"]
    if not fits:
        judgement = f"False: FP16 needs {f16['total'] / GB:.0f} GB, more than the 384 GB named."
    else:
        judgement = (f"Plausible as one configuration, not a requirement: it is FP16 with offloading, and slow "
                     f"({stream_s:.1f} s per token)"
                     + ("; at 4 bits 128 GB of GPU memory holds it all." if q4_alone else "."))
    return FactCheck(
        '"GPT-3 (175B) needs 128 GB VRAM + 256 GB system memory."', arithmetic, judgement,
        f"FP16 weights and at most {max_batch} sequence{'s' if max_batch > 1 else ''} of {g3.context:,} tokens"
        + ("; at 4 bits 128 GB of GPU memory suffices without offloading." if q4_alone else "."),
        {"fp16_total_bytes": f16["total"], "q4_0_total_bytes": f4["total"], "stream_s_per_token": stream_s,
         "max_batch": max_batch, "max_context": max_context})


def dense_320b_speed(target: float = 20.0, bandwidth: float = 1.2e12, context: int = 2048) -> FactCheck:
    """"20 tokens/s for a 320B-parameter model", INT4 on 1.2 TB/s unified memory: the decode ceiling, and what
    would have to be true for 20 tokens/s (a batch, active parameters, tokens per step)."""
    target = check_positive("target", target, unit="tokens/s")
    bandwidth = check_number("bandwidth", bandwidth, low=1, unit="bytes/s")
    context = check_positive_int("context", context, unit="tokens")
    d320 = model("dense-320b")
    need = {p: decode_bytes_per_step(d320, p, 1, context) for p in ("int4", Q4_0)}
    ceiling = decode_ceiling(need["int4"], bandwidth)
    no_kv = decode_ceiling(decode_bytes_per_step(d320, "int4", 1, 1), bandwidth)  # the weights' own cap
    with_scales = decode_ceiling(need[Q4_0], bandwidth)
    max_bytes = bandwidth / target
    active = max_bytes / (PRECISIONS[Q4_0] / 8)  # parameters read per token at Q4_0's 4.5 bits
    batch = next((b for b in range(1, 1025) if decode_tokens_per_s(d320, "int4", b, context, bandwidth) >= target),
                 None)
    per_step = math.ceil(target / ceiling)
    arithmetic = [
        f"{stand_in(d320)}: {d320.n_params / 1e9:.0f}B parameters, bytes per token: {need['int4'] / GB:.0f} GB "
        f"(4 bits) or {need[Q4_0] / GB:.0f} GB (Q4_0 with scales), KV cache of {context:,} tokens included",
        f"ceiling: {bandwidth / TB:.1f} TB/s / {need['int4'] / GB:.0f} GB = {ceiling:.1f} tokens/s; "
        f"{with_scales:.1f} with scales; {no_kv:.1f} at most at any context (the weights alone)",
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
        (f"it counts tokens/s of a batch ({batch}+ sequences share each read of the weights), " if batch else
         "(no batch up to 1,024 sequences gets there: the KV caches outgrow the bandwidth) ")
        + "or the model is a "
        + f"mixture of experts with about {active / 1e9:.0f}B active parameters, or speculative decoding (a small "
        f"draft model proposes tokens that the big one checks in one step) accepts ~{per_step} tokens per step.",
        {"ceiling": ceiling, "ceiling_any_context": no_kv, "batch_needed": batch,
         "active_params": active, "tokens_per_step": per_step})


def _share_span(rows: list[dict], key: tuple, ks: str) -> str:
    """'48%' or '40-57%': the shares of the sweep's rows for `key` (gpu, link, workload) at layers `ks` ("a-b")."""
    low, high = (int(k) for k in (ks.split("-") * 2)[:2])
    shares = [r["share"] for r in rows if (r["gpu"], r["link"], r["workload"]) == key and low <= r["offloaded"] <= high]
    a, b = f"{min(shares):.0%}", f"{max(shares):.0%}"
    return a if a == b else f"{a.rstrip('%')}-{b}"


def _holding(rows: list[dict], reg: list[dict], phase: str) -> str:
    where = [r for r in reg if r["holds"] and r["workload"].startswith(phase)]
    return "; ".join(f"{setting(r['gpu'], r['link'])}, {r['workload'].removeprefix(phase + ', ')}: "
                     f"{r['in_band_possible']} layer{'' if r['in_band_possible'] == '1' else 's'} offloaded "
                     f"({_share_span(rows, (r['gpu'], r['link'], r['workload']), r['in_band_possible'])})"
                     for r in where) or "nowhere in the sweep"


def transfer_share() -> FactCheck:
    """"Data transfers between CPU and GPU account for 30-50% of total inference time": Llama-2-70B in BF16
    with its last layers streamed over the link at every step, swept over GPUs, links, decode batches,
    prefill lengths and the number of layers offloaded (transfer.sweep); the verdict is the region of that
    sweep where the share lies in 30-50% and what stays on the GPU fits."""
    m = model("llama-2-70b")
    rows, gpu_gb = sweep(m), {g: device(g).memory_bytes / GB for g in GPUS}
    reg = region(rows)
    points = [(g, ln, k, step(m, g, ln, k)) for g, ln, k in (("h200", "pcie4-x16", 1), ("h200", "pcie5-x16", 1),
                                                             ("h100-sxm", "pcie5-x16", 1),
                                                             ("h100-sxm", "nvlink-c2c", 5),
                                                             ("h100-sxm", "nvlink-c2c", 10))]
    inside = [r for r in rows if BAND[0] <= r["share"] <= BAND[1]]
    possible = [r for r in inside if r["fits"]]
    decode_never = [g for g in GPUS if not any(r["holds"] for r in reg if r["gpu"] == g
                                              and r["workload"].startswith("decode"))]
    forced = [r for r in reg if r["gpu"] in decode_never and r["workload"].startswith("decode")]
    arithmetic = [
        "Llama-2-70B BF16, the last layers streamed every step, batch-1 decode with a 4,096-token KV cache: "
        + "; ".join(f"{setting(g, ln)}, {k} offloaded -> {p['transfer_share']:.1%}"
                    + ("" if p["fits"] else f" (impossible: {p['on_gpu_bytes'] / GB:.0f} GB would have to stay "
                                             f"in the GPU's {gpu_gb[g]:.0f} GB)") for g, ln, k, p in points),
        f"the sweep: {len(GPUS)} GPUs x {len(LINKS)} links x {len(WORKLOADS)} workloads x 0-{m.n_layers} layers "
        f"offloaded = {len(rows):,} settings; {len(inside):,} put 30-50% on the link, {len(possible):,} of them "
        "possible (what stays fits on the GPU)",
        *(f"{r['gpu']}, {r['workload']}: at least {r['fewest']} layers must be offloaded, then "
          f"{r['share_then']:.0%} on the link even over {r['link']}, the fastest link" for r in forced
          if r["link"] == LINKS[-1])]
    never = (f" Never for decoding on {', '.join(decode_never)}: too little of the model stays on it." if decode_never
             else "")
    streamed = [r for r in rows if r["fits"] and r["offloaded"] > 0 and r not in possible]
    below = sum(r["share"] < BAND[0] for r in streamed)
    judgement = (f"True only in a region. Decoding: {_holding(rows, reg, 'decode')}. Prefill: "
                 f"{_holding(rows, reg, 'prefill')}.{never} With nothing offloaded the share is 0%; the other "
                 f"{len(streamed):,} possible settings with layers streamed are below 30% ({below:,}) or above 50% "
                 f"({len(streamed) - below:,}).")
    decode = [r for r in reg if r["holds"] and r["workload"].startswith("decode")]
    ks = [int(k) for r in decode for k in r["in_band_possible"].split("-")]
    holds_if = ((f"decoding streams only {min(ks)}-{max(ks)} of {m.n_layers} layers, over "
                 f"{' or '.join(dict.fromkeys(r['link'] for r in decode))} into "
                 f"{' or '.join(dict.fromkeys(r['gpu'] for r in decode))}, which holds the rest (at the batches "
                 "above); or " if decode else "")
                + "a long prompt is prefilled with part of the layers streamed; or transfers overlap with compute, "
                "or what crosses the link is KV cache rather than weights (notebook 02 meets the band with "
                "llama.cpp's -ngl placement).")
    return FactCheck(
        '"Data transfers between CPU and GPU account for 30-50% of total inference time."', arithmetic, judgement,
        holds_if,
        {"region": reg, "points": {(g, ln, k): p for g, ln, k, p in points}, "settings": len(rows),
         "in_band": len(inside), "possible": len(possible)})


def trillion_fp16(n_params: float = 3e12, claimed_tb: float = 6.0) -> FactCheck:
    """"A 3-trillion-parameter model needs about 6 TB in FP16": its weights, our moe-3t preset's footprint,
    and the devices that takes."""
    n_params = check_positive("n_params", n_params, unit="parameters")
    claimed_tb = check_positive("claimed_tb", claimed_tb, unit="TB")
    w = weight_bytes(n_params, 16)
    moe = model("moe-3t")
    serving = footprint(moe, "fp16", 1, 8192)["total"]
    h200 = device("h200").memory_bytes
    n_h200 = math.ceil(w / h200)
    arithmetic = [
        f"{n_params:.0e} x 2 bytes = {w / TB:.1f} TB = {w / 2**40:.2f} TiB of weights".replace("e+12", "e12"),
        f"{stand_in(moe)}: {moe.n_params / 1e12:.2f}T parameters -> {serving / TB:.2f} TB with an 8k-token KV cache",
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


MONTH_DAYS = 365.25 / 12  # days in an average month


def cost_roi(local: float = 5300, cloud: float = 2100, claimed_days: float = 182.5) -> FactCheck:
    """The cost table, local $5,300 once against cloud $2,100, "ROI within 6 months" (182.5 days), read both
    ways: $2,100 per day, as printed, and $2,100 per month. The reading the table implies is the one its
    own ROI line fits: a break-even within the claimed time, and the latest such (a claim of "within 6
    months" for a payback in days would undersell it by orders of magnitude)."""
    local = check_positive("local", local, unit="US dollars")
    cloud = check_positive("cloud", cloud, unit="US dollars per day or per month")
    claimed_days = check_positive("claimed_days", claimed_days, unit="days")
    readings = {"per day": breakeven_days(local, cloud), "per month": breakeven_days(local, cloud / MONTH_DAYS)}
    fitting = {k: d for k, d in readings.items() if d <= claimed_days}
    implied = max(fitting, key=fitting.get) if fitting else None
    gpu = device("rtx-4090")
    months = claimed_days / MONTH_DAYS
    arithmetic = [f"read {how}: ${local:,.0f} / ${cloud / per:,.0f} per day = "
                  f"{d:.1f} days = {d / MONTH_DAYS:.2f} months, "
                  f"{_times(d, claimed_days)} the claimed {months:.0f} months"
                  for (how, d), per in zip(readings.items(), (1, MONTH_DAYS))]
    arithmetic += [
        f"cloud per hour: ${cloud / 24:,.2f} read per day, ${cloud / MONTH_DAYS / 24:,.2f} read per month; the local "
        f"side is a workstation with one consumer GPU such as an RTX 4090 ({gpu.memory_bytes / GB:.0f} GB, "
        f"{gpu.bandwidth / TB:.2f} TB/s)",
        f"an exactly {months:.0f}-month break-even would mean a cloud bill of ${local / claimed_days:,.0f} per day"]
    if implied is None:
        judgement = (f"False either way: the table's figures give {readings['per day']:.1f} days or "
                     f"{readings['per month']:.0f} days, more than {claimed_days:.0f}.")
    elif claimed_days / fitting[implied] > 10:
        judgement = (f"Understated either way: even read {implied} the table pays back in {fitting[implied]:.1f} days, "
                     f"{_times(fitting[implied], claimed_days)} the claimed {months:.0f} months.")
    else:
        other = next(k for k in readings if k != implied)
        judgement = (f"True if the ${cloud:,.0f} is {implied}: break-even after {fitting[implied]:.0f} days "
                     f"({fitting[implied] / MONTH_DAYS:.1f} months); read {other} the same table pays back in "
                     f"{readings[other]:.1f} days, {_times(readings[other], claimed_days)} claimed. The table's ROI "
                     f"line implies the {implied.replace(' ', '-')} reading.")
    return FactCheck(
        f'Local hardware at "${local:,.0f}" once against cloud at "${cloud:,.0f}/day": "ROI within 6 months".',
        arithmetic, judgement,
        (f"the cloud side costs ${cloud:,.0f} {implied} "
         f"(${cloud / (MONTH_DAYS if implied == 'per month' else 1) / 24:,.2f} "
         "an hour) and the local box holds the same model; power and upkeep are left out." if implied else
         f"the cloud side costs at least ${local / claimed_days:,.0f} per day."),
        {"breakeven_days": readings, "implied_reading": implied, "implied_cloud_per_day": local / claimed_days})


def _times(days: float, claimed_days: float) -> str:
    """'72x sooner than' or '1.5x later than' (days against the claimed days)."""
    ratio = claimed_days / days
    x = ratio if ratio >= 1 else 1 / ratio
    return (f"{x:.0f}x" if x >= 10 else f"{x:.1f}x") + (" sooner than" if ratio >= 1 else " later than")


CLAIMS = (gpt3_memory, dense_320b_speed, transfer_share, trillion_fp16, int4_compression, cost_roi)

