"""The alpha-beta model of a link (Hockney 1994): sending n bytes takes alpha + n / beta seconds
(notebook 04, section 2; sections 3-7 price every collective with it).

    alpha: latency per message (seconds)          beta: bandwidth (bytes/s, one direction)

A ring collective over N ranks is a sequence of steps, each one message of S/N bytes per rank:

    all_reduce      2(N-1) steps:  2(N-1) alpha + 2(N-1)/N S / beta
    all_gather      (N-1) steps:   (N-1) alpha +  (N-1)/N S / beta       (reduce_scatter the same)
    all_to_all      (N-1) steps:   (N-1) alpha +  (N-1)/N S / beta       (S: each rank's input)

Bus bandwidth, as nccl-tests reports it: algorithm bandwidth S / t times 2(N-1)/N (all_reduce) or (N-1)/N
(the others), so that it compares with the link's own bandwidth whatever N is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_choice, check_int, check_positive, check_positive_int, fail
from ..specs import device
from .collectives import OPS, bytes_sent_per_rank

SPEC_LATENCY = {"nvlink4": 3e-6, "nvlink5": 3e-6, "pcie4-x16": 5e-6, "pcie5-x16": 5e-6, "ib-ndr-400": 8e-6,
                "ib-hdr-200": 8e-6}
"""Assumed per-message latency (seconds) of spec-sheet links: data sheets give bandwidth, not latency.
These are the order of magnitude nccl-tests reports for small messages (a few microseconds in a node,
under ten across InfiniBand); the lab says so wherever it uses them."""


def steps(op: str, n: int) -> int:
    """Messages in sequence per rank for a ring `op` over n ranks."""
    check_choice("op", op, OPS)
    check_positive_int("n", n)
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def bus_bandwidth(op: str, nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth (bytes/s) of one `op` of S = nbytes over n ranks that took `seconds`."""
    check_positive("seconds", seconds, unit="seconds")
    check_positive("nbytes", nbytes, unit="bytes")
    return bytes_sent_per_rank(op, nbytes, n) / seconds


@dataclass(frozen=True)
class LinkModel:
    """alpha (seconds per message) and beta (bytes/s) of one link; `name` says where they come from."""
    alpha: float
    beta: float
    name: str = ""

    def __post_init__(self):
        check_positive("alpha", self.alpha, unit="seconds", allow_zero=True)
        check_positive("beta", self.beta, unit="bytes/s")

    def send(self, nbytes: float) -> float:
        """Seconds to send one message of nbytes."""
        return self.alpha + check_positive("nbytes", nbytes, unit="bytes", allow_zero=True) / self.beta

    def collective(self, op: str, nbytes: float, n: int) -> float:
        """Predicted seconds of a ring `op` of S = nbytes over n ranks (0 for one rank)."""
        check_positive("nbytes", nbytes, unit="bytes", allow_zero=True)
        return steps(op, n) * self.alpha + bytes_sent_per_rank(op, nbytes, n) / self.beta

    @classmethod
    def from_spec(cls, name: str, alpha: float | None = None) -> "LinkModel":
        """A link of data/hardware.json: its spec-sheet bandwidth, and SPEC_LATENCY (or `alpha`)."""
        spec = device(name)
        if spec.kind != "link":
            fail("name", name, f"a link of data/hardware.json (this is a {spec.kind})")
        return cls(SPEC_LATENCY.get(name, 5e-6) if alpha is None else alpha, spec.bandwidth, name)


def fit(op: str, sizes, seconds, n: int, name: str = "fitted") -> LinkModel:
    """alpha and beta from measured `seconds` of `op` at each size (bytes) over n ranks: least squares on
    t = steps * alpha + sent / beta, each point weighted by 1/t so that 1 KB and 64 MB count alike."""
    check_int("n", n, low=2, unit="ranks: one rank sends nothing, so there is no link to fit")
    sizes, seconds = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if sizes.ndim != 1 or sizes.shape != seconds.shape or sizes.size < 2:
        fail("sizes", sizes.tolist(), "a list of at least 2 sizes, one per measured time")
    if (sizes <= 0).any() or (seconds <= 0).any() or not np.isfinite(seconds).all():
        fail("seconds", seconds.tolist(), "positive finite times for positive sizes")
    sent = np.array([bytes_sent_per_rank(op, s, n) for s in sizes])
    a = np.stack([np.full_like(sent, steps(op, n)), sent], axis=1) / seconds[:, None]  # rows weighted by 1/t
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(seconds), rcond=None)
    if inv_beta <= 0:
        fail("seconds", seconds.tolist(), "times that grow with the size (the fitted bandwidth is not positive)")
    return LinkModel(max(float(alpha), 0.0), float(1 / inv_beta), name)
