"""Notebook 02's fact-checks: one function per claim about unified memory of "Hardware Challenges in Large Model
Deployment" (notebook 00 names the course's two source articles), each returning a labkit.course.FactCheck (the
claim, quoted; the arithmetic line by line; the verdict; the conditions under which the claim holds), every
sentence built from the simulated results passed in, so that the words cannot disagree with the numbers beside
them.

The article describes a pool shared by CPU and accelerator with page migration at 4 KB granularity, bandwidth
monitoring with load balancing, automatic prefetching and three allocation modes (STATIC, DYNAMIC with a 0.8
threshold, HYBRID). The words in quotation marks are theirs:

    link_utilization(...)     "92% bandwidth utilization"                                   (section 4)
    dynamic_allocation(...)   "Dynamic allocation boosts VRAM utilization by 35%."           (section 5)
    transfer_share(...)       "Data transfers between CPU and GPU account for 30-50% of total
                              inference time."                                              (section 7)
    improvement(...)          "92% bandwidth utilization, a 40% improvement over traditional
                              architectures"                                                (section 4)

busy_share and bytes_for_share are the one-transfer model behind the first. Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

from typing import Mapping

from .._checks import check_fraction, check_positive, check_type, fail
from ..course import FactCheck
from ..memory_wall import offload
from .tenants import BALANCED, SKEWED


SOURCE = ("two technical articles: one on deploying large models locally on unified-memory hardware, one on "
          "adapting a trillion-parameter open model on the day of its release")
QUOTES = {"link": '"92% bandwidth utilization"',
          "dynamic": '"Dynamic allocation boosts VRAM utilization by 35%."',
          "transfers": '"Data transfers between CPU and GPU account for 30-50% of total inference time."',
          "improvement": '"92% bandwidth utilization, a 40% improvement over traditional architectures"'}
BATCHED = (("None", 1), ("None", 256), ("density", 1), ("density", 256))  # link_utilization's replays
COMPARED = (("DYNAMIC", "STATIC"), ("DYNAMIC", "STATIC 0.4/0.4"), ("DYNAMIC thr 1.0", "STATIC"))


def busy_share(nbytes: float, latency: float, bandwidth: float) -> float:
    """The fraction of time a link is busy when every `latency` seconds of dead time is followed by one
    transfer of `nbytes` at `bandwidth` bytes/s: (S/B) / (L + S/B)."""
    s = check_positive("nbytes", nbytes, unit="bytes") / check_positive("bandwidth", bandwidth, unit="bytes/s")
    return s / (check_positive("latency", latency, unit="s", allow_zero=True) + s)


def bytes_for_share(share: float, latency: float, bandwidth: float) -> float:
    """The bytes one transfer must move after each latency for the link to be busy `share` of the time:
    S = L * B * u / (1 - u), the inverse of busy_share."""
    u = check_fraction("share", share)
    if u >= 1:
        fail("share", share, "a fraction below 1 (a link with any latency is never busy all the time)")
    return check_positive("latency", latency, unit="s") * check_positive("bandwidth", bandwidth, unit="bytes/s") \
        * u / (1 - u)


def _rows(name: str, rows, keys, fields) -> dict:
    check_type(name, rows, Mapping, "a dict")
    for key in keys:
        if key not in rows or not all(f in rows[key] for f in fields):
            fail(name, sorted(rows, key=str), f"a dict with {key!r} -> a row with {', '.join(fields)}")
    return rows


def link_utilization(latency: float, bandwidth: float, page_size: int, replays: Mapping,
                     claimed: float = 0.92) -> FactCheck:
    """"92% bandwidth utilization" against the busy share of one transfer per latency and the 7B replays of
    section 4: `replays` {(prefetch, fault_batch): the replay_steps row of token 2}, for every key of
    BATCHED, each with faults, batches, GB_moved and link_busy."""
    replays = _rows("replays", replays, BATCHED, ("faults", "batches", "GB_moved", "link_busy"))
    need = bytes_for_share(claimed, latency, bandwidth)
    one = busy_share(page_size, latency, bandwidth)
    none1, none256, dens1, dens256 = (replays[k] for k in BATCHED)
    per_latency = none256["GB_moved"] * 1e9 / none256["batches"]
    per_batch = none256["faults"] / none256["batches"]
    best_key = max(BATCHED, key=lambda k: replays[k]["link_busy"])
    best = replays[best_key]["link_busy"]
    arithmetic = [
        f"busy share of one transfer of S bytes after a latency L = {latency * 1e6:.0f} us at B = "
        f"{bandwidth / 1e9:.0f} GB/s: (S/B) / (L + S/B)",
        f"{claimed:.0%} needs S = L*B*{claimed:g}/{1 - claimed:.2g} = {need / 2**20:.1f} MiB per latency paid",
        f"one {page_size // 1024} KiB fault at a time: {one:.1%}; the 7B replay without prefetch: "
        f"{none1['link_busy']:.1%}, with density prefetch {dens1['link_busy']:.0%}",
        f"batches of {per_batch:.0f} faults without prefetch: {per_latency / 2**20:.1f} MiB per latency paid -> "
        f"{none256['link_busy']:.0%} ({claimed:.0%} would need {need / per_batch / 1024:.0f} KiB per fault)"]
    latency_needed = per_latency / bandwidth * (1 - claimed) / claimed  # busy_share solved for the latency
    arithmetic.append(f"at {per_latency / 2**20:.1f} MiB per latency paid, {claimed:.0%} needs a fault latency of at "
                      f"most {latency_needed * 1e6:.1f} us (this model: {latency * 1e6:.0f} us)")
    if dens256["batches"] == dens256["faults"]:
        arithmetic.append(f"density prefetch gains nothing from batches: hits separate its faults, so each fault "
                          f"opens a batch ({dens256['batches']:,} batches for {dens256['faults']:,} faults)")
    settings = (f"{none1['link_busy']:.0%} with {page_size // 1024} KiB faults one at a time, "
                f"{dens1['link_busy']:.0%} with density prefetch, {none256['link_busy']:.0%} with CUDA-sized "
                f"batches of {per_batch:.0f} faults")
    if best < claimed:
        judgement = f"Not reached by demand paging in this model: {settings}."
    else:
        judgement = (f"Reached in this model by {best_key[0]} prefetch in batches of {best_key[1]} ({best:.0%}): "
                     f"{settings}.")
    return FactCheck(
        QUOTES["link"], arithmetic, judgement,
        f"every latency paid moves about {need / 2**20:.0f} MiB or more: multi-MiB migrations or bulk copies "
        f"(cudaMemPrefetchAsync, cudaMemcpyAsync of whole layers), or batches of {per_batch:.0f} faults that each "
        f"move {need / per_batch / 1024:.0f} KiB or more, or such batches on a link whose fault latency is "
        f"{latency_needed * 1e6:.1f} us or less; 'Hardware Challenges' gives no setup for its figure.",
        {"bytes_needed": need, "one_page": one, "best": best, "best_setting": best_key,
         "latency_needed": latency_needed})


def _range(gains: list[float]) -> str:
    """'+32%..+41%', or '+2%' when every gain rounds the same."""
    low, high = f"{min(gains):+.0%}", f"{max(gains):+.0%}"
    return low if low == high else f"{low}..{high}"


def _gain(results, scenario, a, b) -> float:
    return results[scenario][a]["utilization"] / results[scenario][b]["utilization"] - 1


def dynamic_allocation(results: Mapping, burst: Mapping, capacity: float, weight_bytes: float,
                       claimed: float = 0.35, threshold: float = 0.8, sweep: Mapping | None = None) -> FactCheck:
    """"Dynamic allocation boosts VRAM utilization by 35%" from section 5's runs: `results` {scenario: {pool:
    row with utilization}} for tenants.BALANCED and tenants.SKEWED and the pools of COMPARED; `burst`
    {"STATIC", "DYNAMIC": simulate_tenants results} (tenants.burst); the steady-state bound from the
    `capacity` and one model's `weight_bytes` (bytes). A gain counts as reaching the claim when it rounds to
    at least `claimed` in whole percent. `sweep` (optional): {seed: results of the same form} from other
    random request streams (tenants.experiment(seed)); a comparison then reports how many seeds reach the claim
    and its range over them, so that the verdict does not rest on one draw."""
    check_type("results", results, Mapping, "a dict")
    claimed, threshold = check_fraction("claimed", claimed), check_fraction("threshold", threshold)
    pools = {p for pair in COMPARED for p in pair}
    for scenario in (BALANCED, SKEWED):
        _rows(f"results[{scenario!r}]", results.get(scenario, {}), pools, ("utilization",))
    _rows("burst", burst, ("STATIC", "DYNAMIC"), ("utilization", "failed"))
    share = check_positive("weight_bytes", weight_bytes, unit="bytes") / check_positive("capacity", capacity,
                                                                                         unit="bytes")
    gains = {(s, a, b): _gain(results, s, a, b) for s in (BALANCED, SKEWED) for a, b in COMPARED}
    runs = [results]
    if sweep is not None:
        check_type("sweep", sweep, Mapping, "a dict of seed -> results")
        if not sweep:
            fail("sweep", sweep, "a non-empty dict of seed -> results")
        for seed, other in sweep.items():
            for scenario in (BALANCED, SKEWED):
                _rows(f"sweep[{seed!r}][{scenario!r}]", other.get(scenario, {}), pools, ("utilization",))
        runs = list(sweep.values())
    spread = {k: [_gain(r, *k) for r in runs] for k in gains}  # each comparison over the seeds (or this run)
    bound = {fill: fill / (0.5 + share) - 1 for fill in (threshold, 1.0)}
    history = burst["DYNAMIC"]["utilization"] / burst["STATIC"]["utilization"] - 1
    arithmetic = [f"{s}: " + ", ".join(f"{a} vs {b} {gains[s, a, b]:+.0%}" for a, b in COMPARED)
                  for s in (BALANCED, SKEWED)]
    target = round(100 * claimed)
    reaches = {k: sum(round(100 * g) >= target for g in v) for k, v in spread.items()}
    if sweep is not None:
        arithmetic += [f"over {len(runs)} request streams (seeds {', '.join(map(str, sweep))}), {s.split(' (')[0]}: "
                       + ", ".join(f"{a} vs {b} {_range(spread[s, a, b])} (+{target}% or more in "
                                   f"{reaches[s, a, b]} of {len(runs)})" for a, b in COMPARED)
                       for s in (BALANCED, SKEWED)]
    arithmetic += [
        f"steady state (model A fills its STATIC half, model B holds only its weights): DYNAMIC filling "
        f"{threshold:.0%} gains at most {bound[threshold]:+.0%}, filling 100% {bound[1.0]:+.0%}",
        f"a burst of short requests, then long ones (never retried): STATIC {burst['STATIC']['utilization']:.3f} "
        f"({burst['STATIC']['failed']} failed), DYNAMIC {burst['DYNAMIC']['utilization']:.3f} "
        f"({burst['DYNAMIC']['failed']} failed): {history:+.1%}"]
    seeds = "" if sweep is None else " of {} seeds".format(len(runs))
    reached = [f"{s.split(' (')[0]} load, {a} vs {b} ({g:+.0%}" + (f"; in {reaches[s, a, b]}{seeds}, "
               f"{_range(spread[s, a, b])})" if sweep is not None else ")")
               for (s, a, b), g in gains.items()
               if round(100 * g) >= target or (sweep is not None and reaches[s, a, b])]
    reached += [f"the burst order ({history:+.1%})"] if round(100 * history) >= target else []
    busy_equal, busy_full = gains[BALANCED, "DYNAMIC", "STATIC 0.4/0.4"], gains[BALANCED, "DYNAMIC", "STATIC"]
    judgement = ((f"False as a general statement: +{target}% or more only for " + "; ".join(reached)
                  if reached else f"Not reached in any of these runs (+{target}% claimed)")
                 + f". With both models busy DYNAMIC changes utilization by {busy_equal:+.0%} against an equal "
                 f"budget and by {busy_full:+.0%} against full STATIC halves.")
    conditions = []
    if any(s == SKEWED and (round(100 * g) >= target or reaches[s, a, b]) for (s, a, b), g in gains.items()):
        conditions.append("one model is mostly idle while the other needs more than its STATIC half")
    if round(100 * history) >= target:
        conditions.append("requests are never retried and arrive in an order that fills a STATIC half just "
                          "before long ones come")
    holds_if = (("; or ".join(conditions) if conditions else "a load more skewed than any run here")
                + f" (in a steady state DYNAMIC at {threshold:.0%} gains at most {bound[threshold]:+.0%}).")
    return FactCheck(
        QUOTES["dynamic"], arithmetic, judgement, holds_if,
        {"gains": gains, "bound": bound, "history": history, "reached": reached, "spread": spread,
         "reaches": reaches})


def _span(a, b, fmt: str = "{}") -> str:
    """'79' or '70..75'; '1.6%' or '6.6-12.8%' with fmt '{:.1%}'."""
    if fmt.format(a) == fmt.format(b):
        return fmt.format(a)
    return f"{fmt.format(a).rstrip('%')}-{fmt.format(b)}" if fmt.endswith("%}") else f"{a}..{b}"


def transfer_share(stream: Mapping[str, list], split: list, steady: Mapping, low: float = 0.3,
                   high: float = 0.5) -> FactCheck:
    """"Data transfers ... account for 30-50% of total inference time" from section 7's -ngl curves:
    `stream` {link name: ngl_curve of streamed offloading over that link}, `split` the ngl_curve of split
    execution, and `steady` the page simulator's token-2 row (replay_steps: time_s, transfer_s, latency_s)."""
    check_type("stream", stream, Mapping, "a dict of link name -> ngl_curve")
    if not stream:
        fail("stream", stream, "at least one ngl_curve")
    _rows("steady", {"token": steady}, ("token",), ("time_s", "transfer_s", "latency_s"))
    band = f"{100 * low:.0f}-{high:.0%}"
    arithmetic, windows, offloaded = [], {}, {}
    for link, curve in stream.items():
        ns = windows[link] = offload.share_range(curve, low, high)
        full = curve[0]["transfer_share"]
        if ns:
            off = offloaded[link] = [curve[n]["offloaded_bytes"] / curve[0]["offloaded_bytes"] for n in (ns[-1], ns[0])]
            arithmetic.append(f"streamed over {link}: {full:.0%} of the time with every layer offloaded; {band} only "
                              f"for -ngl {_span(ns[0], ns[-1])} ({len(ns)} of {len(curve)} settings, "
                              f"{_span(*off, '{:.1%}')} of the weights offloaded)")
        else:
            arithmetic.append(f"streamed over {link}: {full:.0%} with every layer offloaded, never {band}")
    split_max = max(c["transfer_share"] for c in split)
    arithmetic.append(f"split (llama.cpp computes offloaded layers on the host): transfers at most {split_max:.1%} "
                      "for every N: only activations cross the link")
    arithmetic.append(f"page simulator (7B, device at half the working set, density prefetch, token 2): link "
                      f"transfers {steady['transfer_s'] / steady['time_s']:.0%} of its time, fault latency "
                      f"{steady['latency_s'] / steady['time_s']:.0%}")
    where = "; ".join(f"-ngl {_span(ns[0], ns[-1])} over {link}" if ns else f"never over {link}"
                      for link, ns in windows.items())
    counted = sum(len(ns) for ns in windows.values()) / sum(len(c) for c in stream.values())
    extent = ("Never on" if not counted else "Only in a narrow window of" if counted <= 0.25 else "In a wide range of")
    judgement = (f"{extent} the streamed -ngl curve ({where}), and {split_max:.1%} with split execution: a point "
                 "on a curve set by the link, the offloaded fraction and the execution strategy, not a property of "
                 "inference.")
    fractions = [f"{_span(*offloaded[link], '{:.1%}')} of the weights over {link}" for link in stream if windows[link]]
    holds_if = ("offloaded weights are streamed over the link every token, "
                + (f"with this much of them offloaded: {' or '.join(fractions)}" if fractions
                   else "which no setting here puts in the band")
                + "; transfers that overlap with compute lower the share.")
    return FactCheck(
        QUOTES["transfers"], arithmetic, judgement, holds_if,
        {"windows": windows, "offloaded": offloaded, "split_max": split_max})


def improvement(busy: Mapping[str, float], latency: float, bandwidth: float, claimed: float = 0.92,
                gain: float = 0.40) -> FactCheck:
    """"92% bandwidth utilization, a 40% improvement over traditional architectures": the baseline that
    implies (92% / 1.4 if the 40% is relative, 92% - 40 points if not), the bytes per latency each needs
    (bytes_for_share), and which of the simulator's settings `busy` {label: link busy share, 0..1} reach it."""
    check_type("busy", busy, Mapping, "a dict of setting -> link busy share")
    if not busy:
        fail("busy", busy, "at least one setting -> link busy share")
    busy = {label: check_fraction(f"busy[{label!r}]", share) for label, share in busy.items()}
    claimed, gain = check_fraction("claimed", claimed), check_positive("gain", gain)
    baselines = {"relative": claimed / (1 + gain), "points": claimed - gain}
    if baselines["points"] <= 0:
        fail("gain", gain, f"less than the claimed share ({claimed:.0%}) in points")
    base = baselines["relative"]
    need = {u: bytes_for_share(u, latency, bandwidth) for u in (base, claimed)}
    above = [k for k, u in busy.items() if u >= base]
    best = max(busy, key=busy.get)
    arithmetic = [
        f"a {gain:.0%} improvement to {claimed:.0%}: from {base:.1%} if relative ({claimed:g} / {1 + gain:g}), "
        f"from {baselines['points']:.0%} if in points",
        f"bytes per latency paid (L = {latency * 1e6:.0f} us, B = {bandwidth / 1e9:.0f} GB/s): {base:.1%} needs "
        f"{need[base] / 2**20:.2f} MiB, {claimed:.0%} needs {need[claimed] / 2**20:.2f} MiB "
        f"({need[claimed] / need[base]:.1f}x more)",
        "this simulator: " + "; ".join(f"{k}: {u:.1%}" for k, u in busy.items()),
        f"its best ({best!r}) is {busy[best] / base - 1:+.0%} over the {base:.1%} baseline; {claimed:.0%} would be "
        f"{claimed / busy[best] - 1:+.0%} over its best"]
    reached = f"the baseline ({base:.0%}) is reached by {'; '.join(above)}" if above else \
        f"no setting reaches even the baseline ({base:.0%})"
    top = "and " + (f"{best!r} reaches {claimed:.0%}" if busy[best] >= claimed else f"none reaches {claimed:.0%}")
    judgement = (f"Implies a traditional baseline of {base:.0%} ({baselines['points']:.0%} if the 40% are points): "
                 f"in this simulator {reached} ({len(above)} of {len(busy)} settings), {top}; "
                 "'Hardware Challenges' names no baseline or setup.")
    return FactCheck(
        QUOTES["improvement"], arithmetic, judgement,
        f"the traditional architecture moves about {need[base] / 2**20:.1f} MiB per latency paid (batched faults "
        f"or prefetch) and the improved one about {need[claimed] / 2**20:.0f} MiB (bulk migrations); with 4 KiB "
        "faults one at a time the baseline is far lower and 40% far too little.",
        {"baselines": baselines, "bytes_needed": need, "above": above, "best": best})
