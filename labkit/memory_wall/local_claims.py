"""Notebook 01's fact-checks of the claims about local deployment in "Hardware Challenges in Large Model
Deployment" (short title "Hardware Challenges"): speed against CPU-only boxes, latency local against cloud and
at the edge, trillion-parameter models on consumer PCs, and a 5x lower memory latency. Same form as
factcheck.py: each function returns a labkit.course.FactCheck (the claim, quoted; the arithmetic line by line;
the verdict; the conditions under which the claim holds), every sentence built from the numbers it rests on.

Every speed here is a ceiling from the spec sheets of data/hardware.json: a decode step reads its bytes at the
device's memory bandwidth (tokens/s <= bandwidth / bytes per token), a prefill does 2 FLOP per active
parameter per prompt token at the device's peak. So every time here is a lower bound ("at least", "no faster
than"): real kernels take longer. Latency figures the spec sheets do not give (network round trip, DRAM
latency, misses in flight) are arguments, stated as assumptions.

Units: bytes (GB = 1e9), bytes/s, FLOP/s, seconds (printed as ms where the claims use ms), tokens/s.
"""

from __future__ import annotations

from .._checks import check_number, check_positive, check_positive_int, check_type, fail
from ..course import FactCheck
from ..specs import device, model
from .footprint import PRECISIONS, decode_bytes_per_step, footprint, params_read
from .verdicts import Verdict

GB, TB = 1e9, 1e12
Q4_0 = "int4-g32 sym (Q4_0)"
CONSUMER = ("rtx-4090", "m2-ultra", "m3-ultra", "ryzen-ai-max-395", "ddr5-5600-2ch")  # today's consumer devices
PROMPTS = (128, 512, 2048, 8192)  # prompt lengths (tokens) of the latency checks


def _near(ratio: float, claimed: float, tolerance: float = 0.25) -> bool:
    """Whether `ratio` lies within `tolerance` (relative) of `claimed`."""
    return abs(ratio / claimed - 1) <= tolerance


MEASURED = "this machine (measured)"


def cpu_only_speedup(claimed: float = 15.0, unified_bandwidth: float = 1.2e12,
                     measured_bandwidth: float | None = None, measured_check: Verdict | None = None) -> FactCheck:
    """"Quantized models achieve 20 tokens/s on unified memory, 15x faster than CPU-only solutions": a
    bandwidth-bound decode reads the same bytes per token on both machines, so the speed-up is the ratio of
    memory bandwidths. Against the CPU-only boxes of data/hardware.json and, when given, this machine's
    measured bandwidth (bytes/s, notebook 01 section 2) with `measured_check`, the verdict that cross-checked
    that measurement (verdicts.against_roof): an unreliable one tags the measured line with its reason and
    keeps the measured machine out of the verdict."""
    claimed = check_positive("claimed", claimed, unit="times")
    unified = check_number("unified_bandwidth", unified_bandwidth, low=1, unit="bytes/s")
    cpus = {name: device(name).bandwidth for name in ("ddr5-5600-2ch", "ddr5-4800-8ch")}
    if measured_check is not None:
        check_type("measured_check", measured_check, Verdict, "a labkit.memory_wall.verdicts.Verdict")
        if measured_bandwidth is None:
            fail("measured_bandwidth", measured_bandwidth, "the measured bandwidth (bytes/s) that measured_check "
                 "cross-checked")
    if measured_bandwidth is not None:
        cpus[MEASURED] = check_number("measured_bandwidth", measured_bandwidth, low=1, unit="bytes/s")
    trusted = measured_check is None or measured_check.reliable
    ratios = {name: unified / bw for name, bw in cpus.items()}
    socs = {name: device(name).bandwidth / cpus["ddr5-5600-2ch"] for name in ("ryzen-ai-max-395", "m3-ultra")}
    d320 = model("dense-320b")
    step = decode_bytes_per_step(d320, Q4_0, 1, 2048)
    arithmetic = [
        f"a decode step reads the same bytes on either machine (weights once, batch 1), so the speed-up is the "
        f"bandwidth ratio; {claimed:.0f}x needs a CPU-only box reading {unified / claimed / GB:.0f} GB/s beside "
        f"{unified / TB:.1f} TB/s",
        *(f"{name}: {bw / GB:.1f} GB/s -> {ratios[name]:.1f}x; the 320B model at Q4_0 ({step / GB:.0f} GB per token) "
          f"{bw / step:.2f} tokens/s against {unified / step:.1f}"
          + ("" if name != MEASURED or trusted else f"; {measured_check.text}") for name, bw in cpus.items()),
        "consumer unified-memory PCs against the same desktop: " + ", ".join(f"{n} {r:.1f}x" for n, r in socs.items())]
    desktop = ratios["ddr5-5600-2ch"]
    near = [name for name, r in ratios.items() if _near(r, claimed) and (name != MEASURED or trusted)]
    if near:
        judgement = (f"Plausible as a bandwidth ratio against {', '.join(near)} ({desktop:.1f}x for the desktop); "
                     f"{ratios['ddr5-4800-8ch']:.1f}x against an 8-channel server, so not against every CPU-only "
                     "solution.")
    else:
        judgement = (f"Not by bandwidth: {desktop:.1f}x against a dual-channel desktop, "
                     f"{ratios['ddr5-4800-8ch']:.1f}x against an 8-channel server.")
    return FactCheck(
        f'"Quantized models achieve 20 tokens/s on unified memory, {claimed:.0f}x faster than CPU-only solutions" '
        f"(unified memory at {unified / TB:.1f} TB/s)", arithmetic, judgement,
        f"CPU-only means a box reading about {unified / claimed / GB:.0f} GB/s, as a desktop with two DDR5 channels "
        f"does ({cpus['ddr5-5600-2ch'] / GB:.1f} GB/s peak), and both decodes are bandwidth-bound (batch 1, same "
        f"quantized weights); the unified-memory side is a {unified / TB:.1f} TB/s part, not a consumer "
        f"unified-memory PC ({min(socs.values()):.1f}-{max(socs.values()):.1f}x).",
        {"ratios": ratios, "soc_ratios": socs, "needed_cpu_bandwidth": unified / claimed, "near": near,
         "recap": (f"{claimed:.0f}x faster than CPU-only",
                   f"{desktop:.1f}x against a 2-channel desktop, {ratios['ddr5-4800-8ch']:.1f}x against an "
                   f"8-channel server: {'plausible for the desktop' if near else 'not by bandwidth'}")})


def _peak(dev) -> float:
    """The device's dense BF16 FLOP/s, or FP32 when it publishes no BF16 figure (Apple's GPUs)."""
    return dev.peak_flops.get("bf16") or dev.peak_flops["fp32"]


def request_latency(model_name: str, precision: str, device_name: str, prompt_tokens: int,
                    rtt_s: float = 0.0) -> dict:
    """Lower bounds on one request's latency (seconds): {"per_token": one decode step at the memory ceiling,
    "prefill": the prompt at peak FLOP/s or the weights at bandwidth, whichever is slower, "first_token":
    rtt_s + prefill}. Notebook 01's latency fact-checks."""
    prompt = check_positive_int("prompt_tokens", prompt_tokens, unit="tokens")
    rtt = check_positive("rtt_s", rtt_s, unit="s", allow_zero=True)
    spec, dev = model(model_name), device(device_name)
    per_token = decode_bytes_per_step(spec, precision, 1, prompt) / dev.bandwidth
    weights_s = footprint(spec, precision, 1, 1)["weights"] / dev.bandwidth
    prefill = max(2 * params_read(spec, prompt) * prompt / _peak(dev), weights_s)
    return {"per_token": per_token, "prefill": prefill, "first_token": rtt + prefill}


LOCAL = (("llama-3-8b", Q4_0, "rtx-4090"), ("llama-2-70b", Q4_0, "m2-ultra"))  # (model, precision, device)
CLOUD = (("llama-3-8b", "bf16", "h100-sxm"), ("llama-2-70b", "bf16", "h200"))


def _span(values_ms: list[float], digits: int) -> str:
    """'4.5-28.7 ms' (the smallest and the largest, `digits` after the point), or '28.7 ms' when they print alike."""
    low, high = f"{min(values_ms):.{digits}f}", f"{max(values_ms):.{digits}f}"
    return f"{high} ms" if low == high else f"{low}-{high} ms"


def latency_local_cloud(local_ms: float = 15.0, cloud_ms: float = 200.0, rtt_s: float = 0.05) -> FactCheck:
    """"Latency 15 ms local vs 200 ms cloud": per-token decode time and first-token time of an 8B model on a
    consumer GPU and a 70B model on a consumer unified-memory box, against the same models in BF16 on a cloud
    GPU reached over a network round trip of `rtt_s` seconds (an assumption: 50 ms crosses a continent). Every
    time is a lower bound (request_latency), so a figure below a bound is out of reach and a figure above it
    only within reach."""
    local_ms = check_positive("local_ms", local_ms, unit="ms")
    cloud_ms = check_positive("cloud_ms", cloud_ms, unit="ms")
    rtt = check_positive("rtt_s", rtt_s, unit="s", allow_zero=True)
    local = {(m, d): request_latency(m, p, d, 512) for m, p, d in LOCAL}
    cloud = {(m, d): request_latency(m, p, d, 512, rtt) for m, p, d in CLOUD}
    arithmetic = [f"local {m} at Q4_0 on {d}: at least {1e3 * r['per_token']:.1f} ms per token, first token of a "
                  f"512-token prompt after at least {1e3 * r['first_token']:.0f} ms" for (m, d), r in local.items()]
    arithmetic += [f"cloud {m} in BF16 on {d}: at least {1e3 * r['per_token']:.1f} ms per token, first token after at "
                   f"least {1e3 * rtt:.0f} ms round trip + {1e3 * r['prefill']:.0f} ms prefill = "
                   f"{1e3 * r['first_token']:.0f} ms" for (m, d), r in cloud.items()]
    fast_local = [m for (m, d), r in local.items() if 1e3 * r["per_token"] <= local_ms]
    slow_local = [f"{m} ({1e3 * r['per_token']:.1f} ms at best)" for (m, d), r in local.items()
                  if 1e3 * r["per_token"] > local_ms]
    cloud_token = [1e3 * r["per_token"] for r in cloud.values()]
    cloud_first = [1e3 * r["first_token"] for r in cloud.values()]
    rtt_needed = 1e-3 * cloud_ms - max(r["prefill"] for r in cloud.values())
    arithmetic.append(f"{cloud_ms:.0f} ms for the cloud's first token leaves at most {1e3 * rtt_needed:.0f} ms for the "
                      "round trip and queueing")
    judgement = (f"Compares unlike figures: {local_ms:.0f} ms is a per-token decode time, within reach locally for "
                 f"{', '.join(fast_local) or 'none of these'}"
                 + (f" and out of reach for {', '.join(slow_local)}" if slow_local else "")
                 + f"; a cloud GPU decodes a token in no less than {_span(cloud_token, 1)}, and {cloud_ms:.0f} ms is a "
                 f"first-token figure (no less than {_span(cloud_first, 0)} here with a "
                 f"{1e3 * rtt:.0f} ms round trip).")
    pairs = "; ".join(f"{m}: {1e3 * local[m, ld]['per_token']:.1f} ms local, {1e3 * cloud[m, cd]['per_token']:.1f} ms "
                      "cloud" for (m, _, ld), (_, _, cd) in zip(LOCAL, CLOUD))
    return FactCheck(
        f'Latency "{local_ms:.0f} ms local vs {cloud_ms:.0f} ms cloud"', arithmetic, judgement,
        f"the local figure is per token for a model of about 8B parameters at 4 bits on a consumer GPU, and the "
        f"cloud figure is per request, with a round trip plus queueing of at most about {1e3 * rtt_needed:.0f} ms. "
        f"Per token the bounds are {pairs}.",
        {"local": local, "cloud": cloud, "rtt_needed": rtt_needed,
         "recap": (f"{local_ms:.0f} ms local vs {cloud_ms:.0f} ms cloud",
                   f"a per-token time against a first-token time; {local_ms:.0f} ms per token within reach for "
                   f"{', '.join(fast_local) or 'none'}"
                   + (f", not for {', '.join(m for (m, _), r in local.items() if 1e3 * r['per_token'] > local_ms)}"
                      if slow_local else ""))})


def edge_realtime(limit_ms: float = 50.0, prompts: tuple = PROMPTS) -> FactCheck:
    """"<50 ms real-time response" at the edge: per-token decode time and first-token time (prefill, no
    network) of LOCAL's models for each prompt length of `prompts`, both lower bounds: for which of them the
    bound stays below the limit (there the claim is possible; above it, impossible)."""
    limit = check_positive("limit_ms", limit_ms, unit="ms") / 1e3
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        fail("prompts", prompts, "a non-empty tuple of prompt lengths (tokens): a verdict needs at least one")
    prompts = tuple(check_positive_int(f"prompts[{i}]", p, unit="tokens") for i, p in enumerate(prompts))
    rows = {(m, d, n): request_latency(m, p, d, n) for m, p, d in LOCAL for n in prompts}
    arithmetic = [f"{m} at Q4_0 on {d}, at least: per token " + ", ".join(f"{1e3 * rows[m, d, n]['per_token']:.1f}"
                                                                           for n in prompts)
                  + " ms; first token " + ", ".join(f"{1e3 * rows[m, d, n]['first_token']:.0f}" for n in prompts)
                  + f" ms (prompts of {', '.join(f'{n:,}' for n in prompts)} tokens)" for m, _, d in LOCAL]
    first_ok = {(m, d): max([n for n in prompts if rows[m, d, n]["first_token"] < limit], default=0)
                for m, _, d in LOCAL}
    token_upto = {(m, d): max([n for n in prompts if rows[m, d, n]["per_token"] < limit], default=0)
                  for m, _, d in LOCAL}
    token_ok = {key: upto == max(prompts) for key, upto in token_upto.items()}

    def tokens(key) -> str:
        if token_ok[key]:
            return "every decoded token"
        return f"decoded tokens up to {token_upto[key]:,}-token contexts" if token_upto[key] else "no decoded token"

    parts = [f"{m} on {d}: " + tokens((m, d))
             + (f", first token up to {first_ok[m, d]:,}-token prompts" if first_ok[m, d] else ", no first token")
             for m, _, d in LOCAL]
    judgement = (f"Depends on the model and the prompt: the bounds allow under {1e3 * limit:.0f} ms for "
                 + "; ".join(parts) + ".")
    return FactCheck(
        f'"<{1e3 * limit:.0f} ms real-time response" at the edge', arithmetic, judgement,
        "the response is a decoded token, or a first token after a short prompt (up to the lengths above) on a "
        "small model; prefill at peak FLOP/s is a lower bound, real kernels reach a fraction of it.",
        {"rows": rows, "first_ok": first_ok, "token_ok": token_ok, "token_upto": token_upto,
         "recap": (f"<{1e3 * limit:.0f} ms at the edge", "; ".join(
             f"{m}: {tokens((m, d)).replace('decoded ', '').replace('up to', 'to')}, "
             + (f"first token to {first_ok[m, d]:,}-token prompts" if first_ok[m, d] else "no first token")
             for m, _, d in LOCAL))})


def trillion_consumer(factor: float = 10.0, tokens_per_s: float = 10.0, context: int = 4096) -> FactCheck:
    """"Consumer PCs will support trillion-parameter models by 2026, requiring 10x improvements in memory
    capacity, bandwidth density and energy efficiency": the capacity (weights + KV cache of `context` tokens)
    and bandwidth (bytes per token x `tokens_per_s`) a 1T dense model and a 1T MoE (Kimi K2) need at Q4_0,
    against today's consumer devices (CONSUMER)."""
    factor = check_positive("factor", factor, unit="times")
    rate = check_positive("tokens_per_s", tokens_per_s, unit="tokens/s")
    context = check_positive_int("context", context, unit="tokens")
    bits = PRECISIONS[Q4_0]
    kimi = model("kimi-k2")
    dense_w = 1e12 * bits / 8
    need = {"1T dense": (dense_w, dense_w),  # (capacity, bytes per token): weights only, no shape to size a KV cache
            "1T MoE (kimi-k2)": (footprint(kimi, Q4_0, 1, context)["total"],
                                 decode_bytes_per_step(kimi, Q4_0, 1, context))}
    short = {(m, d): (cap / device(d).memory_bytes, per_token * rate / device(d).bandwidth)
             for m, (cap, per_token) in need.items() for d in CONSUMER}
    best = {m: min(CONSUMER, key=lambda d: max(short[m, d])) for m in need}
    arithmetic = [f"{m} at Q4_0 ({bits} bits): {cap / GB:,.0f} GB to hold, {per_token / GB:.1f} GB read per token, "
                  f"{per_token * rate / GB:,.0f} GB/s for {rate:.0f} tokens/s" for m, (cap, per_token) in need.items()]
    arithmetic += [f"{d} ({device(d).memory_bytes / GB:.0f} GB, {device(d).bandwidth / GB:,.0f} GB/s) would need: "
                   + "; ".join(f"{m} {_times_its(short[m, d][0], 'capacity')}, "
                               f"{_times_its(short[m, d][1], 'bandwidth')}"
                               for m in need) for d in CONSUMER]
    gaps = {m: max(short[m, best[m]]) for m in need}
    walls = {m: "capacity" if short[m, best[m]][0] >= short[m, best[m]][1] else "bandwidth" for m in need}
    parts = [f"{m} needs {gaps[m]:.1f}x the {walls[m]} of {best[m]}, the closest device" for m in need]
    over = [m for m in need if gaps[m] > factor]
    judgement = ("Roughly, and not for both kinds alike: " + "; ".join(parts) + ". "
                 + (f"Even {factor:.0f}x falls short for {', '.join(over)}." if over else
                    f"{factor:.0f}x covers both; the MoE needs far less.")
                 + " Energy efficiency is not checked here (no energy figures in the spec data).")
    return FactCheck(
        '"Consumer PCs will support trillion-parameter models by 2026, requiring 10x improvements in memory '
        'capacity, bandwidth density and energy efficiency"', arithmetic, judgement,
        f"the model is a mixture of experts (about 32B active parameters) at 4 bits on the largest unified-memory "
        f"box, which then needs only about {gaps['1T MoE (kimi-k2)']:.1f}x its capacity; a dense 1T model at "
        f"{rate:.0f} tokens/s needs {dense_w * rate / TB:.1f} TB/s, beyond every consumer device.",
        {"need": need, "short": short, "best": best, "gaps": gaps,
         "recap": (f"1T models on consumer PCs, {factor:.0f}x better",
                   "; ".join(f"{m} needs {gaps[m]:.1f}x the {walls[m]} of {best[m]}" for m in need))})


def _times_its(ratio: float, what: str) -> str:
    """'23.4x its capacity', or '0.2x its bandwidth (enough)' when the device has what is needed."""
    return f"{ratio:.1f}x its {what}" + (" (enough)" if ratio <= 1 else "")


def fault_sweep_s(sweep_bytes: float, fault_bytes: float, latency: float, link_bandwidth: float) -> float:
    """Seconds for a sweep of `sweep_bytes` that faults on every page through a full device, in lab 02's
    model (one fault at a time): (sweep / fault_bytes) faults x latency + 2 x sweep / link_bandwidth (every
    page in, a victim out)."""
    sweep = check_positive("sweep_bytes", sweep_bytes, unit="bytes")
    size = check_positive("fault_bytes", fault_bytes, unit="bytes")
    lat = check_positive("latency", latency, unit="s", allow_zero=True)
    bw = check_positive("link_bandwidth", link_bandwidth, unit="bytes/s")
    return sweep / size * lat + 2 * sweep / bw


def latency_fifth(factor: float = 5.0, dram_latency: float = 100e-9, lines_in_flight: int = 16,
                  fault_latency: float = 30e-6, link_bandwidth: float = 25e9) -> FactCheck:
    """"Memory latency reduced to 1/5": what it buys a bandwidth-bound decode (Llama-2-70B at Q4_0 on an
    M2 Ultra), one core reading alone (Little's law: lines_in_flight x 64 bytes per dram_latency, assumed
    figures) and page faults in lab 02's model (fault_latency and link_bandwidth are lab 02's defaults)."""
    factor = check_number("factor", factor, low=1, low_open=True, unit="times")
    dram = check_positive("dram_latency", dram_latency, unit="s")
    lines = check_positive_int("lines_in_flight", lines_in_flight, unit="cache lines")
    fault_latency = check_positive("fault_latency", fault_latency, unit="s")
    link_bandwidth = check_positive("link_bandwidth", link_bandwidth, unit="bytes/s")
    spec, box, desk = model("llama-2-70b"), device("m2-ultra"), device("ddr5-5600-2ch")
    step = decode_bytes_per_step(spec, Q4_0, 1, 4096) / box.bandwidth
    # each of ~n_layers x 10 dependent kernels waits one memory latency before bytes flow (an upper estimate)
    waits = spec.n_layers * 10 * dram
    core = {lat: min(lines * 64 / lat, desk.bandwidth) for lat in (dram, dram / factor)}
    sweep = footprint(spec, "fp16", 1, 1)["weights"]
    faults = {size: [fault_sweep_s(sweep, size, lat, link_bandwidth) for lat in (fault_latency, fault_latency / factor)]
              for size in (4096, 2 * 2**20)}
    gain = {size: t[0] / t[1] for size, t in faults.items()}
    decode_gain = (step + waits) / (step + waits / factor)
    arithmetic = [
        f"decode at the memory roof: {spec.name} Q4_0 on {box.name} reads {step * box.bandwidth / GB:.1f} GB per "
        f"token in {1e3 * step:.1f} ms; {spec.n_layers * 10} dependent latencies of {1e9 * dram:.0f} ns add "
        f"{1e3 * waits:.3f} ms -> 1/{factor:g} of the latency gains {decode_gain - 1:.2%}",
        f"one core with {lines} lines of 64 bytes in flight (Little's law): {core[dram] / GB:.1f} GB/s at "
        f"{1e9 * dram:.0f} ns, {core[dram / factor] / GB:.1f} GB/s at {1e9 * dram / factor:.0f} ns "
        f"(capped by the desktop's {desk.bandwidth / GB:.1f} GB/s)",
        *(f"lab 02's model, a {sweep / GB:.0f} GB sweep in {size // 1024:,} KiB faults one at a time over "
          f"{link_bandwidth / GB:.0f} GB/s: {t[0]:,.0f} s -> {t[1]:,.0f} s with {1e6 * fault_latency / factor:.0f} us "
          f"faults ({gain[size]:.2f}x)" for size, t in faults.items())]
    judgement = (f"Buys a bandwidth-bound decode almost nothing ({decode_gain - 1:.2%}): its time is bytes / "
                 f"bandwidth. It buys {core[dram / factor] / core[dram]:.1f}x to one core reading alone, and "
                 f"{gain[4096]:.1f}x to 4 KiB page faults serviced one at a time, but {gain[2 * 2**20]:.2f}x with "
                 "2 MiB per fault, where the link's bandwidth dominates.")
    return FactCheck(
        '"Memory latency reduced to 1/5"', arithmetic, judgement,
        "the workload waits on latency: few accesses in flight (one core, pointer chasing) or small page faults "
        "paid one at a time; a decode that streams its weights at the memory roof does not.",
        {"decode_gain": decode_gain, "core": core, "fault_gain": gain, "fault_s": faults,
         "recap": (f"memory latency cut to 1/{factor:g}",
                   f"decode {decode_gain - 1:+.2%}, one core {core[dram / factor] / core[dram]:.1f}x, 4 KiB faults "
                   f"{gain[4096]:.1f}x, 2 MiB faults {gain[2 * 2**20]:.2f}x")})


CLAIMS = (cpu_only_speedup, latency_local_cloud, edge_realtime, trillion_consumer, latency_fifth)


def recap(checks) -> str:
    """A short table of the fact-checks of this module (FactChecks returned by CLAIMS' functions): one line each,
    the claim in a few words and its verdict in one clause. Notebook 01 prints it after the full checks."""
    if isinstance(checks, FactCheck) or not isinstance(checks, (list, tuple)) or not checks:
        fail("checks", checks, "a non-empty list of the FactChecks that local_claims.CLAIMS return")
    for i, c in enumerate(checks):
        check_type(f"checks[{i}]", c, FactCheck)
        if "recap" not in c.numbers:
            fail(f"checks[{i}]", c.claim, "a FactCheck from local_claims.CLAIMS (with numbers['recap'])")
    rows = [c.numbers["recap"] for c in checks]
    width = max(len(label) for label, _ in rows)
    return "\n".join([f"{'claim (Hardware Challenges)':<{width}}  verdict, in short"]
                     + [f"{label:<{width}}  {text}" for label, text in rows])
