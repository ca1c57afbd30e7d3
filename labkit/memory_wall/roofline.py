"""The memory wall in formulas: weight and KV-cache bytes, the roofline, decode ceilings, offloading.

Used by notebook 01_memory_wall (and by 02 and 03, which place their own numbers on the same roofline).
Units: bytes, bytes/s, FLOP, FLOP/s, seconds. GB = 1e9 bytes, GiB = 2**30 bytes.

The roofline (Williams, Waterman and Patterson, "Roofline: an insightful visual performance model",
CACM 2009): a kernel that does `F` FLOP while moving `B` bytes has arithmetic intensity `I = F / B`
(FLOP/byte) and can run at most at

    attainable(I) = min(peak_flops, I * bandwidth)

       FLOP/s ^            ______________ peak_flops       compute-bound: right of the ridge
              |          /
              |        /   slope = bandwidth               memory-bound: left of the ridge
              |      /
              +----+-------------------->  I (FLOP/byte)
                 ridge = peak_flops / bandwidth
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np

from ..specs import kv_bytes_per_token  # noqa: F401  (part of this API)


def _positive(name: str, value, allow_zero: bool = False) -> float:
    """`value` as a float, or a ValueError/TypeError that names the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    x = float(value)
    if math.isnan(x) or math.isinf(x) or x < 0 or (x == 0 and not allow_zero):
        expected = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return x


def weight_bytes(n_params: float, bits_per_weight: float) -> float:
    """Bytes to store `n_params` weights at `bits_per_weight` bits each (4.5 for INT4 with an fp16 scale per
    32 weights, like llama.cpp's Q4_0). Bits must lie in (0, 32]."""
    n = _positive("n_params", n_params)
    bits = _positive("bits_per_weight", bits_per_weight)
    if bits > 32:
        raise ValueError(f"bits_per_weight must be in (0, 32], got {bits_per_weight!r}")
    return n * bits / 8


def decode_ceiling(bytes_per_token: float, bandwidth: float) -> float:
    """Upper bound on decoding speed in tokens/s when every token must read `bytes_per_token` bytes
    (all active weights, plus the KV cache read so far) through memory of `bandwidth` bytes/s."""
    return _positive("bandwidth", bandwidth) / _positive("bytes_per_token", bytes_per_token)


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: min(peak_flops, intensity * bandwidth) in FLOP/s, for an arithmetic intensity in
    FLOP/byte. `intensity` may be a number (returns a float) or an array of positive numbers (returns an
    array), for plotting."""
    peak = _positive("peak_flops", peak_flops)
    bw = _positive("bandwidth", bandwidth)
    if isinstance(intensity, (np.ndarray, list, tuple)):
        arr = np.asarray(intensity, dtype=np.float64)
        if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"intensity must hold finite numbers > 0, got {intensity!r}")
        return np.minimum(peak, arr * bw)
    return min(peak, _positive("intensity", intensity) * bw)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity in FLOP/byte where a device turns from memory-bound to compute-bound."""
    return _positive("peak_flops", peak_flops) / _positive("bandwidth", bandwidth)


def matmul_intensity(m: int, n: int, k: int, bytes_per_element: float = 2) -> float:
    """FLOP/byte of y[m, n] = x[m, k] @ w[k, n] when each operand is read once and y written once:
    2mnk / ((mk + kn + mn) * bytes_per_element). Decoding one token is m = batch size: about m FLOP/byte
    at 2 bytes per weight, far left of every ridge point."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    b = _positive("bytes_per_element", bytes_per_element)
    return 2 * m * n * k / ((m * k + k * n + m * n) * b)


def offload_time(resident_bytes: float, offloaded_bytes: float, device_bandwidth: float,
                 link_bandwidth: float | None, host_bandwidth: float | None = None, mode: str = "stream", *,
                 flops: float = 0.0, peak_flops: float | None = None) -> dict:
    """Time of one forward step (seconds) when part of the weights does not fit on the device.

    Resident weights are read at `device_bandwidth`. The offloaded ones either
      - cross the link (PCIe, NVLink) on every step and are then used on the device (mode="stream", as in
        accelerate's CPU offload or FlexGen; reading them again on the device is counted too), or
      - are used where they live, read at `host_bandwidth` by the host (mode="split", as llama.cpp does for
        the layers that `-ngl` leaves on the CPU; only a few KB of activations cross the link, so
        `link_bandwidth` is not used and may be None).
    A step that does `flops` FLOP (2 x parameters x tokens for a prefill) on a device of `peak_flops` FLOP/s
    takes at least flops / peak_flops there: the device's part is the longer of its memory time and its
    compute time (for mode="split" the device does the resident share of the FLOP; the host's time counts
    memory only). Transfers do not overlap with computing. Returns {"time_s", "device_s", "transfer_s",
    "host_s", "transfer_share"}, the share being transfer_s / time_s."""
    resident = _positive("resident_bytes", resident_bytes, allow_zero=True)
    offloaded = _positive("offloaded_bytes", offloaded_bytes, allow_zero=True)
    if resident + offloaded == 0:
        raise ValueError("resident_bytes + offloaded_bytes must be > 0, got 0 and 0")
    dev_bw = _positive("device_bandwidth", device_bandwidth)
    work = _positive("flops", flops, allow_zero=True)
    if work and peak_flops is None:
        raise ValueError("peak_flops is required when flops > 0, got None")
    compute_s = work / _positive("peak_flops", peak_flops) if work else 0.0
    if mode == "stream":
        if link_bandwidth is None:
            raise ValueError("link_bandwidth is required when mode='stream', got None")
        transfer_s = offloaded / _positive("link_bandwidth", link_bandwidth)
        device_s, host_s = max((resident + offloaded) / dev_bw, compute_s), 0.0
    elif mode == "split":
        if host_bandwidth is None:
            raise ValueError("host_bandwidth is required when mode='split', got None")
        host_s = offloaded / _positive("host_bandwidth", host_bandwidth)
        device_s = max(resident / dev_bw, compute_s * resident / (resident + offloaded))
        transfer_s = 0.0
    else:
        raise ValueError(f"mode must be 'stream' or 'split', got {mode!r}")
    total = device_s + transfer_s + host_s
    return {"time_s": total, "device_s": device_s, "transfer_s": transfer_s, "host_s": host_s,
            "transfer_share": transfer_s / total}


def plot_roofline(ceilings: Sequence[tuple], points: Sequence[tuple] = (), ax=None,
                  intensity_range: tuple[float, float] = (0.05, 2000.0)):
    """Log-log roofline plot. `ceilings`: (label, peak_flops, bandwidth) per device; `points`:
    (label, intensity, flops_per_s) per measured or modelled kernel. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if not ceilings:
        raise ValueError("ceilings must name at least one (label, peak_flops, bandwidth), got none")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    x = np.geomspace(*intensity_range, 200)
    for label, peak, bw in ceilings:
        ax.loglog(x, attainable_flops(x, peak, bw), label=label)
    for label, intensity, flops in points:
        ax.loglog([_positive("intensity", intensity)], [_positive("flops_per_s", flops)], "o")
        ax.annotate(label, (intensity, flops), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax
