"""Out of blocks (notebook 05, section 7): when the pool is full, a running sequence is preempted, and either its
blocks are swapped to a host pool and back, or dropped and its tokens recomputed later (vLLM, Kwon et al.,
SOSP 2023, section 4.5 and Fig. 19). Seconds, bytes, FLOP.

    swap       2 x blocks x (latency + block_bytes / link bandwidth)       out to the host, later back in,
                                                                            one transfer per block
    recompute  2 x active parameters x tokens / (peak FLOP/s x utilization)  one prefill of every token again

The link is lab 02's model (labkit.unified_memory.UMConfig: 25 GB/s, what PCIe 4.0 x16 gives in practice);
each block is one transfer with `latency` seconds of fixed cost (10 us: a DMA launch, an assumption), which is
why small blocks swap slowly. Recompute uses the device's spec-sheet BF16 peak at `utilization` 0.5 (a prefill
is compute-bound) and counts only the weight matmuls (attention FLOP add a little for long sequences).
"""

from __future__ import annotations

from .._checks import check_fraction, check_positive, check_positive_int, check_type
from ..specs import ModelSpec, device
from ..unified_memory import UMConfig
from .blocks import blocks_needed, check_block_size

LINK_BANDWIDTH = UMConfig(device_bytes=4096, host_bytes=0).link_bandwidth  # bytes/s, lab 02's default link
TRANSFER_LATENCY = 10e-6  # seconds of fixed cost per block transfer (assumption)


def swap_seconds(spec: ModelSpec, n_tokens: int, block_size: int, bandwidth: float = LINK_BANDWIDTH,
                 latency: float = TRANSFER_LATENCY, bytes_per_element: float = 2) -> float:
    """Seconds to swap a sequence of `n_tokens` out to host memory and back in, one transfer per block."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    blocks = blocks_needed(check_positive_int("n_tokens", n_tokens), check_block_size(block_size))
    block_bytes = spec.kv_bytes_per_token(bytes_per_element) * block_size
    return 2 * blocks * (check_positive("latency", latency, allow_zero=True)
                         + block_bytes / check_positive("bandwidth", bandwidth))


def recompute_seconds(spec: ModelSpec, n_tokens: int, device_name: str = "a100-80gb",
                      utilization: float = 0.5) -> float:
    """Seconds to recompute the keys and values of `n_tokens` tokens by one prefill on `device_name`."""
    check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec")
    check_positive_int("n_tokens", n_tokens)
    peak = device(device_name).peak_flops.get("bf16")
    if peak is None:
        raise ValueError(f"device_name must be a device with a BF16 peak in data/hardware.json, got {device_name!r}")
    return 2 * spec.active_params * n_tokens / (peak * check_fraction("utilization", utilization))


def preemption_table(spec: ModelSpec, n_tokens: int, sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                     device_name: str = "a100-80gb") -> list[dict]:
    """Swap and recompute seconds (milliseconds in the table) for one sequence, at each block size."""
    recompute = recompute_seconds(spec, n_tokens, device_name)
    rows = []
    for bs in sizes:
        swap = swap_seconds(spec, n_tokens, bs)
        rows.append({"block_size": bs, "swap ms": swap * 1e3, "recompute ms": recompute * 1e3,
                     "cheaper": "swap" if swap < recompute else "recompute"})
    return rows
