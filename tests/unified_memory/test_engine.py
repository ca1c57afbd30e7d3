"""UnifiedMemory against a page-by-page reference simulator written independently, plus invariants."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory import DEVICE, FREE, HOST, UnifiedMemory, density_node

PS = 4096


class Reference:
    """The rules of labkit.unified_memory, one access at a time, with dicts and lists (slow, obvious)."""

    def __init__(self, device_pages, host_pages, eviction="lru", prefetch=None, prefetch_pages=16,
                 threshold=0.5, block_pages=512, leaf_pages=16, lat=30e-6, link=25e9, dev=2e12):
        self.dp, self.hp, self.ev, self.pf = device_pages, host_pages, eviction, prefetch
        self.n_pf, self.thr, self.bp, self.leaf = prefetch_pages, threshold, block_pages, leaf_pages
        self.lat, self.link, self.dev = lat, link, dev
        self.where, self.end, self.last, self.loaded, self.ref = {}, {}, {}, {}, {}
        self.frames, self.frame_of = [None] * device_pages, {}
        self.hand = self.tick = self.seq = self.next = 0
        self.c = dict(hits=0, faults=0, migrations=0, evictions=0, bytes_moved=0)
        self.time = 0.0

    def alloc(self, n):
        if n > self.dp + self.hp - len(self.where):
            raise MemoryError
        first = -(-self.next // self.bp) * self.bp
        self.next = first + n
        for q in range(first, first + n):
            self.end[q] = first + n
            if sum(1 for w in self.where.values() if w == "H") < self.hp:
                self.where[q] = "H"
            else:
                self.load(q, set())
        return first

    def free(self, first, n):
        for q in range(first, first + n):
            if self.where.pop(q) == "D":
                self.frames[self.frame_of[q]] = None

    def victim(self, protect):
        cands = [q for q, w in self.where.items() if w == "D" and q not in protect]
        if self.ev == "lru":
            return min(cands, key=lambda q: (self.last[q], q))
        if self.ev == "fifo":
            return min(cands, key=lambda q: self.loaded[q])
        while True:  # clock
            q = self.frames[self.hand]
            self.hand = (self.hand + 1) % self.dp
            if q in protect:
                continue
            if self.ref[q]:
                self.ref[q] = False
                continue
            return q

    def load(self, q, protect):
        if None in self.frames:
            f = self.frames.index(None)
        else:
            v = self.victim(protect)
            self.where[v] = "H"
            f = self.frame_of[v]
            self.c["evictions"] += 1
        self.frames[f], self.frame_of[q], self.where[q] = q, f, "D"
        self.last[q], self.loaded[q], self.ref[q] = self.tick, self.seq, True
        self.seq += 1
        protect.add(q)

    def prefetch(self, p):
        if self.pf == "sequential":
            cand = range(p + 1, min(p + 1 + self.n_pf, self.end[p]))
        elif self.pf == "density":
            lo = p - p % self.bp
            hi = min(lo + self.bp, self.end[p])
            taken = set(range(p - (p - lo) % self.leaf, min(p - (p - lo) % self.leaf + self.leaf, hi)))
            size = 2 * self.leaf
            while size < 2 * max(hi - lo, self.leaf):
                a = lo + (p - lo) - (p - lo) % size
                node = range(a, min(a + size, hi))
                if sum(1 for q in node if q in taken or self.where[q] == "D") > self.thr * len(node):
                    taken |= set(node)
                size *= 2
            cand = sorted(taken)
        else:
            cand = []
        return [q for q in cand if q != p and self.where[q] == "H"][:self.dp - 1]

    def access(self, p):
        self.tick += 1
        if self.where[p] == "D":
            self.c["hits"] += 1
            self.time += PS / self.dev
            if self.ev == "lru":
                self.last[p] = self.tick
            self.ref[p] = True
            return
        self.c["faults"] += 1
        out0, protect = self.c["evictions"], set()
        group = [p] + self.prefetch(p)
        for q in group:
            self.load(q, protect)
        moved = len(group) + self.c["evictions"] - out0
        self.c["migrations"] += len(group)
        self.c["bytes_moved"] += moved * PS
        self.time += self.lat + moved * PS / self.link


def agree(um, ref):
    s = um.stats
    assert (s.hits, s.faults, s.migrations, s.evictions, s.bytes_moved) == tuple(ref.c.values())
    assert math.isclose(s.time_s, ref.time, rel_tol=1e-9, abs_tol=1e-15)
    tiers = {q: {"H": HOST, "D": DEVICE}[w] for q, w in ref.where.items()}
    pages = np.array(sorted(tiers), np.int64)
    assert um.where(pages).tolist() == [tiers[q] for q in pages.tolist()]


def check_invariants(um, accesses=None):
    tier = um.tier[:um.next_page]
    assert (tier == DEVICE).sum() == um.n_device <= um.device_pages
    assert (tier == HOST).sum() == um.n_host <= um.host_pages
    held = um.frames[um.frames >= 0]
    assert sorted(held.tolist()) == np.flatnonzero(tier == DEVICE).tolist()  # one frame per device page
    if accesses is not None:  # counted by the test, not by the pool
        assert um.stats.hits + um.stats.faults == accesses


configs = st.fixed_dictionaries({
    "device_pages": st.integers(1, 8), "host_pages": st.integers(0, 24),
    "eviction": st.sampled_from(["lru", "clock", "fifo"]),
    "prefetch": st.sampled_from([None, "sequential", "density"]),
    "prefetch_pages": st.integers(1, 5), "block_pages": st.sampled_from([4, 8]), "leaf_pages": st.sampled_from([1, 2]),
})
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 14)),
    st.tuples(st.just("free"), st.integers(0, 5)),
    st.tuples(st.just("access"), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 13)), max_size=60)),
    st.tuples(st.just("scan"), st.integers(0, 5), st.integers(1, 4)),
), max_size=12)


def make(cfg):
    um = UnifiedMemory(cfg["device_pages"] * PS, cfg["host_pages"] * PS, eviction=cfg["eviction"],
                       prefetch=cfg["prefetch"], prefetch_pages=cfg["prefetch_pages"],
                       block_bytes=cfg["block_pages"] * PS, leaf_bytes=cfg["leaf_pages"] * PS)
    ref = Reference(cfg["device_pages"], cfg["host_pages"], cfg["eviction"], cfg["prefetch"],
                    cfg["prefetch_pages"], block_pages=cfg["block_pages"], leaf_pages=cfg["leaf_pages"])
    return um, ref


@settings(max_examples=150, deadline=None)
@given(configs, ops)
def test_vectorized_replay_matches_the_page_by_page_reference(cfg, program):
    um, ref = make(cfg)
    twin, _ = make(cfg)  # the same program, one page per access_pages call
    live, n_access = [], 0
    for op in program:
        if op[0] == "alloc":
            before = (um.stats.as_dict(), um.tier.copy(), um.n_device, um.n_host)
            try:
                a = um.alloc(op[1] * PS - 7)
            except MemoryError:
                with pytest.raises(MemoryError):
                    ref.alloc(op[1])
                assert um.stats.as_dict() == before[0] and (um.n_device, um.n_host) == before[2:]
                assert np.array_equal(um.tier[:len(before[1])], before[1])
                continue
            assert ref.alloc(op[1]) == a.first_page
            assert twin.alloc(op[1] * PS - 7) == a
            live.append(a)
        elif live and op[0] == "free":
            a = live.pop(op[1] % len(live))
            um.free(a)
            twin.free(a)
            ref.free(a.first_page, a.num_pages)
            assert (um.where(np.arange(a.first_page, a.first_page + a.num_pages)) == FREE).all()
        elif live and op[0] == "access":
            pages = [live[i % len(live)].first_page + o % live[i % len(live)].num_pages for i, o in op[1]]
            um.access_pages(np.array(pages, np.int64))
            n_access += len(pages)
            for p in pages:
                ref.access(p)
                twin.access_pages(np.array([p]))
                assert twin.where([p]).tolist() == [DEVICE]  # every access is served, each one checked
            assert twin.stats.as_dict() == pytest.approx(um.stats.as_dict(), rel=1e-9)
            assert np.array_equal(twin.tier, um.tier)
        elif live and op[0] == "scan":  # sequential sweeps: the pattern prefetch is for
            a = live[op[1] % len(live)]
            pages = np.tile(np.arange(a.first_page, a.first_page + a.num_pages), op[2])
            um.access_pages(pages)
            twin.access_pages(pages)
            n_access += len(pages)
            for p in pages.tolist():
                ref.access(p)
        agree(um, ref)
        check_invariants(um, n_access)


@pytest.mark.parametrize("eviction", ["lru", "clock", "fifo"])
@pytest.mark.parametrize("prefetch", [None, "sequential", "density"])
def test_long_traces_cross_the_chunk_and_fault_run_paths(eviction, prefetch):
    rng = np.random.default_rng(7)
    cfg = dict(device_pages=40, host_pages=200, eviction=eviction, prefetch=prefetch, prefetch_pages=4,
               block_pages=16, leaf_pages=2)
    um, ref = make(cfg)
    a, b = um.alloc(150 * PS), um.alloc(60 * PS)
    ref.alloc(150), ref.alloc(60)
    trace = np.concatenate([np.tile(np.arange(150), 3) + a.first_page,                 # cyclic, > capacity
                            rng.integers(0, 60, 700) + b.first_page,                   # random
                            np.tile(np.arange(20), 40) + a.first_page,                 # fits: hits
                            np.repeat(np.arange(0, 150, 3), 5) + a.first_page])        # strided, repeated
    um.access_pages(trace)
    for p in trace.tolist():
        ref.access(p)
    agree(um, ref)
    check_invariants(um, len(trace))


def test_a_fault_then_a_hit_with_the_time_model():
    um = UnifiedMemory(4 * PS, 4 * PS, link_bandwidth=1e9, fault_latency=1e-5, device_bandwidth=1e12)
    a = um.alloc(PS)
    assert um.where([a.first_page]).tolist() == [HOST]
    um.access(a)
    assert (um.stats.faults, um.stats.migrations, um.stats.bytes_moved) == (1, 1, PS)
    assert math.isclose(um.stats.time_s, 1e-5 + PS / 1e9)
    um.access(a)
    assert um.stats.hits == 1 and math.isclose(um.stats.time_s, 1e-5 + PS / 1e9 + PS / 1e12)


def test_lru_clock_and_fifo_pick_different_victims():
    # frames hold 0,1,2; page 0 is touched again; then page 3 faults.
    victims = {}
    for ev in ("lru", "clock", "fifo"):
        um = UnifiedMemory(3 * PS, 8 * PS, eviction=ev)
        a = um.alloc(4 * PS)
        um.access_pages(np.array([0, 1, 2, 0, 3]) + a.first_page)
        victims[ev] = int(np.flatnonzero(um.where(np.arange(4) + a.first_page) == HOST)[0])
    assert victims == {"lru": 1, "clock": 0, "fifo": 0}  # clock: all ref bits set, full sweep, frame 0


def test_density_node_examples_and_sequential_fault_count():
    r = np.zeros(8, bool)
    assert density_node(r, 5, leaf=2) == (4, 6)
    r[:3] = True
    assert density_node(r, 3, leaf=2) == (0, 4)
    assert density_node(np.ones(8, bool), 0, leaf=1) == (0, 8)
    # a sequential sweep of one 2 MiB block with 64 KiB leaves faults at leaves 0, 1, 2, 4, 8, 16
    um = UnifiedMemory(2**24, 2**24, prefetch="density")
    a = um.alloc(2 * 2**20)
    um.access(a)
    assert um.stats.faults == 6 and um.stats.migrations == 512


@pytest.mark.parametrize("kwargs, word", [
    (dict(device_bytes=100, host_bytes=0), "device_bytes"), (dict(device_bytes=PS, host_bytes=-1), "host_bytes"),
    (dict(device_bytes=PS, host_bytes=0, eviction="lfu"), "eviction"),
    (dict(device_bytes=PS, host_bytes=0, prefetch="next"), "prefetch"),
    (dict(device_bytes=PS, host_bytes=0, link_bandwidth=0), "link_bandwidth"),
    (dict(device_bytes=PS, host_bytes=0, density_threshold=1.5), "density_threshold"),
    (dict(device_bytes=PS, host_bytes=0, page_size=0), "page_size"),
])
def test_bad_arguments_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        UnifiedMemory(**kwargs)


def test_errors_leave_the_pool_usable():
    um = UnifiedMemory(2 * PS, 2 * PS)
    a = um.alloc(3 * PS)
    with pytest.raises(MemoryError, match="does not fit"):
        um.alloc(2 * PS)
    with pytest.raises(ValueError, match="page 99"):
        um.access_pages(np.array([a.first_page, 99]))
    with pytest.raises(ValueError, match="1-D integer"):
        um.access_pages(np.array([0.5]))
    with pytest.raises(ValueError, match="offset"):
        um.access(a, offset=3 * PS)
    assert um.stats.accesses == 0  # the bad trace was refused before its first page
    um.free(a)
    with pytest.raises(ValueError, match="live Allocation"):
        um.free(a)
    b = um.alloc(4 * PS)  # every page came back
    um.access(b)
    assert um.stats.faults >= 2 and um.n_device == 2 and um.n_host == 2


def test_link_utilization_series():
    # 1 ms of latency per fault, 1 ms to move a page, hits free: fault on page 0 ([0, 1] ms dead, link busy
    # [1, 2] ms), a hit, fault on page 1 (dead [2, 3], busy [3, 4]). Four 1-ms bins: busy 0, 1, 0, 1.
    um = UnifiedMemory(4 * PS, 4 * PS, fault_latency=1e-3, link_bandwidth=PS / 1e-3, device_bandwidth=1e30)
    a = um.alloc(2 * PS)
    um.access_pages(np.array([0, 0, 1]) + a.first_page)
    t, u = um.link_utilization(bins=4)
    assert np.allclose(t, [0, 1e-3, 2e-3, 3e-3]) and np.allclose(u, [0, 1, 0, 1])
    t, u = um.link_utilization(bins=8)  # half-millisecond bins
    assert np.allclose(u, [0, 0, 1, 1, 0, 0, 1, 1])
    with pytest.raises(ValueError, match="bins"):
        um.link_utilization(0)


def test_density_node_clipped_nodes_and_bad_threshold():
    # an allocation of 6 pages in a block of 8, leaf 2: fault at 5 takes [4, 6); the clipped node [4, 8)
    # has 2 pages inside, both taken (2 > 0.5 * 2); the root [0, 6) holds 2 resident + 2 taken = 4 > 3
    r = np.array([1, 1, 0, 0, 0, 0], bool)
    assert density_node(r, 5, 0.5, 2) == (0, 6)
    assert density_node(r, 5, 0.7, 2) == (4, 6)  # 4 > 0.7 * 6 = 4.2 fails
    for bad in (1.0, -0.1, "0.5", True):
        with pytest.raises(ValueError, match="threshold"):
            density_node(r, 5, bad, 2)


@pytest.mark.parametrize("eviction", ["lru", "fifo"])
@pytest.mark.parametrize("device_pages", [12, 40, 100])
def test_sequential_prefetch_sweeps_take_the_batched_path_and_agree(eviction, device_pages, monkeypatch):
    from labkit.unified_memory import migration
    consumed = []
    batched = migration.Migration._sequential_run
    monkeypatch.setattr(migration.Migration, "_sequential_run",
                        lambda self, run, t: consumed.append(batched(self, run, t)) or consumed[-1])
    um, ref = make(dict(device_pages=device_pages, host_pages=400, eviction=eviction, prefetch="sequential",
                        prefetch_pages=4, block_pages=16, leaf_pages=2))
    a, b = um.alloc(150 * PS), um.alloc(60 * PS)
    ref.alloc(150), ref.alloc(60)
    rng = np.random.default_rng(device_pages)
    trace = np.concatenate([np.tile(np.arange(150), 3) + a.first_page, rng.integers(0, 60, 300) + b.first_page,
                            np.arange(60) + b.first_page, np.tile(np.arange(150), 2) + a.first_page])
    um.access_pages(trace)
    for p in trace.tolist():
        ref.access(p)
    agree(um, ref)
    check_invariants(um)
    assert sum(consumed) > 0  # the batched path ran, and the counters still agree page by page
