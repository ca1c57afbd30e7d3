"""The settings of a unified memory pool, checked once (notebook 02): capacities, page size, policies, the
time model. `UnifiedMemory(device_bytes, host_bytes, **settings)` builds one; `UnifiedMemory(config=...)`
takes one whole; `dataclasses.replace(config, ...)` derives another and checks it again.

Defaults: link 25 GB/s (PCIe 4.0 x16 is 31.5 GB/s per direction on paper, ~25 GB/s in practice), 30 us
per fault (GPU fault handling takes tens of microseconds), device 2 TB/s (HBM class), one fault per batch
(fault_batch=1: every fault pays the full latency; CUDA's driver services up to 256 faults per batch).
Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._checks import check_choice, check_number, check_positive, check_positive_int, check_type, fail

EVICTIONS = ("lru", "clock", "fifo")
PREFETCHERS = (None, "sequential", "density")


@dataclass(frozen=True)
class UMConfig:
    """device_bytes, host_bytes: capacities (bytes, rounded down to whole pages); page_size: bytes;
    eviction: "lru" | "clock" | "fifo"; prefetch: None | "sequential" | "density";
    link_bandwidth, device_bandwidth: bytes/s; fault_latency: seconds per batch of faults;
    fault_batch: at most this many consecutive faults (no hit between them) share one latency;
    prefetch_pages: pages the sequential prefetcher brings; density_threshold, block_bytes, leaf_bytes:
    the density prefetcher's rule (labkit.unified_memory.density_node). Allocations start on a block."""
    device_bytes: int
    host_bytes: int
    page_size: int = 4096
    eviction: str = "lru"
    prefetch: str | None = None
    link_bandwidth: float = 25e9
    fault_latency: float = 30e-6
    device_bandwidth: float = 2e12
    fault_batch: int = 1
    prefetch_pages: int = 16
    density_threshold: float = 0.5
    block_bytes: int = 2 * 2**20
    leaf_bytes: int = 64 * 2**10

    def __post_init__(self):
        page = check_positive_int("page_size", self.page_size, unit="bytes")
        checked = {
            "page_size": page,
            "device_bytes": check_positive_int("device_bytes", self.device_bytes, unit="bytes"),
            "host_bytes": check_positive_int("host_bytes", self.host_bytes, unit="bytes", allow_zero=True),
            "link_bandwidth": check_positive("link_bandwidth", self.link_bandwidth, unit="bytes/s"),
            "device_bandwidth": check_positive("device_bandwidth", self.device_bandwidth, unit="bytes/s"),
            "fault_latency": check_positive("fault_latency", self.fault_latency, unit="s", allow_zero=True),
            "fault_batch": check_positive_int("fault_batch", self.fault_batch, unit="faults"),
            "prefetch_pages": check_positive_int("prefetch_pages", self.prefetch_pages, unit="pages"),
            "density_threshold": check_number("density_threshold", self.density_threshold, 0.0, 1.0,
                                              high_open=True),
            "block_bytes": check_positive_int("block_bytes", self.block_bytes, unit="bytes"),
            "leaf_bytes": check_positive_int("leaf_bytes", self.leaf_bytes, unit="bytes"),
        }
        check_type("eviction", self.eviction, str, "a str")
        check_choice("eviction", self.eviction, EVICTIONS)
        if self.prefetch is not None:
            check_type("prefetch", self.prefetch, str, "a str or None")
        check_choice("prefetch", self.prefetch, PREFETCHERS)
        if checked["device_bytes"] < page:
            fail("device_bytes", self.device_bytes, f"at least one page ({page} bytes)")
        if checked["block_bytes"] % page:
            fail("block_bytes", self.block_bytes, f"a multiple of page_size ({page} bytes)")
        leaf = checked["leaf_bytes"]
        if leaf % page or checked["block_bytes"] % leaf:
            fail("leaf_bytes", self.leaf_bytes, f"a multiple of page_size ({page}) that divides block_bytes "
                                                f"({self.block_bytes})")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    device_pages = property(lambda self: self.device_bytes // self.page_size, doc="device frames")
    host_pages = property(lambda self: self.host_bytes // self.page_size, doc="pages the host holds")
    block_pages = property(lambda self: self.block_bytes // self.page_size, doc="pages per block")
    leaf_pages = property(lambda self: self.leaf_bytes // self.page_size, doc="pages per density leaf")

    @property
    def hit_s(self) -> float:
        """Seconds the device takes to read one page."""
        return self.page_size / self.device_bandwidth
