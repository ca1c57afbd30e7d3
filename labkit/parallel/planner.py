"""A parallel-layout planner for decoding a large model on a GPU cluster (notebook 04, section 7).

Given a model (labkit.specs), a cluster (nodes x devices per node, from data/hardware.json) and a workload
(sequences decoded together per replica, context, bytes per weight and per KV element), `plan` enumerates
TP x PP x EP x DP and returns every layout, best first, each with its memory and time breakdown; rejected
ones say why. The model it applies, stated so it can be argued with:

    devices      tp (innermost, inside a node) x ep x pp make one replica; dp replicas fill the cluster
    weights      dense part / (tp pp) + routed experts / (tp pp ep) per device; uneven PP stages are
                 allowed and the largest stage (ceil(L / pp) layers) is the one that must fit
    attention    data-parallel inside the EP group (DeepSeek-V3's layout): the batch's whole sequences
                 are dealt over the ep ranks, so the busiest rank serves ceil(batch / ep) of them (and some
                 ranks none when batch < ep; `Plan.notes` says so); KV split over min(tp, n_kv_heads) ranks
                 (GQA replicates past that, MLA's one latent is replicated over tp) and over pp
    memory       weights + KV cache + activations <= usable fraction (0.9) of the device's memory
    one step     one new token for every sequence; the stages run one after another (no micro-batches in
                 flight: PP buys memory, not speed, here) and communication is not overlapped:
                 latency = pp * roofline(one stage) + TP all-reduces + EP all-to-alls + PP sends
    roofline     max(bytes read / memory bandwidth, FLOP / peak): the weights of one stage (only the
                 experts some token picked), its KV cache; FLOP 2 x active parameters x tokens + attention
    links        the alpha-beta model (labkit.parallel.linkmodel) with spec-sheet bandwidths
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._checks import check_choice, check_fraction, check_positive, check_positive_int, check_type, fail
from ..specs import ModelSpec, device, model
from .linkmodel import LinkModel

OBJECTIVES = ("throughput", "latency")

USABLE = 0.9  # the share of a device's memory a layout may fill (weights, KV cache, activations)


@dataclass(frozen=True)
class Hardware:
    """nodes x per_node devices of one kind (a data/hardware.json name), an intra-node link and an
    inter-node link (names of links there)."""
    nodes: int
    per_node: int = 8
    device: str = "h100-sxm"
    intra: str = "nvlink4"
    inter: str = "ib-ndr-400"

    def __post_init__(self):
        check_positive_int("nodes", self.nodes)
        check_positive_int("per_node", self.per_node)
        if device(self.device).kind == "link":
            fail("device", self.device, "a device of data/hardware.json, not a link")
        for name in ("intra", "inter"):
            LinkModel.from_spec(getattr(self, name))

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True)
class Workload:
    """batch: sequences decoded together by one replica; context: tokens of each (KV cached); bytes per
    weight, per KV element and per activation element (2 = BF16/FP16, 1 = FP8)."""
    batch: int = 64
    context: int = 8192
    weight_bytes: float = 2
    kv_bytes: float = 2
    act_bytes: float = 2

    def __post_init__(self):
        check_positive_int("batch", self.batch)
        check_positive_int("context", self.context)
        for name in ("weight_bytes", "kv_bytes", "act_bytes"):
            check_positive(name, getattr(self, name), unit="bytes")


@dataclass(frozen=True)
class Plan:
    """One layout: degrees, devices used, whether it fits (else `reason`), memory per device (bytes) and
    decode step time (seconds) by part, latency per token (s) and throughput (tokens/s, all replicas)."""
    tp: int
    pp: int
    ep: int
    dp: int
    devices: int
    reason: str = ""
    memory: dict = field(default_factory=dict)
    time: dict = field(default_factory=dict)
    bound: str = ""
    """what limits one stage: "memory" (bytes read) or "compute" (FLOP)"""
    notes: tuple = ()
    """what the estimate rounded: uneven PP stages (the largest one counts), sequences dealt unevenly
    over the EP ranks (the busiest one counts)"""

    @property
    def fits(self) -> bool:
        return not self.reason

    @property
    def latency(self) -> float:
        return sum(self.time.values()) if self.time else math.inf

    def throughput(self, batch: int) -> float:
        return self.dp * batch / self.latency if self.fits else 0.0

    def __str__(self) -> str:
        return f"TP={self.tp} PP={self.pp} EP={self.ep} DP={self.dp} ({self.devices} devices)"


def weight_params(spec: ModelSpec) -> tuple[int, int]:
    """(dense parameters, routed-expert parameters): shared experts, attention, embeddings are dense."""
    routed = spec.moe_layers * spec.n_experts * spec.counts()["expert_mlp"]
    return spec.n_params - routed, routed


def min_devices(spec: ModelSpec, memory_bytes: float, weight_bytes: float = 2) -> int:
    """Fewest devices of `memory_bytes` whose memory holds the weights alone (nothing else)."""
    check_type("spec", spec, ModelSpec)
    return math.ceil(spec.n_params * check_positive("weight_bytes", weight_bytes)
                     / check_positive("memory_bytes", memory_bytes, unit="bytes"))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _reason(spec: ModelSpec, cl: Hardware, tp: int, pp: int, ep: int) -> str:
    if tp > cl.per_node:
        return f"TP={tp} spans nodes ({cl.per_node} devices per node)"
    if spec.n_heads % tp:
        return f"TP={tp} does not divide the {spec.n_heads} heads"
    if not spec.is_mla and spec.n_kv_heads % tp and tp % spec.n_kv_heads:
        return f"TP={tp} neither divides nor is a multiple of the {spec.n_kv_heads} KV heads"
    if ep > 1 and spec.n_experts % ep:
        return f"EP={ep} does not divide the {spec.n_experts} experts"
    if pp > spec.n_layers:
        return f"PP={pp} exceeds the {spec.n_layers} layers"
    return ""


def estimate(spec: ModelSpec, cl: Hardware, wl: Workload, tp: int, pp: int, ep: int, usable: float = USABLE) -> Plan:
    """The Plan of one layout (see the module docstring), rejected or not. tp, pp, ep: positive ints."""
    for name, degree in (("tp", tp), ("pp", pp), ("ep", ep)):
        check_positive_int(name, degree, unit="a parallel degree: 1 means no split")
    dp = cl.devices // (tp * pp * ep)
    used = dp * tp * pp * ep
    reason = _reason(spec, cl, tp, pp, ep) or ("" if dp else f"TP x PP x EP = {tp * pp * ep} exceeds the "
                                                            f"{cl.devices} devices")
    if reason:
        return Plan(tp, pp, ep, dp, used, reason)
    dev = device(cl.device)
    largest = math.ceil(spec.n_layers / pp)
    stage = largest / spec.n_layers  # share of the layers in the largest stage
    dense, routed = weight_params(spec)
    seqs = math.ceil(wl.batch / ep)  # whole sequences on the busiest attention rank
    notes = _notes(spec.n_layers, pp, largest, wl.batch, ep, seqs)
    kv_split = 1 if spec.is_mla else min(tp, spec.n_kv_heads)
    kv = seqs * wl.context * spec.kv_bytes_per_token(wl.kv_bytes) * stage / kv_split
    weights = (dense / tp + routed / (tp * ep)) * stage * wl.weight_bytes
    acts = seqs * (8 * spec.d_model + 2 * spec.vocab_size / tp) * 4  # decode: a few vectors per sequence (FP32)
    memory = {"weights": weights, "kv_cache": kv, "activations": acts}
    if sum(memory.values()) > usable * dev.memory_bytes:
        return Plan(tp, pp, ep, dp, used, f"needs {sum(memory.values()) / 1e9:.0f} GB per device, more than "
                    f"{usable:.0%} of {dev.memory_bytes / 1e9:.0f} GB", memory, notes=notes)
    if spec.n_experts > 1:  # experts some token of the batch picked: 1 - (1 - k/E)^batch of them
        touched = 1 - (1 - spec.experts_per_token / spec.n_experts) ** wl.batch
    else:
        touched = 1.0
    read = (dense / tp + routed * touched / (tp * ep)) * stage * wl.weight_bytes + kv
    attn_flop = 4 * wl.context * spec.n_heads * spec.head_dim * spec.n_layers * stage * seqs / tp
    flop = 2 * spec.active_params * stage * seqs / tp + attn_flop
    peak = dev.peak_flops.get("bf16" if wl.weight_bytes >= 2 else "fp8", max(dev.peak_flops.values()))
    intra, inter = LinkModel.from_spec(cl.intra), LinkModel.from_spec(cl.inter)
    hidden = seqs * spec.d_model * wl.act_bytes
    bound = "memory" if read / dev.bandwidth >= flop / peak else "compute"
    time = {"stages (roofline)": pp * max(read / dev.bandwidth, flop / peak),
            "tp all-reduce": 2 * spec.n_layers * intra.collective("all_reduce", hidden, tp),
            "ep all-to-all": 2 * spec.moe_layers * (intra if tp * ep <= cl.per_node else inter).collective(
                "all_to_all", hidden * spec.experts_per_token, ep),
            "pp send": (pp - 1) * (intra if tp * ep * pp <= cl.per_node else inter).send(hidden)}
    return Plan(tp, pp, ep, dp, used, "", memory, time, bound, notes)


def _notes(layers: int, pp: int, largest: int, batch: int, ep: int, seqs: int) -> tuple[str, ...]:
    """The roundings `estimate` made, in words (empty when the split is even)."""
    notes = []
    if layers % pp:
        smallest = layers // pp
        notes.append(f"uneven PP stages: {layers} layers over {pp} stages are {layers % pp} of {largest} and "
                     f"{pp - layers % pp} of {smallest}; the largest stage sets memory and time")
    if batch % ep:
        idle = f"; {ep - batch} ranks serve none" if batch < ep else ""
        notes.append(f"{batch} sequences over EP={ep}: the busiest rank holds {seqs} whole sequence(s){idle}")
    return tuple(notes)


def plan(spec: ModelSpec | str, cluster: Hardware, workload: Workload = Workload(),
         objective: str = "throughput", usable: float = USABLE) -> list[Plan]:
    """Every TP x PP x EP layout of `spec` on `cluster` (DP fills the rest), best first by `objective`
    ("throughput": most tokens/s over all replicas; "latency": least seconds per token); the rejected
    layouts follow, each with its reason. PP runs over the divisors of the layer count and the powers of 2
    below it (uneven stages), TP over 1 .. per_node, EP over the divisors of the expert count."""
    spec = model(spec) if isinstance(spec, str) else check_type("spec", spec, ModelSpec)
    check_type("cluster", cluster, Hardware)
    check_type("workload", workload, Workload)
    check_choice("objective", objective, OBJECTIVES)
    check_fraction("usable", usable)
    pps = sorted(set(_divisors(spec.n_layers)) | {2 ** i for i in range(8) if 2 ** i <= spec.n_layers})
    eps = _divisors(spec.n_experts) if spec.n_experts > 1 else [1]
    plans = [estimate(spec, cluster, workload, tp, pp, ep, usable) for tp in range(1, cluster.per_node + 1)
             for pp in pps for ep in eps if tp * pp * ep <= cluster.devices]
    key = ((lambda p: (-p.throughput(workload.batch), p.latency)) if objective == "throughput"
           else (lambda p: (p.latency, -p.throughput(workload.batch))))
    return sorted((p for p in plans if p.fits), key=key) + [p for p in plans if not p.fits]


def best(spec: ModelSpec | str, cluster: Hardware, workload: Workload = Workload(), objective: str = "throughput",
         usable: float = USABLE) -> Plan:
    """The best plan, or a ValueError naming why the nearest miss failed when none fits."""
    plans = plan(spec, cluster, workload, objective, usable)
    if not plans or not plans[0].fits:
        hint = nearest_miss(plans)
        fail("cluster", cluster, "a cluster on which some layout fits"
             + (f" (closest: {hint}: {hint.reason})" if hint else ""))
    return plans[0]


def nearest_miss(plans: list[Plan]) -> Plan | None:
    """Of the rejected plans, the one that missed by least: the memory failure needing the fewest bytes per
    device (all plans of one cluster share the device), else the first rejected one; None if none was."""
    rejected = [p for p in plans if not p.fits]
    memory = [p for p in rejected if p.memory]
    if memory:
        return min(memory, key=lambda p: sum(p.memory.values()))
    return rejected[0] if rejected else None


def tp_decode_seconds(spec: ModelSpec, dev: str, link: str, tp: int, weight_bytes: float = 2,
                      act_bytes: float = 2) -> float:
    """Seconds per token for one sequence on `tp` devices: reading 1/tp of the weights at the device's memory
    bandwidth, plus two all-reduces of d_model activations per layer over `link` (batch 1: memory-bound).
    Says nothing of memory: `tp_fits` does, and `best_decode_tp` ranks only the degrees that fit."""
    check_type("spec", spec, ModelSpec)
    check_positive_int("tp", tp)
    read = spec.active_params * check_positive("weight_bytes", weight_bytes) / tp / device(dev).bandwidth
    hidden = spec.d_model * check_positive("act_bytes", act_bytes)
    return read + 2 * spec.n_layers * LinkModel.from_spec(link).collective("all_reduce", hidden, tp)


def tp_fits(spec: ModelSpec, dev: str, tp: int, weight_bytes: float = 2, usable: float = USABLE) -> bool:
    """Whether 1/tp of the weights (bytes: n_params x weight_bytes / tp) fits in `usable` of one device's
    memory: the weights alone, as at batch 1 with a short context (notebook 04, section 3)."""
    check_type("spec", spec, ModelSpec)
    check_positive_int("tp", tp)
    need = spec.n_params * check_positive("weight_bytes", weight_bytes) / tp
    return need <= check_fraction("usable", usable) * device(dev).memory_bytes


def best_decode_tp(spec: ModelSpec, dev: str, link: str, tps=(1, 2, 4, 8), weight_bytes: float = 2,
                   usable: float = USABLE) -> int | None:
    """The degree of `tps` with the least tp_decode_seconds among those whose weights fit (tp_fits); None
    when none fits: a layout that does not fit is never the best."""
    fitting = [t for t in tps if tp_fits(spec, dev, t, weight_bytes, usable)]
    if not fitting:
        return None
    return min(fitting, key=lambda t: tp_decode_seconds(spec, dev, link, t, weight_bytes))
