"""The rules of labkit.unified_memory (engine.py's docstring), one access at a time, written independently of
the engine with other structures: dicts for the page table, an OrderedDict for LRU recency, a deque for FIFO
arrivals, a list of frames and a dict of bits for clock, sets for the density prefetcher. Slow and obvious."""
from collections import OrderedDict, deque

import numpy as np


class Reference:
    def __init__(self, device_pages, host_pages, eviction="lru", prefetch=None, prefetch_pages=16,
                 threshold=0.5, block_pages=512, leaf_pages=16, fault_batch=1, page_size=4096,
                 latency=30e-6, link=25e9, device=2e12):
        self.device_pages, self.host_pages = device_pages, host_pages
        self.eviction, self.prefetcher, self.prefetch_pages = eviction, prefetch, prefetch_pages
        self.threshold, self.block_pages, self.leaf_pages = threshold, block_pages, leaf_pages
        self.fault_batch, self.page_size = fault_batch, page_size
        self.latency, self.link, self.device = latency, link, device
        self.where = {}                  # page -> "H" or "D"; absent: not allocated
        self.end = {}                    # page -> end of its allocation
        self.frames = [None] * device_pages
        self.frame_of = {}
        self.recency = OrderedDict()     # LRU: device pages, least recent first (ties: lower page first)
        self.arrivals = deque()          # FIFO: device pages in load order
        self.bit = {}                    # clock reference bits
        self.hand = 0
        self.batch_room = 0              # faults the current batch can still take
        self.next_free_page = 0
        self.counts = dict(hits=0, faults=0, fault_batches=0, migrations=0, evictions=0, bytes_moved=0)
        self.time = 0.0
        self.transfers = []              # (start, end) of each fault's link transfer
        self.fault_rows = []             # per fault: [hits since the previous fault, opened a batch, pages in, out]
        self.hits_since_fault = 0

    # ---- allocation -------------------------------------------------------------------------------
    def alloc(self, n):
        if n > self.device_pages + self.host_pages - len(self.where):
            raise MemoryError
        first = -(-self.next_free_page // self.block_pages) * self.block_pages
        self.next_free_page = first + n
        for q in range(first, first + n):
            self.end[q] = first + n
            if list(self.where.values()).count("H") < self.host_pages:
                self.where[q] = "H"
            else:
                self.load(q, protect=set())
        return first

    def free(self, first, n):
        for q in range(first, first + n):
            if self.where.pop(q) == "D":
                self.drop(q)
                self.frames[self.frame_of.pop(q)] = None

    def drop(self, q):
        """q leaves the device: out of the policies' structures."""
        self.recency.pop(q, None)
        if q in self.arrivals:
            self.arrivals.remove(q)

    # ---- eviction -----------------------------------------------------------------------------------
    def victim(self, protect):
        if self.eviction == "lru":
            return next(q for q in self.recency if q not in protect)
        if self.eviction == "fifo":
            return next(q for q in self.arrivals if q not in protect)
        while True:  # clock
            q = self.frames[self.hand]
            self.hand = (self.hand + 1) % self.device_pages
            if q in protect:
                continue
            if self.bit[q]:
                self.bit[q] = False
                continue
            return q

    def load(self, q, protect):
        if None in self.frames:
            f = self.frames.index(None)
        else:
            v = self.victim(protect)
            self.where[v] = "H"
            f = self.frame_of.pop(v)
            self.drop(v)
            self.counts["evictions"] += 1
        self.frames[f], self.frame_of[q], self.where[q] = q, f, "D"
        self.recency[q] = True
        self.arrivals.append(q)
        self.bit[q] = True
        protect.add(q)

    # ---- prefetch -----------------------------------------------------------------------------------
    def density(self, p):
        lo = p - p % self.block_pages
        hi = min(lo + self.block_pages, self.end[p])
        leaf_start = p - (p - lo) % self.leaf_pages
        taken = set(range(leaf_start, min(leaf_start + self.leaf_pages, hi)))
        size = 2 * self.leaf_pages
        while size < 2 * max(hi - lo, self.leaf_pages):
            a = p - (p - lo) % size
            node = range(a, min(a + size, hi))
            if sum(1 for q in node if q in taken or self.where[q] == "D") > self.threshold * len(node):
                taken |= set(node)
            size *= 2
        return sorted(taken)

    def prefetch(self, p):
        if self.prefetcher == "sequential":
            candidates = range(p + 1, min(p + 1 + self.prefetch_pages, self.end[p]))
        elif self.prefetcher == "density":
            candidates = self.density(p)
        else:
            candidates = []
        return [q for q in candidates if q != p and self.where[q] == "H"][:self.device_pages - 1]

    # ---- access -------------------------------------------------------------------------------------
    def access(self, p):
        if self.where[p] == "D":
            self.counts["hits"] += 1
            self.time += self.page_size / self.device
            if self.eviction == "lru":
                self.recency.move_to_end(p)
            self.bit[p] = True
            self.batch_room = 0
            self.hits_since_fault += 1
            return
        self.counts["faults"] += 1
        opened = self.batch_room == 0
        if opened:
            self.counts["fault_batches"] += 1
            self.time += self.latency
            self.batch_room = self.fault_batch
        self.batch_room -= 1
        out_before, protect = self.counts["evictions"], set()
        group = [p] + self.prefetch(p)
        for q in group:
            self.load(q, protect)
        for q in sorted(group):  # LRU key (tick, page): one fault's pages are ordered by page number
            self.recency.move_to_end(q)
        moved = len(group) + self.counts["evictions"] - out_before
        self.fault_rows.append([self.hits_since_fault, int(opened), len(group), moved - len(group)])
        self.hits_since_fault = 0
        self.counts["migrations"] += len(group)
        self.counts["bytes_moved"] += moved * self.page_size
        start = self.time
        self.time += moved * self.page_size / self.link
        self.transfers.append((start, self.time))

    def link_busy(self, bins):
        """Fraction of each of `bins` equal bins of [0, time] the link was busy, interval by interval."""
        width = max(self.time, 1e-30) / bins
        busy = np.zeros(bins)
        for start, end in self.transfers:
            for j in range(bins):
                lo, hi = j * width, (j + 1) * width
                busy[j] += max(0.0, min(end, hi) - max(start, lo))
        return busy / width


def lru_by_hand(trace, n_frames):
    """(faults, sorted pages on the device) for LRU over `n_frames`, with an OrderedDict: notebook 02's exercise 1."""
    frames, faults = OrderedDict(), 0
    for p in trace:
        if p in frames:
            frames.move_to_end(p)
        else:
            faults += 1
            if len(frames) == n_frames:
                frames.popitem(last=False)
            frames[p] = True
    return faults, sorted(frames)
