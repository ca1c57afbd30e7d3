"""Layer offloading: which layers stay on the accelerator, and what the rest costs (notebook 02, section 7;
notebook 01 computes the same step time with roofline.offload_time, and sweeps it in transfer.py).

`plan_device_map` places layers in order on the devices of `max_memory` (e.g. gpu, then cpu, then disk),
the way accelerate's `infer_auto_device_map` does: on the first device it keeps room for the largest layer
that ends up offloaded, because an offloaded layer is copied onto the first device to run.

    layers  L0 L1 L2 L3 L4 L5 L6 L7          gpu: [L0 L1 L2 | room for max(L3..L7)]
            gpu      | cpu       | disk       cpu: [L3 L4 L5]   disk: [L6 L7]

`ngl_curve` is the llama.cpp `-ngl N` picture, with llama.cpp's rule (src/llama-model.cpp,
`i_gpu_start = n_layer - n_gpu_layers`): the LAST N repeating layers go to the device; the input
embedding always stays in host memory (a token reads one row of it); the output layer (final norm + LM
head) goes to the device only when N > n_layer. Time per token from roofline.offload_time
(stream: offloaded weights cross the link every token; split: the host computes its layers).

    N = 2 of 4:   embed | L0 L1 | L2 L3 | output        host: embed (1 row), L0, L1, output
                  host    host    device  host          device: L2, L3
    N = 5:        embed on the host, everything else on the device
"""

from __future__ import annotations

from .roofline import offload_time
from .._checks import check_number, check_positive_int, check_type, fail


def _byte_counts(name: str, sizes: dict | list, keys: bool) -> None:
    """A non-empty dict (keys=True) or list of non-negative ints, each checked under its own name."""
    check_type(name, sizes, dict if keys else (list, tuple), "a dict" if keys else "a list")
    if not sizes:
        fail(name, sizes, f"a non-empty {'dict' if keys else 'list'} of byte counts")
    for k, v in (sizes.items() if keys else enumerate(sizes)):
        check_positive_int(f"{name}[{k!r}]", v, unit="bytes", allow_zero=True)


def plan_device_map(layer_bytes: dict[str, int], max_memory: dict[str, int]) -> dict[str, str]:
    """layer name -> device name. Layers keep their order; each device is filled before the next. On the
    first device, room for the largest layer placed elsewhere is kept free. ValueError if they do not fit."""
    _byte_counts("layer_bytes", layer_bytes, keys=True)
    _byte_counts("max_memory", max_memory, keys=True)
    names, sizes = list(layer_bytes), list(layer_bytes.values())
    devices, caps = list(max_memory), list(max_memory.values())
    # first device: the longest prefix that fits together with the largest layer after it
    k = 0
    for j in range(len(names), -1, -1):
        reserve = max(sizes[j:], default=0) if len(devices) > 1 else 0
        if sum(sizes[:j]) + reserve <= caps[0]:
            k = j
            break
    plan = {n: devices[0] for n in names[:k]}
    dev, used = 1, 0
    for n, s in zip(names[k:], sizes[k:]):
        while dev < len(devices) and used + s > caps[dev]:
            dev, used = dev + 1, 0
        if dev == len(devices):
            raise ValueError(f"layer {n!r} ({s} bytes) does not fit: max_memory {max_memory} is too small")
        plan[n] = devices[dev]
        used += s
    return plan


def ngl_curve(layer_bytes: list[int], device_bandwidth: float, link_bandwidth: float,
              host_bandwidth: float | None = None, mode: str = "stream", output_bytes: int = 0,
              embedding_row_bytes: int = 0) -> list[dict]:
    """llama.cpp's `-ngl N` for N = 0 .. n_layer + 1 (see the module doc). layer_bytes: the n_layer repeating
    layers in order (bytes); output_bytes: final norm + LM head; embedding_row_bytes: the one embedding row a
    token reads (the embedding stays in host memory, so this row always counts as offloaded bytes).
    One dict per N with "k" (= N), "resident_bytes", "offloaded_bytes" and offload_time's "time_s",
    "transfer_s", "transfer_share", ..."""
    _byte_counts("layer_bytes", layer_bytes, keys=False)
    for name, v in (("output_bytes", output_bytes), ("embedding_row_bytes", embedding_row_bytes)):
        check_positive_int(name, v, unit="bytes", allow_zero=True)
    # the settings offload_time checks, checked once before the curve is built
    offload_time(1, 1, device_bandwidth, link_bandwidth, host_bandwidth, mode)
    n_layer, out = len(layer_bytes), []
    total = sum(layer_bytes) + output_bytes + embedding_row_bytes
    for k in range(n_layer + 2):
        resident = sum(layer_bytes[n_layer - min(k, n_layer):]) + (output_bytes if k > n_layer else 0)
        t = offload_time(resident, total - resident, device_bandwidth, link_bandwidth, host_bandwidth, mode)
        out.append({"k": k, "resident_bytes": resident, "offloaded_bytes": total - resident, **t})
    return out


def share_range(curve: list[dict], low: float = 0.3, high: float = 0.5) -> list[int]:
    """The k of a ngl_curve whose transfer share lies in [low, high] (the "30-50%" claim's window)."""
    check_type("curve", curve, list, "a list (from ngl_curve)")
    if not all(isinstance(c, dict) and {"k", "transfer_share"} <= set(c) for c in curve):
        fail("curve", curve, "a list of dicts with 'k' and 'transfer_share' (from ngl_curve)", TypeError)
    low = check_number("low", low, 0, 1)
    high = check_number("high", high, 0, 1)
    if low > high:
        fail("high", high, f">= low ({low:g})")
    return [c["k"] for c in curve if low <= c["transfer_share"] <= high]
