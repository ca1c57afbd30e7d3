"""A unified memory pool: virtual pages that live in device memory or host memory, migrated on a fault
(notebook 02). Small enough to read in one sitting, vectorized enough to replay a 70B decode step.

    virtual pages  0 1 2 3 4 5 6 7 8 ...       tier[page]: DEVICE, HOST or FREE (not allocated)
                   D D H H D H - - H
    device frames  [0][1][2]  (device_bytes // page_size of them)  <- eviction picks a victim here
    host frames    [0][1][2][3]...                                  <- victims go back here
                          \\____ link: fault_latency + bytes / link_bandwidth ____/

Rules (the reference simulator in tests/test_unified_memory.py implements the same rules page by page):
  * Access number k (k = 1, 2, ...) has tick k. A hit is an access to a page on the device; it costs
    page_size / device_bandwidth seconds and, for LRU, sets last_use[page] = k (clock: ref[page] = 1).
  * A fault is an access to a page on the host. The page moves to the device together with what the
    prefetcher picks from the same allocation (sequential: the next `prefetch_pages` pages; density: the
    tree-based rule of `density_node` inside the page's 2 MiB block), at most device_pages - 1 extra pages.
    The faulted page is loaded first, then the prefetched ones in ascending order; each takes the lowest
    free device frame or evicts a victim to the host. Pages loaded by this fault are never victims.
    Loaded pages get last_use = k and ref = 1. Allocations start on a 2 MiB block boundary (as CUDA's
    managed allocations do), so a block never holds two allocations.
  * Victims: "lru" the smallest (last_use, page); "fifo" the page loaded longest ago; "clock" a hand sweeps
    the frames, clears ref bits it passes and takes the first frame whose ref bit is 0 (second chance).
  * Time of one fault: fault_latency + (pages in + pages out) * page_size / link_bandwidth (seconds). Evicted
    pages are always written back (no dirty bits), faults are serviced one at a time (no batching: each
    pays the full latency; the code replays some runs of faults in one numpy batch, with the same result).
  * alloc() places new pages on the host while it has room, the rest on the device; free() drops them.
Defaults: link 25 GB/s (PCIe 4.0 x16 is 31.5 GB/s per direction on paper, ~25 GB/s in practice), 30 us
per fault (GPU fault handling takes tens of microseconds), device 2 TB/s (HBM class).
Units: bytes, bytes/s, seconds. GB = 1e9 bytes, GiB = 2**30 bytes. Page movement: labkit/migration.py.
"""

from __future__ import annotations

import numbers
from array import array
from dataclasses import asdict, dataclass

import numpy as np

from .migration import DEVICE, FREE, HOST, Migration  # noqa: F401

EVICTION = ("lru", "clock", "fifo")
PREFETCH = (None, "sequential", "density")


@dataclass
class Stats:
    """Counters: pages (hits, faults, migrations host->device, evictions device->host), bytes over the
    link, simulated seconds."""
    hits: int = 0
    faults: int = 0
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


def _positive(name, value, kind=(numbers.Integral,), allow_zero=False):
    if not isinstance(value, kind) or isinstance(value, bool) or not np.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} "
                         f"{'int' if kind == (numbers.Integral,) else 'number'}, got {value!r}")
    return value


def density_node(resident: np.ndarray, i: int, threshold: float = 0.5, leaf: int = 16) -> tuple[int, int]:
    """Tree-based density prefetch inside one 2 MiB block, after CUDA Unified Memory's driver (described by
    Ganguly et al., ISCA 2019): the block is a binary tree of aligned nodes of leaf, 2 leaf, 4 leaf ...
    pages. A fault takes the whole leaf around page `i`; then, going up to the root, each node is taken
    whole when more than `threshold` of its pages are resident or already taken. A node cut by the end of
    the allocation (len(resident) < the block) counts only its pages inside: it is taken when more than
    threshold * (its pages inside) are resident or taken. Returns the taken range
    as [start, end) page offsets. `resident`: one bool per page of the block (len <= the block).

        leaf 2:  [x x | x . | . . | . .]  fault at 3: leaf [2,4); node [0,4) 4/4 > 0.5: take it;
                 node [0,8) 4/8 is not > 0.5 -> returns (0, 4): page 3 moves (0..2 are there already)
    """
    resident = np.asarray(resident, bool)
    n = len(resident)
    if resident.ndim != 1 or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
        raise ValueError(f"i must index the 1-D resident array of {n} pages, got {i!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
        raise ValueError(f"threshold must be a number in [0, 1), got {threshold!r}")
    if not isinstance(leaf, int) or leaf < 1:
        raise ValueError(f"leaf must be a positive int (pages), got {leaf!r}")
    prefix = np.concatenate([[0], np.cumsum(resident)])
    start = i - i % leaf
    end, size = min(start + leaf, n), 2 * leaf
    while size < 2 * max(n, leaf):  # up to the root (the last node may be clipped by the allocation's end)
        a = i - i % size
        b = min(a + size, n)
        taken = int(prefix[start] - prefix[a] + prefix[b] - prefix[end]) + (end - start)
        if taken > threshold * (b - a):
            start, end = a, b
        size *= 2
    return start, end


class UnifiedMemory(Migration):
    """The pool (see the module docstring for the rules); `stats` holds the counters.

    device_bytes, host_bytes: capacities (bytes, rounded down to whole pages); page_size: bytes;
    eviction: "lru" | "clock" | "fifo"; prefetch: None | "sequential" | "density";
    link_bandwidth, device_bandwidth: bytes/s; fault_latency: seconds per fault;
    prefetch_pages: pages the sequential prefetcher brings; density_threshold, block_bytes, leaf_bytes:
    the density prefetcher's rule (see density_node)."""

    def __init__(self, device_bytes: int, host_bytes: int, page_size: int = 4096, eviction: str = "lru",
                 prefetch: str | None = None, link_bandwidth: float = 25e9, fault_latency: float = 30e-6,
                 device_bandwidth: float = 2e12, prefetch_pages: int = 16, density_threshold: float = 0.5,
                 block_bytes: int = 2 * 2**20, leaf_bytes: int = 64 * 2**10):
        _positive("page_size", page_size)
        _positive("device_bytes", device_bytes)
        _positive("host_bytes", host_bytes, allow_zero=True)
        if device_bytes < page_size:
            raise ValueError(f"device_bytes must hold at least one page of {page_size} bytes, got {device_bytes}")
        if eviction not in EVICTION:
            raise ValueError(f"eviction must be one of {EVICTION}, got {eviction!r}")
        if prefetch not in PREFETCH:
            raise ValueError(f"prefetch must be one of {PREFETCH}, got {prefetch!r}")
        for name, v in (("link_bandwidth", link_bandwidth), ("device_bandwidth", device_bandwidth)):
            _positive(name, v, (numbers.Real,))
        _positive("fault_latency", fault_latency, (numbers.Real,), allow_zero=True)
        _positive("prefetch_pages", prefetch_pages)
        if not isinstance(density_threshold, (int, float)) or not 0 <= density_threshold < 1:
            raise ValueError(f"density_threshold must be a number in [0, 1), got {density_threshold!r}")
        if not isinstance(block_bytes, int) or block_bytes < page_size or block_bytes % page_size:
            raise ValueError(f"block_bytes must be a multiple of page_size ({page_size}), got {block_bytes!r}")
        if not isinstance(leaf_bytes, int) or leaf_bytes < page_size or block_bytes % leaf_bytes \
                or leaf_bytes % page_size:
            raise ValueError(f"leaf_bytes must be a multiple of page_size dividing block_bytes, got {leaf_bytes!r}")
        self.leaf_pages = leaf_bytes // page_size
        self.page_size, self.eviction, self.prefetch = int(page_size), eviction, prefetch
        self.device_pages, self.host_pages = int(device_bytes // page_size), int(host_bytes // page_size)
        self.link_bandwidth, self.fault_latency = float(link_bandwidth), float(fault_latency)
        self.device_bandwidth, self.prefetch_pages = float(device_bandwidth), prefetch_pages
        self.density_threshold, self.block_pages = float(density_threshold), block_bytes // page_size
        self.tier = np.zeros(0, np.int8)          # per virtual page: FREE / HOST / DEVICE
        self.last_use = np.zeros(0, np.int64)     # LRU key: tick of the last access or load
        self.loaded = np.zeros(0, np.int64)       # FIFO key: load sequence number
        self.ref = np.zeros(0, bool)              # clock reference bit
        self.frame = np.zeros(0, np.int64)        # device frame of a page (clock)
        self.alloc_end = np.zeros(0, np.int64)    # end page (exclusive) of the page's allocation
        self.frames = np.full(self.device_pages, -1, np.int64)  # page held by each device frame
        self.frame_free = np.ones(self.device_pages, bool)      # frames below _free_hint are all taken
        self.n_free, self._free_hint = self.device_pages, 0
        self.hand, self.tick, self.seq, self.next_page = 0, 0, 0, 0
        self.n_device = self.n_host = 0
        self.allocations: dict[int, Allocation] = {}
        self.stats = Stats()
        self.fault_times = array("d")             # simulated time at which each fault started (s)
        self.fault_busy = array("d")              # link-busy seconds of each fault
        self._queue, self._queue_keys, self._qpos, self._protect = np.zeros(0, np.int64), None, 0, 0

    # ---- allocation -------------------------------------------------------------------------------
    def alloc(self, nbytes: int, name: str | None = None) -> Allocation:
        """Reserve ceil(nbytes / page_size) fresh virtual pages; MemoryError if the pool is too small."""
        _positive("nbytes", nbytes)
        nbytes = int(nbytes)
        n = -(-nbytes // self.page_size)
        free = self.device_pages + self.host_pages - self.n_device - self.n_host
        if n > free:
            raise MemoryError(f"alloc({nbytes} bytes = {n} pages) does not fit: {free} of "
                              f"{self.device_pages + self.host_pages} pages are free")
        first = -(-self.next_page // self.block_pages) * self.block_pages  # allocations start on a block
        self._grow(first + n)
        on_host = min(n, self.host_pages - self.n_host)
        self.tier[first:first + on_host] = HOST
        self.alloc_end[first:first + n] = first + n
        self.next_page = first + n
        self.n_host += on_host
        self._protect = self.seq
        self._load(np.arange(first + on_host, first + n), count=False)
        a = Allocation(first, n, nbytes, name)
        self.allocations[first] = a
        return a

    def free(self, allocation: Allocation) -> None:
        """Return every page of `allocation` to the pool."""
        if not isinstance(allocation, Allocation) or self.allocations.get(allocation.first_page) != allocation:
            raise ValueError(f"allocation must be a live Allocation of this pool, got {allocation!r}")
        pages = np.arange(allocation.first_page, allocation.first_page + allocation.num_pages)
        on_dev = pages[self.tier[pages] == DEVICE]
        if len(on_dev):
            self.frame_free[self.frame[on_dev]] = True
            self.n_free += len(on_dev)
            self._free_hint = min(self._free_hint, int(self.frame[on_dev].min()))
        self.frames[self.frame[on_dev]] = -1
        self.n_device -= len(on_dev)
        self.n_host -= len(pages) - len(on_dev)
        self.tier[pages] = FREE
        del self.allocations[allocation.first_page]

    def _grow(self, n: int) -> None:
        if n <= len(self.tier):
            return
        size = max(n, 2 * len(self.tier), 1024)
        for attr, fill in (("tier", FREE), ("last_use", 0), ("loaded", 0), ("ref", False), ("frame", -1),
                           ("alloc_end", 0)):
            old = getattr(self, attr)
            new = np.full(size, fill, old.dtype)
            new[:len(old)] = old
            setattr(self, attr, new)

    # ---- access -----------------------------------------------------------------------------------
    def access(self, allocation: Allocation, offset: int = 0, nbytes: int | None = None) -> None:
        """Touch every page of bytes [offset, offset + nbytes) of `allocation`, in order."""
        if not isinstance(allocation, Allocation) or self.allocations.get(allocation.first_page) != allocation:
            raise ValueError(f"allocation must be a live Allocation of this pool, got {allocation!r}")
        nbytes = allocation.nbytes - offset if nbytes is None else nbytes
        if not isinstance(offset, int) or not isinstance(nbytes, int) or offset < 0 or nbytes < 1 \
                or offset + nbytes > allocation.nbytes:
            raise ValueError(f"offset {offset!r} and nbytes {nbytes!r} must give a non-empty byte range inside "
                             f"the allocation's {allocation.nbytes} bytes")
        ps = self.page_size
        self.access_pages(np.arange(allocation.first_page + offset // ps,
                                    allocation.first_page + -(-(offset + nbytes) // ps)))

    def access_pages(self, pages) -> None:
        """Touch virtual pages in order (a 1-D integer array). Runs of hits are counted in bulk with numpy,
        and so are runs of faults without prefetch (LRU/FIFO) and sequential-prefetch sweeps; other faults
        (clock, density prefetch, random access) go one at a time through Python."""
        pages = np.asarray(pages)
        if pages.ndim != 1 or (pages.size and not np.issubdtype(pages.dtype, np.integer)):
            raise ValueError(f"pages must be a 1-D integer array, got shape {pages.shape} dtype {pages.dtype}")
        pages = pages.astype(np.int64, copy=False)
        if pages.size:
            bad = (pages < 0) | (pages >= self.next_page)
            bad[~bad] = self.tier[pages[~bad]] == FREE
            if bad.any():
                raise ValueError(f"pages must be allocated virtual pages; page {int(pages[np.argmax(bad)])} "
                                 f"(position {int(np.argmax(bad))}) is not")
        i, n, window, t_hit = 0, len(pages), 256, self.page_size / self.device_bandwidth
        while i < n:
            seg = pages[i:i + window]
            resident = self.tier[seg] == DEVICE
            j = len(seg) if resident.all() else int(np.argmin(resident))
            if j:
                hit = seg[:j]
                if self.eviction == "lru":
                    np.maximum.at(self.last_use, hit, np.arange(self.tick + 1, self.tick + j + 1))
                elif self.eviction == "clock":
                    self.ref[hit] = True
                self.tick += j
                self.stats.hits += j
                self.stats.time_s += j * t_hit
            if j == len(seg):
                window = min(2 * window, 1 << 16)
                i += j
                continue
            run = seg[j:]
            r = len(run) if not resident[j:].any() else int(np.argmax(resident[j:]))
            done = 0
            if self.prefetch == "sequential" and self.eviction != "clock":
                done = self._sequential_run(run[:r], t_hit)
            if done:
                run = run[:done]
            elif r > 1 and self.prefetch is None:
                run = self._distinct_prefix(run[:min(r, self.device_pages)])
                if self.eviction != "clock":
                    self._fault_run(run)
                elif self.n_free:  # clock: free frames first (no victims), then whole sweeps of the hand
                    run = run[:self.n_free]
                    self._fault_run(run)
                else:
                    self._clock_run(run)
            else:
                run = run[:1]
                self.tick += 1
                self._fault(int(run[0]))
            i += j + len(run)
            window = max(256, 2 * (j + len(run)))

    def _fault(self, p: int) -> None:
        s = self.stats
        s.faults += 1
        in0, out0, self._protect = s.migrations, s.evictions, self.seq
        extra = self._prefetch_candidates(p) if self.prefetch is not None else ()
        if len(extra):
            self._load(np.concatenate([[p], extra]))  # the faulted page first, then the prefetch
        else:
            self._load_one(p)
        moved = (s.migrations - in0) + (s.evictions - out0)
        busy = moved * self.page_size / self.link_bandwidth
        self.fault_times.append(s.time_s)
        self.fault_busy.append(busy)
        s.bytes_moved += moved * self.page_size
        s.time_s += self.fault_latency + busy

    def _prefetch_candidates(self, p: int) -> np.ndarray:
        if self.prefetch == "sequential":
            cand = np.arange(p + 1, min(p + 1 + self.prefetch_pages, int(self.alloc_end[p])))
        elif self.prefetch == "density":
            lo = p - p % self.block_pages
            hi = min(lo + self.block_pages, int(self.alloc_end[p]))
            start, end = density_node(self.tier[lo:hi] == DEVICE, p - lo, self.density_threshold, self.leaf_pages)
            cand = np.arange(lo + start, lo + end)
        else:
            return np.zeros(0, np.int64)
        return cand[(self.tier[cand] == HOST) & (cand != p)][:self.device_pages - 1]

    # ---- views ------------------------------------------------------------------------------------
    def where(self, pages) -> np.ndarray:
        """Tier of each page: DEVICE (1), HOST (0) or FREE (-1)."""
        return self.tier[np.asarray(pages, np.int64)]

    def link_utilization(self, bins: int = 50) -> tuple[np.ndarray, np.ndarray]:
        """(bin start times in s, fraction of each bin the link was busy), over the simulated run so far.
        A fault's transfer starts fault_latency seconds after the fault."""
        if not isinstance(bins, int) or bins < 1:
            raise ValueError(f"bins must be a positive int, got {bins!r}")
        total = max(self.stats.time_s, 1e-30)
        edges = np.linspace(0.0, total, bins + 1)
        start = np.asarray(self.fault_times) + self.fault_latency
        end = start + np.asarray(self.fault_busy)
        busy = np.zeros(bins)
        for a, b in zip(start, end):
            if b <= a:
                continue
            lo, hi = np.searchsorted(edges, a, "right") - 1, np.searchsorted(edges, b, "left")
            for j in range(max(lo, 0), min(hi, bins)):
                busy[j] += min(b, edges[j + 1]) - max(a, edges[j])
        return edges[:-1], busy / (total / bins)
