"""The memory wall in formulas: weight bytes, the roofline, decode ceilings, the time of an offloaded step.

Used by notebook 01_memory_wall (and by 02 and 03, which place their own numbers on the same roofline).
Units: bytes, bytes/s, FLOP, FLOP/s, seconds. GB = 1e9 bytes, GiB = 2**30 bytes. (KV-cache bytes per token
are a property of the architecture: labkit.specs.kv_bytes_per_token.)

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
from typing import Sequence

import numpy as np

from .._checks import check_choice, check_number, check_positive, check_positive_int, fail


def weight_bytes(n_params: float, bits_per_weight: float) -> float:
    """Bytes to store `n_params` weights at `bits_per_weight` bits each (4.5 for INT4 with an fp16 scale per
    32 weights, like llama.cpp's Q4_0). Bits must lie in (0, 32]."""
    n = check_positive("n_params", n_params)
    bits = check_number("bits_per_weight", bits_per_weight, 0, 32, low_open=True, unit="bits")
    return n * bits / 8


def decode_ceiling(bytes_per_token: float, bandwidth: float) -> float:
    """Upper bound on decoding speed in tokens/s when every token must read `bytes_per_token` bytes
    (all active weights, plus the KV cache read so far) through memory of `bandwidth` bytes/s. Both are at
    least 1 (a token reads at least a byte; a memory moves at least a byte a second), so the ceiling is
    always a finite number > 0: 1e-300 bytes per token is refused, not answered with inf."""
    bw = check_number("bandwidth", bandwidth, low=1, unit="bytes/s")
    return bw / check_number("bytes_per_token", bytes_per_token, low=1, unit="bytes")


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: min(peak_flops, intensity * bandwidth) in FLOP/s, for an arithmetic intensity in
    FLOP/byte. `intensity` may be a number (returns a float) or an array of positive numbers (returns an
    array), for plotting. Reference of notebook 01's second exercise (for one intensity)."""
    peak = check_positive("peak_flops", peak_flops, unit="FLOP/s")
    bw = check_positive("bandwidth", bandwidth, unit="bytes/s")
    if isinstance(intensity, (np.ndarray, list, tuple)):
        arr = np.asarray(intensity)
        if arr.dtype.kind not in "iuf":
            fail("intensity", intensity, "an array of numbers (FLOP/byte)", TypeError)
        if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            fail("intensity", intensity, "a non-empty array of finite numbers > 0 (FLOP/byte)")
        return np.minimum(peak, arr.astype(np.float64) * bw)
    return min(peak, check_positive("intensity", intensity, unit="FLOP/byte") * bw)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity in FLOP/byte where a device turns from memory-bound to compute-bound."""
    peak = check_positive("peak_flops", peak_flops, unit="FLOP/s")
    bw = check_positive("bandwidth", bandwidth, unit="bytes/s")
    ridge = peak / bw
    if not (0 < ridge < math.inf):  # e.g. 1e15 FLOP/s over 1e-300 bytes/s
        raise ValueError(f"peak_flops / bandwidth must be a finite ratio > 0 (FLOP/byte), got {peak!r} / {bw!r}")
    return ridge


def matmul_intensity(m: int, n: int, k: int, bytes_per_element: float = 2) -> float:
    """FLOP/byte of y[m, n] = x[m, k] @ w[k, n] when each operand is read once and y written once:
    2mnk / ((mk + kn + mn) * bytes_per_element). Decoding one token is m = batch size: about m FLOP/byte
    at 2 bytes per weight, far left of every ridge point."""
    m, n, k = (check_positive_int(name, v) for name, v in (("m", m), ("n", n), ("k", k)))
    b = check_number("bytes_per_element", bytes_per_element, low=1 / 8, unit="bytes, at least one bit")
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
    check_choice("mode", mode, ("stream", "split"))
    resident = check_positive("resident_bytes", resident_bytes, unit="bytes", allow_zero=True)
    offloaded = check_positive("offloaded_bytes", offloaded_bytes, unit="bytes", allow_zero=True)
    if resident + offloaded == 0:
        raise ValueError("resident_bytes + offloaded_bytes must be > 0, got 0 and 0")
    dev_bw = check_positive("device_bandwidth", device_bandwidth, unit="bytes/s")
    # a bandwidth the mode does not use is still checked when given: a typo must not pass unnoticed
    link_bw, host_bw = (None if v is None else check_positive(name, v, unit="bytes/s")
                        for name, v in (("link_bandwidth", link_bandwidth), ("host_bandwidth", host_bandwidth)))
    work = check_positive("flops", flops, unit="FLOP", allow_zero=True)
    if peak_flops is None and work:
        raise ValueError("peak_flops is required when flops > 0, got None")
    peak = None if peak_flops is None else check_positive("peak_flops", peak_flops, unit="FLOP/s")
    compute_s = work / peak if work else 0.0
    if mode == "stream":
        if link_bw is None:
            raise ValueError("link_bandwidth is required when mode='stream', got None")
        transfer_s = offloaded / link_bw
        device_s, host_s = max((resident + offloaded) / dev_bw, compute_s), 0.0
    else:
        if host_bw is None:
            raise ValueError("host_bandwidth is required when mode='split', got None")
        host_s = offloaded / host_bw
        device_s = max(resident / dev_bw, compute_s * resident / (resident + offloaded))
        transfer_s = 0.0
    total = device_s + transfer_s + host_s
    if not (0 < total < math.inf):  # bytes and bandwidths so far apart that the time over- or underflows
        fail("the bytes and bandwidths", total, "such that the step takes a finite time > 0 seconds (resident_bytes="
             f"{resident!r}, offloaded_bytes={offloaded!r}, device_bandwidth={dev_bw!r}, link_bandwidth={link_bw!r}, "
             f"host_bandwidth={host_bw!r}); the step time in seconds")
    return {"time_s": total, "device_s": device_s, "transfer_s": transfer_s, "host_s": host_s,
            "transfer_share": transfer_s / total}


def plot_roofline(ceilings: Sequence[tuple], points: Sequence[tuple] = (), ax=None,
                  intensity_range: tuple[float, float] = (0.05, 2000.0)):
    """Log-log roofline plot. `ceilings`: (label, peak_flops, bandwidth) per device; `points`:
    (label, intensity, flops_per_s) per measured or modelled kernel. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    for what, rows in (("ceilings", ceilings), ("points", points)):
        if isinstance(rows, str) or not isinstance(rows, Sequence) \
                or not all(isinstance(r, (tuple, list)) and len(r) == 3 for r in rows):
            fail(what, rows, "a list of (label, number, number) triples", TypeError)
    if not ceilings:
        raise ValueError("ceilings must name at least one (label, peak_flops, bandwidth), got none")
    if not isinstance(intensity_range, (tuple, list)) or len(intensity_range) != 2:
        fail("intensity_range", intensity_range, "a (low, high) pair of FLOP/byte", TypeError)
    low, high = (check_positive("intensity_range", v, unit="FLOP/byte") for v in intensity_range)
    if low >= high:
        fail("intensity_range", intensity_range, "(low, high) with low < high")
    for label, peak, bw in ceilings:  # all checked before anything is drawn
        ridge_point(peak, bw)
    for label, intensity, flops in points:
        check_positive("intensity", intensity, unit="FLOP/byte")
        check_positive("flops_per_s", flops, unit="FLOP/s")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    x = np.geomspace(low, high, 200)
    for label, peak, bw in ceilings:
        ax.loglog(x, attainable_flops(x, peak, bw), label=label)
    for label, intensity, flops in points:
        ax.loglog([intensity], [flops], "o")
        ax.annotate(label, (intensity, flops), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax
