"""Step 5 on paper: how many replicas of which layout serve a request rate for the 3T model within a latency
target, and how many requests a router can pass on (notebook 08, section 5). Lab 04's cost model does the work
(labkit.parallel.planner.estimate: the decode step of one layout, roofline + alpha-beta links); this module adds
the prompt's prefill, what each request costs its replica, and the queue in front of prefill.

    replicas_for(rate=50, model="moe-3t", device_name="h100-sxm", prompt_tokens=1024, output_tokens=256,
                 ttft=2.0, tpot=0.05)           -> ScalePlan: layout, batch, replicas, devices
    router_limit(per_request_cpu_s=2e-3, per_chunk_cpu_s=5e-5, chunks_per_request=256, cores=4)  -> requests/s

The formulas (seconds, tokens, requests/s; P = prompt_tokens, O = output_tokens, B = batch, lambda = requests/s
arriving at one replica):

    TPOT(B)    = estimate(spec, cluster, Workload(B, context=P + O), tp, pp, ep).latency           [s/token]
                 lab 04's decode step with every sequence at its longest context, the slowest step
                 (vLLM's TPOT: (e2e - TTFT) / (O - 1)); the largest batch with TPOT(B) <= tpot that
                 fits the devices' memory is found by binary search (TPOT only grows with B)
    T_p        = prefill_seconds(P): one prompt through the replica alone, lab 04's roofline for P tokens
                 at once, plus its all-reduces, all-to-alls and stage sends (below)                  [s]
    capacity   = 1 / (T_p / c + (O - 1) TPOT(B) / B)                                             [requests/s]
                 each request costs its replica the prefill (the whole replica, c prompts at a time) and
                 its share of O - 1 decode steps that serve B requests each; prefill and decode share the
                 replica's time, so neither is free. c = 1 here: prompts are prefilled one at a time. That
                 is pessimistic where a prefill is memory-bound (moe-3t's 1024-token prompt: the pass reads
                 every expert for few tokens each): c prompts in one pass cost little more than one until the
                 pass turns compute-bound, and with EP's data-parallel attention each of the ep attention ranks
                 could take its own prompt. Not modelled: batched prefill's queue (bulk service) is not the
                 one below.
    TTFT(lambda) = T_p + W,  W = lambda a / (1 - lambda T_p),  a = (T_p^2 + (O - 1) TPOT^2 / B) / 2     [s]
                 the mean wait of a prompt in the prefill queue: prefill first (vLLM's scheduler runs waiting
                 prompts before decode steps), not preempting a decode step in progress: the M/G/1
                 non-preemptive priority queue (Cobham 1954; Kleinrock, Queueing Systems II, 1976, ch. 3),
                 W = R / (1 - rho_prefill), R = sum over work of rate x E[S^2] / 2 = the mean residual work seen
                 by a Poisson arrival: prompts (rate lambda, S = T_p: M/D/1) and decode steps (rate
                 lambda (O - 1) / B, S = TPOT). Mean, not tail: a p99 target needs more room.
    TPOT seen  = TPOT(B) / (1 - lambda T_p)   the steps stall while other prompts prefill (prefill first)
    max_rate   = the largest lambda with TTFT(lambda) <= ttft, s / (a + s T_p) with s = ttft - T_p, and TPOT
                 seen <= tpot, (1 - TPOT(B) / tpot) / T_p; at most capacity
    B          = the largest batch with TPOT(B) <= tpot, or a halving of it (B / 2, B / 4, ...) when its
                 shorter steps leave room for more requests: the one with the most min(utilization x
                 capacity, max_rate)
    replicas   = ceil(rate / min(utilization x capacity, max_rate))   utilization < 1 leaves room for bursts
    devices    = replicas x tp x pp x ep
    the layout = the one needing the fewest devices for `rate` (ties: the most capacity, then the lower
                 TPOT, then the smaller replica), over TP 1..per_node, PP over the layer counts lab 04's
                 planner tries, EP over the divisors of the expert count, up to max_replica_devices per replica

    router     = cores / (per_request_cpu_s + chunks_per_request x per_chunk_cpu_s)             [requests/s]
                 a router is CPU-bound: parse and forward a request, relay each streamed chunk; `cores` counts
                 router processes (one asyncio loop uses one core). benchmarks/cluster_router.py measures CPU
                 seconds per request (router_cpu_per_request) at its streams' chunk count, not the two costs
                 apart: pass it as per_request_cpu_s with per_chunk_cpu_s=0, or fit the split from runs of
                 different lengths (explore.router_cost). Past that rate requests queue in the router.

What it leaves out, stated so it can be argued with: prefill and decode share each replica, prefill first
(chunked prefill spreads the same work over the steps; disaggregated serving, DistServe and Mooncake, puts it on
other devices); means, not tails; no speculative decoding, no prefix-cache savings on TTFT, KV at the weights'
precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .._checks import check_choice, check_fraction, check_positive, check_positive_int, check_type, fail
from ..parallel import Hardware, LinkModel, Plan, Workload, planner
from ..specs import ModelSpec, device, device_names, model as model_spec, model_names


@dataclass(frozen=True)
class ReplicaPlan:
    """One replica's layout (tp x pp x ep devices) and operating point (module docstring): its batch, decode
    step (tpot, s), prefill alone (ttft, s: T_p), tokens/s (batch / tpot), requests_per_s (capacity) and
    max_rate (requests/s within both targets, queueing and stalls included); `plan` is lab 04's estimate at
    that batch, `output_tokens` the O it was planned for."""
    tp: int
    pp: int
    ep: int
    batch: int
    tpot: float
    ttft: float
    tokens_per_s: float
    requests_per_s: float
    max_rate: float
    output_tokens: int
    plan: Plan

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.ep

    def ttft_at(self, rate: float) -> float:
        """Mean TTFT (s) with `rate` requests/s arriving at this replica: prefill plus its queue's wait (module
        docstring); inf past the rate that saturates the replica (capacity) or its prefill."""
        rate = check_positive("rate", rate, unit="requests/s", allow_zero=True)
        if rate * self.ttft >= 1 or rate > self.requests_per_s:
            return math.inf
        return self.ttft + rate * _residual(self.ttft, self.tpot, self.batch, self.output_tokens) / (
            1 - rate * self.ttft)

    def tpot_at(self, rate: float) -> float:
        """The TPOT (s) a request sees with `rate` requests/s arriving: the decode step stretched by the
        prompts prefilled meanwhile, tpot / (1 - rate T_p) (inf from rate T_p = 1 on)."""
        busy = check_positive("rate", rate, unit="requests/s", allow_zero=True) * self.ttft
        return self.tpot / (1 - busy) if busy < 1 else math.inf

    def __str__(self) -> str:
        return f"TP={self.tp} PP={self.pp} EP={self.ep} ({self.devices} devices), batch {self.batch}"


def _residual(prefill: float, tpot: float, batch: int, output: int) -> float:
    """a = (T_p^2 + (O - 1) TPOT^2 / B) / 2: the mean residual work per arriving request (s^2)."""
    return (prefill ** 2 + (output - 1) * tpot ** 2 / batch) / 2


@dataclass(frozen=True)
class ScalePlan:
    """The answer of replicas_for: `replicas` copies of `replica` serve `rate` requests/s on `devices` devices."""
    model: str
    device: str
    rate: float
    replica: ReplicaPlan
    replicas: int
    devices: int

    @property
    def ttft(self) -> float:
        """Mean TTFT (s) at this load: rate / replicas requests/s on each replica, queueing included."""
        return self.replica.ttft_at(self.rate / self.replicas)

    @property
    def tpot_seen(self) -> float:
        """The TPOT (s) a request sees at this load: the step's, stretched by other prompts' prefills."""
        return self.replica.tpot_at(self.rate / self.replicas)

    def __str__(self) -> str:
        r = self.replica
        return (f"{self.rate:g} req/s of {self.model}: {self.replicas} x [{r}] = {self.devices} {self.device}; "
                f"prefill {r.ttft:.3g} s, TTFT {self.ttft:.3g} s at this load, TPOT {r.tpot:.3g} s, "
                f"{r.max_rate:.3g} req/s per replica within the targets")


def _spec(model) -> ModelSpec:
    if isinstance(model, str):
        return model_spec(check_choice("model", model, model_names()))
    return check_type("model", model, ModelSpec, "a model name or a ModelSpec")


def check_layout(spec: ModelSpec, cluster: Hardware, tp: int, pp: int, ep: int) -> None:
    """Refuse, naming the argument, a layout lab 04's planner refuses (planner.estimate's reason: TP across
    nodes or not dividing the heads, EP not dividing the experts, PP past the layers, more devices than the
    cluster has). Memory is not checked here."""
    plan = planner.estimate(spec, cluster, Workload(1, 1), tp, pp, ep)
    if plan.fits or plan.memory:  # a Plan with a memory breakdown: the layout passed, only memory is short
        return
    name = next((n for prefix, n in (("TP=", "tp"), ("EP=", "ep"), ("PP=", "pp")) if plan.reason.startswith(prefix)),
                "cluster")
    value = {"tp": tp, "ep": ep, "pp": pp, "cluster": cluster}[name]
    fail(name, value, f"a layout lab 04's planner accepts ({plan.reason})")


def _replica_cluster(size: int, per_node: int, device_name: str, intra: str, inter: str) -> Hardware:
    return Hardware(math.ceil(size / per_node), per_node, device_name, intra, inter)


def prefill_seconds(spec: ModelSpec, cluster: Hardware, tp: int, pp: int, ep: int, prompt_tokens: int,
                    dtype_bytes: float = 2) -> float:
    """Seconds to prefill one prompt of P = prompt_tokens tokens on one replica (lab 04's roofline, P tokens at
    once; the busiest device of the largest stage, s = ceil(L / pp) / L of the layers):

        bytes  = (dense / tp + routed / (tp ep)) s x dtype_bytes           every expert: a long prompt picks all
        FLOP   = (2 dense_active P / tp + 2 routed_active P / (tp ep) + 2 P^2 n_heads head_dim L / tp) s
                 (attention is causal: 4 head_dim per head per earlier token, P^2 / 2 pairs)
        time   = pp max(bytes / bandwidth, FLOP / peak) + 2 L all_reduce(P d_model) over tp
                 + 2 moe_layers all_to_all(P d_model k) over ep + (pp - 1) send(P d_model)

    dense / routed: labkit.parallel.planner.weight_params; routed_active = moe_layers k expert_mlp (the k
    experts a token runs); peak: bf16 (fp8 when dtype_bytes < 2). Links as the planner picks them."""
    check_type("spec", spec, ModelSpec)
    check_type("cluster", cluster, Hardware)
    tp, pp, ep = (check_positive_int(n, v) for n, v in (("tp", tp), ("pp", pp), ("ep", ep)))
    p = check_positive_int("prompt_tokens", prompt_tokens, unit="tokens")
    element = check_positive("dtype_bytes", dtype_bytes, unit="bytes")
    check_layout(spec, cluster, tp, pp, ep)
    dev = device(cluster.device)
    stage = math.ceil(spec.n_layers / pp) / spec.n_layers
    dense, routed = planner.weight_params(spec)
    routed_active = spec.moe_layers * spec.experts_per_token * spec.counts()["expert_mlp"]
    dense_active = spec.active_params - routed_active
    read = (dense / tp + routed / (tp * ep)) * stage * element
    attention = 2 * p * p * spec.n_heads * spec.head_dim * spec.n_layers / tp
    flop = (2 * dense_active * p / tp + 2 * routed_active * p / (tp * ep) + attention) * stage
    peak = dev.peak_flops.get("bf16" if element >= 2 else "fp8", max(dev.peak_flops.values()))
    intra, inter = LinkModel.from_spec(cluster.intra), LinkModel.from_spec(cluster.inter)
    hidden = p * spec.d_model * element
    ep_link = intra if tp * ep <= cluster.per_node else inter
    pp_link = intra if tp * ep * pp <= cluster.per_node else inter
    return (pp * max(read / dev.bandwidth, flop / peak)
            + 2 * spec.n_layers * intra.collective("all_reduce", hidden, tp)
            + 2 * spec.moe_layers * ep_link.collective("all_to_all", hidden * spec.experts_per_token, ep)
            + (pp - 1) * pp_link.send(hidden))


def _layouts(spec: ModelSpec, per_node: int, max_devices: int) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) as lab 04's planner enumerates them, up to max_devices per replica."""
    pps = sorted({d for d in range(1, spec.n_layers + 1) if spec.n_layers % d == 0}
                 | {2 ** i for i in range(8) if 2 ** i <= spec.n_layers})
    eps = [d for d in range(1, spec.n_experts + 1) if spec.n_experts % d == 0] if spec.n_experts > 1 else [1]
    return [(tp, pp, ep) for tp in range(1, per_node + 1) for pp in pps for ep in eps if tp * pp * ep <= max_devices]


@lru_cache(maxsize=64)
def _options(spec: ModelSpec, device_name: str, prompt: int, output: int, ttft: float, tpot: float, per_node: int,
             intra: str, inter: str, dtype_bytes: float, max_devices: int, max_batch: int, usable: float,
             utilization: float) -> tuple[tuple[ReplicaPlan, ...], dict]:
    options, closest = [], {"tpot": math.inf, "ttft": math.inf}
    for tp, pp, ep in _layouts(spec, per_node, max_devices):
        cluster = _replica_cluster(tp * pp * ep, per_node, device_name, intra, inter)

        def step(batch: int) -> Plan:
            work = Workload(batch, prompt + output, dtype_bytes, dtype_bytes, dtype_bytes)
            return planner.estimate(spec, cluster, work, tp, pp, ep, usable)
        first = step(1)
        if not first.fits:
            continue
        closest["tpot"] = min(closest["tpot"], first.latency)
        prefill = prefill_seconds(spec, cluster, tp, pp, ep, prompt, dtype_bytes)
        closest["ttft"] = min(closest["ttft"], prefill)
        if first.latency > tpot or prefill >= ttft:
            continue
        low, high = 1, max_batch  # the largest batch that fits and meets tpot: both fail from some batch on
        while low < high:
            mid = (low + high + 1) // 2
            p = step(mid)
            low, high = (mid, high) if p.fits and p.latency <= tpot else (low, mid - 1)
        # the largest batch, or a halving of it when its longer steps make prefill wait more than they serve
        plans = [_operating_point(tp, pp, ep, b, step(b), prefill, ttft, tpot, output)
                 for b in sorted({low >> k for k in range(low.bit_length())})]
        chosen = max(plans, key=lambda r: (min(utilization * r.requests_per_s, r.max_rate), r.batch))
        if chosen.max_rate > 0:
            options.append(chosen)
    return tuple(options), closest


def _operating_point(tp: int, pp: int, ep: int, batch: int, plan: Plan, prefill: float, ttft: float, tpot: float,
                     output: int) -> ReplicaPlan:
    capacity = 1 / (prefill + (output - 1) * plan.latency / batch)  # replica seconds per request, inverted
    slack = ttft - prefill  # what the queue may add: rate a / (1 - rate T_p) <= slack
    ttft_rate = slack / (_residual(prefill, plan.latency, batch, output) + slack * prefill)
    tpot_rate = (1 - plan.latency / tpot) / prefill  # prefills stretch the steps: TPOT / (1 - rate T_p) <= tpot
    max_rate = min(capacity, ttft_rate, tpot_rate)
    return ReplicaPlan(tp, pp, ep, batch, plan.latency, prefill, batch / plan.latency, capacity, max_rate, output,
                       plan)


def replica_options(model="moe-3t", device_name: str = "h100-sxm", prompt_tokens: int = 1024,
                    output_tokens: int = 256, ttft: float = 2.0, tpot: float = 0.05, per_node: int = 8,
                    intra: str = "nvlink4", inter: str = "ib-ndr-400", dtype_bytes: float = 2,
                    max_replica_devices: int = 256, max_batch: int = 4096, usable: float = 0.9,
                    utilization: float = 0.8) -> list[ReplicaPlan]:
    """Every layout of up to max_replica_devices devices that meets both targets (ttft, tpot in seconds) at
    some batch, each at the batch that carries the most requests/s at `utilization` within the TTFT target:
    the largest batch meeting tpot (module docstring), or a halving of it (B/2, B/4, ...) where the shorter
    steps make prompts wait less; most requests/s per device first. A ValueError naming the target no layout
    meets, with the best any layout reaches, when there is none."""
    spec = _spec(model)
    check_type("device_name", device_name, str, "a device name of data/hardware.json")
    check_choice("device_name", device_name, sorted(device_names()))
    for name, link in (("intra", intra), ("inter", inter)):  # unknown link names say so here
        check_choice(name, check_type(name, link, str), sorted(device_names("link")))
    if not device(device_name).peak_flops:
        fail("device_name", device_name, "a device that computes (a GPU of data/hardware.json)")
    args = (spec, device_name, check_positive_int("prompt_tokens", prompt_tokens, unit="tokens"),
            check_positive_int("output_tokens", output_tokens, unit="tokens"),
            check_positive("ttft", ttft, unit="s"), check_positive("tpot", tpot, unit="s"),
            check_positive_int("per_node", per_node), check_type("intra", intra, str),
            check_type("inter", inter, str), check_positive("dtype_bytes", dtype_bytes, unit="bytes"),
            check_positive_int("max_replica_devices", max_replica_devices),
            check_positive_int("max_batch", max_batch, unit="sequences"), check_fraction("usable", usable),
            check_fraction("utilization", utilization))
    options, closest = _options(*args)
    if not options:
        if math.isinf(closest["tpot"]):
            fail("max_replica_devices", max_replica_devices, f"enough devices to hold {spec.name} in one replica")
        name = "tpot" if closest["tpot"] > tpot else "ttft"
        value = tpot if name == "tpot" else ttft
        fail(name, value, f"a target some layout meets (the best of any layout up to {max_replica_devices} "
                          f"devices: {closest[name]:.3g} s; the other target may rule out that one)")
    return sorted(options, key=lambda o: (-o.requests_per_s / o.devices, o.devices, o.tpot))


def replicas_needed(rate: float, replica: ReplicaPlan, utilization: float = 0.8) -> int:
    """ceil(rate / min(utilization x replica.requests_per_s, replica.max_rate)): copies of `replica` that serve
    `rate` requests/s with each one below `utilization` of its capacity and its mean TTFT within the target."""
    rate = check_positive("rate", rate, unit="requests/s")
    check_type("replica", replica, ReplicaPlan)
    per_replica = min(check_fraction("utilization", utilization) * replica.requests_per_s, replica.max_rate)
    return math.ceil(rate / per_replica)


def replicas_for(rate: float, model="moe-3t", device_name: str = "h100-sxm", prompt_tokens: int = 1024,
                 output_tokens: int = 256, ttft: float = 2.0, tpot: float = 0.05, utilization: float = 0.8,
                 **search) -> ScalePlan:
    """The fewest devices that serve `rate` requests/s of `model` on `device_name` GPUs within ttft and tpot
    (seconds): which layout, at which batch, how many replicas (module docstring). `search`: the other
    keywords of replica_options (per_node, intra, inter, dtype_bytes, max_replica_devices, max_batch, usable)."""
    rate = check_positive("rate", rate, unit="requests/s")
    check_fraction("utilization", utilization)
    options = replica_options(model, device_name, prompt_tokens, output_tokens, ttft, tpot, utilization=utilization,
                              **search)
    counted = [(replicas_needed(rate, o, utilization), o) for o in options]
    n, best = min(counted, key=lambda c: (c[0] * c[1].devices, -c[0] * c[1].requests_per_s, c[1].tpot, c[1].devices,
                                           c[1].tp, c[1].pp))
    return ScalePlan(_spec(model).name, device_name, rate, best, n, n * best.devices)


def router_limit(per_request_cpu_s: float, per_chunk_cpu_s: float, chunks_per_request: float,
                 cores: int = 1) -> float:
    """Requests/s `cores` router processes sustain (one asyncio event loop each, so one core each: a single
    router process gets no faster on more cores) when each request costs per_request_cpu_s CPU seconds
    (parse, choose, connect, forward, answer) and each of its chunks_per_request streamed chunks
    per_chunk_cpu_s more (read from the replica, write to the client):
    cores / (per_request_cpu_s + chunks_per_request x per_chunk_cpu_s). Its chunks/s is that times
    chunks_per_request."""
    per_request = check_positive("per_request_cpu_s", per_request_cpu_s, unit="CPU s", allow_zero=True)
    per_chunk = check_positive("per_chunk_cpu_s", per_chunk_cpu_s, unit="CPU s", allow_zero=True)
    chunks = check_positive("chunks_per_request", chunks_per_request, unit="chunks", allow_zero=True)
    cost = per_request + chunks * per_chunk
    if cost == 0:
        fail("per_request_cpu_s", per_request_cpu_s, "a positive cost, or per_chunk_cpu_s and chunks_per_request")
    return check_positive_int("cores", cores) / cost
