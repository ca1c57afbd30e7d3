"""A unified memory pool: virtual pages that live in device memory or host memory, migrated on a fault
(notebook 02). UnifiedMemory owns the state (state.py) and checks every call; the paging loop (loop.py)
does the work, one access at a time, compiled with numba.

    virtual pages  0 1 2 3 4 5 6 7 8 ...       pages[page, TIER]: DEVICE, HOST or FREE (not allocated)
                   D D H H D H - - H
    device frames  [0][1][2]  (device_bytes // page_size of them)  <- eviction picks a victim here
    host memory    the other pages                                 <- victims go back here
                          \\____ link: fault_latency + bytes / link_bandwidth ____/

Rules (tests/unified_memory/reference.py implements the same rules page by page, with other structures):
  * Access number k (k = 1, 2, ...) has tick k. A hit is an access to a page on the device; it costs
    page_size / device_bandwidth seconds and, for LRU, sets the page's last_use to k (clock: its reference
    bit to 1).
  * A fault is an access to a page on the host. The page moves to the device together with what the
    prefetcher picks from the same allocation among the pages on the host at that moment (sequential: the
    next `prefetch_pages` pages; density: the tree-based rule of `density_node` inside the page's 2 MiB
    block), at most device_pages - 1 extra pages. The faulted page is loaded first, then the prefetched
    ones in ascending order; each takes the lowest free device frame or evicts a victim to the host. Pages
    loaded by this fault are never victims. Loaded pages get last_use = k and reference bit 1.
    Allocations start on a block boundary (2 MiB, as CUDA's managed allocations do), so a block never
    holds two allocations.
  * Victims: "lru" the smallest (last_use, page); "fifo" the page loaded longest ago; "clock" a hand sweeps
    the frames, clears the reference bits it passes and takes the first frame whose bit is 0 (second chance).
  * Time of a fault: (pages in + pages out) * page_size / link_bandwidth seconds of transfer (evicted pages
    are always written back: no dirty bits), plus fault_latency if the fault opens a batch.
    Fault batches: a maximal run of consecutive faults with no hit between them is cut into batches of
    fault_batch faults (the last one may be shorter): a fault opens a batch when the access before it was
    a hit (or it is the pool's first fault) or when the open batch already holds fault_batch faults. Each
    batch pays fault_latency once, before its first fault's transfer; the transfers of its faults follow
    each other on the link. fault_batch=1 (the default): every fault pays the latency. A run of faults
    continues into the next access_pages call; alloc() and free() do not end it.
  * alloc() places new pages on the host while it has room, the rest on the device (lowest free frames; no
    time, no counters); free() drops them. Pages outside every live allocation cannot be accessed: a trace
    with one is refused whole, before its first access.
  * link_utilization() reads the link's busy time from a fixed set of 65,536 bins (timeline.py).
Units: bytes, bytes/s, seconds. GB = 1e9 bytes, GiB = 2**30 bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .._checks import check_int, check_positive_int, check_type, fail
from .config import UMConfig
from .faultlog import CHUNK, COLUMNS, FaultLog, log_buffer
from .loop import first_outside, place, release, replay
from .state import (EVICTION, FRAME, FREE, HOST, N_FREE, PREFETCH, TIER, Costs, Rules, grown, new_frames, new_pages,
                    new_state)
from .timeline import busy_until, new_timeline


@dataclass
class Stats:
    """Counters: accesses that hit and that faulted, fault batches (latencies paid), pages migrated host ->
    device and evicted device -> host, bytes over the link, simulated seconds."""
    hits: int = 0
    faults: int = 0
    fault_batches: int = 0
    migrations: int = 0
    evictions: int = 0
    bytes_moved: int = 0
    time_s: float = 0.0

    @property
    def accesses(self) -> int:
        return self.hits + self.faults

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Allocation:
    """Virtual pages [first_page, first_page + num_pages) holding nbytes bytes."""
    first_page: int
    num_pages: int
    nbytes: int
    name: str | None = None


class UnifiedMemory:
    """The pool (see the module docstring for the rules); `stats` holds the counters, `config` the settings.

    UnifiedMemory(device_bytes, host_bytes, page_size=4096, eviction="lru", prefetch=None, ...): the settings
    of UMConfig, by keyword; or UnifiedMemory(config=UMConfig(...))."""

    def __init__(self, device_bytes: int | None = None, host_bytes: int | None = None, *,
                 config: UMConfig | None = None, **settings):
        if config is None:
            unknown = sorted(set(settings) - set(UMConfig.names()))
            if unknown:
                raise TypeError(f"unknown setting(s) {unknown}; UnifiedMemory takes {', '.join(UMConfig.names())}")
            if device_bytes is None or host_bytes is None:
                raise TypeError("UnifiedMemory needs device_bytes and host_bytes (or config=UMConfig(...))")
            config = UMConfig(device_bytes, host_bytes, **settings)
        else:
            check_type("config", config, UMConfig)
            if device_bytes is not None or host_bytes is not None or settings:
                raise TypeError("give either config=UMConfig(...) or the settings, not both")
        self.config = config
        self.rules = Rules(EVICTION[config.eviction], PREFETCH[config.prefetch], config.prefetch_pages,
                           config.block_pages, config.leaf_pages, config.density_threshold, config.fault_batch)
        self.costs = Costs(config.page_size, config.hit_s, config.fault_latency, config.link_bandwidth)
        self.pages = new_pages(0)                      # the page table (state.py): a row per virtual page
        self.block_end = np.zeros(0, np.int64)         # per 2 MiB block: end of its allocation
        self.frames = new_frames(config.device_pages)  # the frame table: a row per device frame
        self.state = new_state(config.device_pages)    # scalars
        self.allocations: dict[int, Allocation] = {}
        self.stats = Stats()
        self._next_page = 0
        self._prefetched = np.empty(max(config.prefetch_pages, config.block_pages), np.int64)  # the loop's scratch
        self._counts = np.empty(config.block_pages + 1, np.int64)
        self._allocated_pages = 0
        self.timeline = new_timeline()                 # when the link was busy (timeline.py)

    # ---- sizes --------------------------------------------------------------------------------------
    page_size = property(lambda self: self.config.page_size, doc="bytes per page")
    device_pages = property(lambda self: self.config.device_pages, doc="device frames")
    host_pages = property(lambda self: self.config.host_pages, doc="pages the host can hold")

    @property
    def n_device(self) -> int:
        """Pages on the device now."""
        return self.device_pages - int(self.state[N_FREE])

    @property
    def n_host(self) -> int:
        """Allocated pages on the host now."""
        return self._allocated_pages - self.n_device

    # ---- allocation ---------------------------------------------------------------------------------
    def alloc(self, nbytes: int, name: str | None = None) -> Allocation:
        """Reserve ceil(nbytes / page_size) fresh virtual pages; MemoryError (pool unchanged) if they do not fit."""
        nbytes = check_positive_int("nbytes", nbytes, unit="bytes")
        if name is not None:
            check_type("name", name, str, "a str or None")
        n = -(-nbytes // self.page_size)
        free = self.device_pages + self.host_pages - self._allocated_pages
        if n > free:
            raise MemoryError(f"alloc({nbytes} bytes = {n} pages) does not fit: {free} of "
                              f"{self.device_pages + self.host_pages} pages are free")
        block = self.config.block_pages
        first = -(-self._next_page // block) * block   # allocations start on a block boundary
        end = first + n
        self.pages, self.block_end = grown(self.pages, self.block_end, end, block)
        on_host = min(n, self.host_pages - self.n_host)
        self.pages[first:first + on_host, TIER] = HOST
        self.block_end[first // block:-(-end // block)] = end
        place(first + on_host, end, self.pages, self.frames, self.state, self.rules.eviction)
        self._next_page, self._allocated_pages = end, self._allocated_pages + n
        allocation = Allocation(first, n, nbytes, name)
        self.allocations[first] = allocation
        return allocation

    def free(self, allocation: Allocation) -> None:
        """Return every page of `allocation` to the pool."""
        self._check_live(allocation)
        first, end = allocation.first_page, allocation.first_page + allocation.num_pages
        release(first, end, self.pages, self.frames, self.state, self.rules.eviction)
        self._allocated_pages -= allocation.num_pages
        del self.allocations[first]

    def _check_live(self, allocation) -> None:
        check_type("allocation", allocation, Allocation)
        if self.allocations.get(allocation.first_page) != allocation:
            fail("allocation", allocation, "a live Allocation of this pool")

    # ---- access -------------------------------------------------------------------------------------
    def access(self, allocation: Allocation, offset: int = 0, nbytes: int | None = None) -> None:
        """Touch every page of bytes [offset, offset + nbytes) of `allocation` (default: to its end), in order."""
        self._check_live(allocation)
        offset = check_int("offset", offset, 0, allocation.nbytes - 1, unit="bytes")
        if nbytes is None:
            nbytes = allocation.nbytes - offset
        nbytes = check_int("nbytes", nbytes, 1, allocation.nbytes - offset, unit="bytes from the offset")
        first = allocation.first_page
        self.access_pages(np.arange(first + offset // self.page_size,
                                    first + -(-(offset + nbytes) // self.page_size)))

    def access_pages(self, pages) -> None:
        """Touch virtual pages in order (a 1-D array of page numbers, each inside a live allocation). The whole
        trace is checked first: a refused trace leaves the pool as it was."""
        pages = self._checked_pages(pages, live=True)
        if len(pages):
            self._replay(pages, None, 0)

    def access_pages_logged(self, pages) -> FaultLog:
        """access_pages, and the log of its faults (faultlog.py: hits before each, whether it paid the latency,
        pages in and out) for the link models of links.py. Same counters, same simulated time."""
        pages = self._checked_pages(pages, live=True)
        rows, hits_before = [], 0
        for start in range(0, len(pages), CHUNK):
            chunk = pages[start:start + CHUNK]
            log = log_buffer(len(chunk))
            faults, hits_before = self._replay(chunk, log, hits_before)
            rows.append(log[:faults].copy())
        table = np.concatenate(rows) if rows else np.zeros((0, COLUMNS), np.int64)
        return FaultLog(table, int(hits_before), self.page_size, self.costs.hit_s, self.costs.fault_latency)

    def _replay(self, pages: np.ndarray, log: np.ndarray | None, hits_before: int) -> tuple[int, int]:
        """Run the paging loop (loop.replay) over checked pages, writing `log` (None: no log), and add its counters
        to `stats`. Returns (faults, hits since the last fault)."""
        hits, faults, batches, migrations, evictions, time_s, hits_after = replay(
            pages, self.pages, self.frames, self.block_end, self.state, self.rules, self.costs,
            float(self.stats.time_s), self.timeline, self._prefetched, self._counts, log, hits_before)
        s = self.stats
        s.hits, s.faults, s.fault_batches = s.hits + hits, s.faults + faults, s.fault_batches + batches
        s.migrations, s.evictions = s.migrations + migrations, s.evictions + evictions
        s.bytes_moved += (migrations + evictions) * self.page_size
        s.time_s = float(time_s)
        return int(faults), int(hits_after)

    def _checked_pages(self, pages, live: bool) -> np.ndarray:
        array = np.asarray(pages)
        if array.size == 0 and array.ndim == 1:
            return np.zeros(0, np.int64)
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"pages must be integer page numbers, got an array of {array.dtype}")
        if array.ndim != 1:
            fail("pages", f"an array of shape {array.shape}", "a 1-D array of page numbers")
        if array.dtype == np.uint64 and array.max() > np.iinfo(np.int64).max:
            fail("pages", int(array.max()), "page numbers below 2**63")
        array = np.ascontiguousarray(array, np.int64)
        index = first_outside(array, self.pages) if live else int(np.argmax(array < 0)) if array.min() < 0 else -1
        if index >= 0 and array[index] < 0:
            fail(f"pages[{index}]", int(array[index]), "a page number >= 0")
        if index >= 0:
            fail(f"pages[{index}]", int(array[index]), f"a page of a live allocation ({self._valid_ranges()})")
        return array

    def _valid_ranges(self) -> str:
        if not self.allocations:
            return "none is allocated"
        ranges = [f"[{a.first_page}, {a.first_page + a.num_pages})" for a in self.allocations.values()]
        return "pages " + ", ".join(ranges[:4]) + (f" and {len(ranges) - 4} more" if len(ranges) > 4 else "")

    # ---- views --------------------------------------------------------------------------------------
    def where(self, pages) -> np.ndarray:
        """Tier of each page: DEVICE (1), HOST (0) or FREE (-1, not allocated)."""
        pages = self._checked_pages(pages, live=False)
        out = np.full(len(pages), FREE, np.int8)
        known = pages < len(self.pages)
        out[known] = self.pages[pages[known], TIER]
        return out

    def frame_of(self, pages) -> np.ndarray:
        """Device frame of each page (-1: not on the device)."""
        pages = self._checked_pages(pages, live=False)
        out = np.full(len(pages), -1, np.int64)
        known = pages < len(self.pages)
        out[known] = self.pages[pages[known], FRAME]
        return out

    def link_utilization(self, bins: int = 50) -> tuple[np.ndarray, np.ndarray]:
        """(bin start times in s, fraction of each bin the link was busy), over the simulated run so far. A
        fault's transfer starts after its batch's latency (exact to about 4 x bins / 65,536: timeline.py)."""
        bins = check_positive_int("bins", bins)
        total = max(self.stats.time_s, 1e-30)
        edges = np.linspace(0.0, total, bins + 1)
        return edges[:-1], np.diff(busy_until(self.timeline, edges)) / (total / bins)
