"""Where "data transfers between CPU and GPU account for 30-50% of total inference time" holds: a sweep of
the configurations that decide it (notebook 01, section 5 and its fact-check).

One step of a model whose last `offloaded` layers live in host memory and are streamed over a link to the
GPU at every step (roofline.offload_time, mode "stream": copied, then read on the GPU like the rest):

    step time = device part + link part
      device part = max(all weights + KV cache read at the GPU's bandwidth, FLOP / peak FLOP/s)
      link part   = offloaded layers' bytes / link bandwidth            (no overlap with compute)
    share       = link part / step time

    phase "decode":  `tokens` sequences (the batch) of `context` cached tokens each make one token:
                     the weights are read once, every sequence's KV cache once (decode_flops_per_step)
    phase "prefill": one prompt of `tokens` tokens: 2 x parameters x tokens FLOP, compute-bound

A configuration is *possible* only when what stays on the GPU fits in its memory: the resident layers,
one more layer's worth of room for the layer being streamed in (accelerate keeps the same room, see
offload.plan_device_map), the KV cache and the step's activations. An H100 (80 GB) cannot keep 79 of
Llama-2-70B's 80 BF16 layers (136 GB): the share "one layer offloaded" would give it is arithmetic, not a
setting anyone can run. `sweep` computes both, `region` says where the claim holds, possible or not.

Layers are equal: the model's weights (embeddings included) spread evenly over its n_layers. Devices and
links are labkit.specs presets; "GH200-style" is an H200 fed by its CPU over NVLink-C2C (450 GB/s each
way). Units: bytes, bytes/s, FLOP, FLOP/s, seconds, fractions of a step's time.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .footprint import activation_bytes, bits_of, decode_flops_per_step
from .roofline import offload_time, weight_bytes
from .._checks import check_choice, check_fraction, check_int, check_positive_int, check_type, fail
from ..specs import DeviceSpec, ModelSpec, device, device_names

BAND = (0.3, 0.5)  # the claim's "30-50%"
GPUS = ("h100-sxm", "h200")
LINKS = ("pcie4-x16", "pcie5-x16", "nvlink-c2c")
PHASES = ("decode", "prefill")
# label -> (phase, tokens): the batch of a decode step, or the length of a prompt
WORKLOADS = {"decode, batch 1": ("decode", 1), "decode, batch 8": ("decode", 8), "decode, batch 32": ("decode", 32),
             "prefill, 2,048 tokens": ("prefill", 2048), "prefill, 8,192 tokens": ("prefill", 8192)}


def setting(gpu: str, link: str) -> str:
    """How tables and plots name a GPU fed over a link: "h200 + pcie5-x16", "h200 + nvlink-c2c (GH200-style)"."""
    return f"{gpu} + {link}" + (" (GH200-style)" if (gpu, link) == ("h200", "nvlink-c2c") else "")


def _device(arg: str, name: str, kind: str) -> DeviceSpec:
    """The labkit.specs preset `name`, which must be of `kind` ("gpu" or "link")."""
    spec = device(name)  # refuses what is not a preset's name
    if spec.kind != kind:
        fail(arg, name, f"a {kind} preset, one of {device_names(kind)}")
    return spec


def step(spec: ModelSpec, gpu: str, link: str, offloaded: int, phase: str = "decode", tokens: int = 1,
         context: int = 4096, precision: str | float = "bf16") -> dict:
    """One step of `spec` on `gpu` with its last `offloaded` layers streamed over `link` (see the module doc).
    Returns offload_time's {"time_s", "device_s", "transfer_s", "host_s", "transfer_share"} plus
    "on_gpu_bytes" (what must stay on the GPU), "fits" (whether it does) and "kv_bytes" (the KV cache)."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    g, ln = _device("gpu", gpu, "gpu"), _device("link", link, "link")
    k = check_int("offloaded", offloaded, 0, spec.n_layers, unit="layers")
    check_choice("phase", phase, PHASES)
    tokens = check_positive_int("tokens", tokens, unit="sequences (decode) or prompt tokens (prefill)")
    context = check_positive_int("context", context, unit="tokens")
    layer = weight_bytes(spec.n_params, bits_of(precision)) / spec.n_layers
    if phase == "decode":
        kv = tokens * context * spec.kv_bytes_per_token()
        flops, activations = decode_flops_per_step(spec, tokens, context), activation_bytes(spec, tokens, 1)
        read_on_gpu = kv  # every sequence's KV cache is read once per step, beside the weights
    else:
        kv = tokens * spec.kv_bytes_per_token()  # written, not read: the prompt's own keys and values
        flops, activations, read_on_gpu = 2 * spec.n_params * tokens, activation_bytes(spec, 1, tokens), 0
    t = offload_time((spec.n_layers - k) * layer + read_on_gpu, k * layer, g.bandwidth, ln.bandwidth,
                     flops=flops, peak_flops=g.peak_flops["bf16"])
    on_gpu = (spec.n_layers - k + (1 if k else 0)) * layer + kv + activations
    return {**t, "on_gpu_bytes": on_gpu, "fits": on_gpu <= g.memory_bytes, "kv_bytes": kv}


def _names(name: str, values) -> tuple:
    if isinstance(values, str) or not isinstance(values, Sequence):
        fail(name, values, "a list of preset names", TypeError)
    if not values:
        fail(name, values, "a non-empty list of preset names")
    return tuple(values)


def sweep(spec: ModelSpec, gpus: Sequence[str] = GPUS, links: Sequence[str] = LINKS,
          workloads: Mapping[str, tuple[str, int]] | None = None, context: int = 4096,
          precision: str | float = "bf16") -> list[dict]:
    """Every (gpu, link, workload, layers offloaded 0..n_layers): one row with "gpu", "link", "workload",
    "offloaded", "share" (the link's share of the step), "fits" and "time_s" (step() for each)."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    workloads = dict(WORKLOADS if workloads is None else check_type("workloads", workloads, Mapping,
                                                                   "a dict of label -> (phase, tokens)"))
    if not workloads:
        fail("workloads", workloads, "a non-empty dict of label -> (phase, tokens)")
    for label, w in workloads.items():
        if not isinstance(w, tuple) or len(w) != 2:
            fail(f"workloads[{label!r}]", w, "a (phase, tokens) pair", TypeError)
    rows = []
    for gpu in _names("gpus", gpus):
        for link in _names("links", links):
            for label, (phase, tokens) in workloads.items():
                for k in range(spec.n_layers + 1):
                    s = step(spec, gpu, link, k, phase, tokens, context, precision)
                    rows.append({"gpu": gpu, "link": link, "workload": label, "offloaded": k,
                                 "share": s["transfer_share"], "fits": s["fits"], "time_s": s["time_s"]})
    return rows


def check_band(band) -> tuple[float, float]:
    """A (low, high) pair of fractions with low <= high, such as the claim's (0.3, 0.5); refused otherwise."""
    if not isinstance(band, (tuple, list)) or len(band) != 2:
        fail("band", band, "a (low, high) pair of fractions", TypeError)
    low, high = (check_fraction("band", v, allow_zero=True) for v in band)
    if low > high:
        fail("band", band, "(low, high) with low <= high")
    return low, high


def _span(ks: list[int]) -> str:
    return "-" if not ks else f"{ks[0]}" if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"


def region(rows: list[dict], band: tuple[float, float] = BAND) -> list[dict]:
    """Per (gpu, link, workload) of a sweep: "fewest" (the fewest layers that must be offloaded for the rest
    to fit; None when nothing fits), "share_then" (the share at that point), "in_band" (layers offloaded whose
    share lies in `band`, as "a-b"; "-" for none) and "in_band_possible" (those of them that fit), with
    "holds" = whether any possible configuration lies in the band. Shares rise with every layer offloaded,
    so each set of layers is one interval."""
    check_type("rows", rows, list, "a list of rows from sweep()")
    need = {"gpu", "link", "workload", "offloaded", "share", "fits"}
    if not rows or not all(isinstance(r, dict) and need <= set(r) for r in rows):
        fail("rows", rows, f"a non-empty list of rows from sweep() (dicts with {sorted(need)})")
    low, high = check_band(band)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["gpu"], r["link"], r["workload"]), []).append(r)
    out = []
    for (gpu, link, workload), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["offloaded"])
        fitting = [r for r in rs if r["fits"]]
        inside = [r["offloaded"] for r in rs if low <= r["share"] <= high]
        possible = [r["offloaded"] for r in fitting if low <= r["share"] <= high]
        out.append({"gpu": gpu, "link": link, "workload": workload,
                    "fewest": fitting[0]["offloaded"] if fitting else None,
                    "share_then": fitting[0]["share"] if fitting else None,
                    "in_band": _span(inside), "in_band_possible": _span(possible), "holds": bool(possible)})
    return out
