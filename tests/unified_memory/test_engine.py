"""UnifiedMemory against the independent page-by-page reference (tests/unified_memory/reference.py): counters,
simulated time, link use and page placement, for every (eviction, prefetch) pair and fault batch size."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory import DEVICE, HOST, UnifiedMemory
from labkit.unified_memory.state import FREE

from ..refusals import assert_refused
from .reference import Reference

PS = 4096
EVICTIONS = ["lru", "clock", "fifo"]
PREFETCHERS = [None, "sequential", "density"]


def make(cfg):
    um = UnifiedMemory(cfg["device_pages"] * PS, cfg["host_pages"] * PS, eviction=cfg["eviction"],
                       prefetch=cfg["prefetch"], prefetch_pages=cfg["prefetch_pages"],
                       block_bytes=cfg["block_pages"] * PS, leaf_bytes=cfg["leaf_pages"] * PS,
                       fault_batch=cfg["fault_batch"])
    ref = Reference(cfg["device_pages"], cfg["host_pages"], cfg["eviction"], cfg["prefetch"], cfg["prefetch_pages"],
                    block_pages=cfg["block_pages"], leaf_pages=cfg["leaf_pages"], fault_batch=cfg["fault_batch"])
    return um, ref


def agree(um, ref):
    """Counters, time and placement (tier and frame of every allocated page) are the reference's."""
    s = um.stats
    assert {k: v for k, v in s.as_dict().items() if k != "time_s"} == ref.counts
    assert math.isclose(s.time_s, ref.time, rel_tol=1e-12, abs_tol=1e-18)
    pages = np.array(sorted(ref.where), np.int64)
    assert um.where(pages).tolist() == [{"H": HOST, "D": DEVICE}[ref.where[q]] for q in pages.tolist()]
    assert um.frame_of(pages).tolist() == [ref.frame_of.get(q, -1) for q in pages.tolist()]
    assert um.n_device == sum(w == "D" for w in ref.where.values()) <= um.device_pages
    assert um.n_host == sum(w == "H" for w in ref.where.values()) <= um.host_pages


configs = st.fixed_dictionaries({
    "device_pages": st.integers(1, 8), "host_pages": st.integers(0, 24),
    "eviction": st.sampled_from(EVICTIONS), "prefetch": st.sampled_from(PREFETCHERS),
    "prefetch_pages": st.integers(1, 5), "block_pages": st.sampled_from([4, 8]), "leaf_pages": st.sampled_from([1, 2]),
    "fault_batch": st.sampled_from([1, 2, 3, 256]),
})
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 14)),
    st.tuples(st.just("free"), st.integers(0, 5)),
    st.tuples(st.just("access"), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 13)), max_size=60)),
    st.tuples(st.just("scan"), st.integers(0, 5), st.integers(1, 4)),
), max_size=12)


@settings(max_examples=200, deadline=None)
@given(configs, ops)
def test_every_call_matches_the_page_by_page_reference(cfg, program):
    um, ref = make(cfg)
    twin, _ = make(cfg)  # the same program, one page per access_pages call: a batch may span calls
    live = []
    for op in program:
        if op[0] == "alloc":
            try:
                a = um.alloc(op[1] * PS - 7)
            except MemoryError:
                with pytest.raises(MemoryError):
                    ref.alloc(op[1])
                continue
            assert ref.alloc(op[1]) == a.first_page
            assert twin.alloc(op[1] * PS - 7) == a
            live.append(a)
        elif live and op[0] == "free":
            a = live.pop(op[1] % len(live))
            for pool in (um, twin):
                pool.free(a)
            ref.free(a.first_page, a.num_pages)
            assert (um.where(np.arange(a.first_page, a.first_page + a.num_pages)) == FREE).all()
        elif live and op[0] in ("access", "scan"):
            if op[0] == "access":
                pages = [live[i % len(live)].first_page + o % live[i % len(live)].num_pages for i, o in op[1]]
            else:  # sequential sweeps: the pattern prefetch is for
                a = live[op[1] % len(live)]
                pages = list(range(a.first_page, a.first_page + a.num_pages)) * op[2]
            um.access_pages(np.array(pages, np.int64))
            for p in pages:
                ref.access(p)
                twin.access_pages([p])
                assert twin.where([p]).tolist() == [DEVICE]  # every access is served
            assert twin.stats.as_dict() == pytest.approx(um.stats.as_dict(), rel=1e-12)
            assert np.array_equal(twin.where(np.arange(len(um.pages))), um.where(np.arange(len(um.pages))))
        agree(um, ref)
    assert um.link_utilization(7)[1] == pytest.approx(ref.link_busy(7), abs=1e-3)  # 65,536 bins inside


def mixed_trace(seed, n_pages):
    """Cyclic sweeps bigger than the device, random pages, a hot set, strided and repeated pages."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.tile(np.arange(n_pages), 2), rng.integers(0, n_pages, 1500),
                           np.where(rng.random(800) < 0.9, rng.integers(0, 64, 800), rng.integers(0, n_pages, 800)),
                           np.repeat(np.arange(0, n_pages, 3), 2), rng.permutation(n_pages)])


@pytest.mark.parametrize("eviction", EVICTIONS)
@pytest.mark.parametrize("prefetch", PREFETCHERS)
@settings(max_examples=4, deadline=None)
@given(device_pages=st.integers(257, 700), seed=st.integers(0, 2**16), fault_batch=st.sampled_from([1, 256]))
def test_more_than_256_resident_pages_match_the_reference(eviction, prefetch, device_pages, seed, fault_batch):
    cfg = dict(device_pages=device_pages, host_pages=1000, eviction=eviction, prefetch=prefetch, prefetch_pages=7,
               block_pages=64, leaf_pages=4, fault_batch=fault_batch)
    um, ref = make(cfg)
    a = um.alloc(900 * PS)
    assert ref.alloc(900) == a.first_page
    trace = mixed_trace(seed, 900) + a.first_page
    um.access_pages(trace)
    for p in trace.tolist():
        ref.access(p)
    agree(um, ref)
    assert um.stats.accesses == len(trace) and um.n_device == device_pages  # full, and every access served


def test_a_fault_then_a_hit_with_the_time_model():
    um = UnifiedMemory(4 * PS, 4 * PS, link_bandwidth=1e9, fault_latency=1e-5, device_bandwidth=1e12)
    a = um.alloc(PS)
    assert um.where([a.first_page]).tolist() == [HOST]
    um.access(a)
    assert (um.stats.faults, um.stats.migrations, um.stats.bytes_moved) == (1, 1, PS)
    assert math.isclose(um.stats.time_s, 1e-5 + PS / 1e9)
    um.access(a)
    assert um.stats.hits == 1 and math.isclose(um.stats.time_s, 1e-5 + PS / 1e9 + PS / 1e12)


def test_fault_batches_share_one_latency_by_hand():
    # 10 consecutive faults, a hit, 3 faults; batches of 4: [4 4 2] [3] -> 4 latencies, not 13
    um = UnifiedMemory(16 * PS, 16 * PS, fault_batch=4, fault_latency=1e-3, link_bandwidth=PS / 1e-6,
                       device_bandwidth=1e30)
    a = um.alloc(13 * PS)
    um.access_pages(np.r_[np.arange(10), 9, np.arange(10, 13)] + a.first_page)
    assert (um.stats.faults, um.stats.fault_batches, um.stats.hits) == (13, 4, 1)
    assert um.stats.time_s == pytest.approx(4e-3 + 13e-6)
    # the link: busy [1, 1.004] ms, [2.004, 2.008], [3.008, 3.010], [4.010, 4.013]; 1-us bins see each microsecond
    t, u = um.link_utilization(bins=4013)
    busy = np.flatnonzero(u > 0.5)
    assert busy.tolist() == [*range(1000, 1004), *range(2004, 2008), 3008, 3009, 4010, 4011, 4012]
    assert u.sum() == pytest.approx(13, rel=1e-3)  # 13 busy microseconds


def test_lru_clock_and_fifo_pick_different_victims():
    # frames hold 0,1,2; page 0 is touched again; then page 3 faults.
    victims = {}
    for ev in EVICTIONS:
        um = UnifiedMemory(3 * PS, 8 * PS, eviction=ev)
        a = um.alloc(4 * PS)
        um.access_pages(np.array([0, 1, 2, 0, 3]) + a.first_page)
        victims[ev] = int(np.flatnonzero(um.where(np.arange(4) + a.first_page) == HOST)[0])
    assert victims == {"lru": 1, "clock": 0, "fifo": 0}  # clock: all bits set, a full sweep, frame 0


def test_clock_gives_a_second_chance():
    um = UnifiedMemory(3 * PS, 8 * PS, eviction="clock")
    a = um.alloc(6 * PS)
    um.access_pages(np.array([0, 1, 2, 3]) + a.first_page)  # 3 faults fill, the 4th sweeps: bits cleared, 0 goes
    um.access_pages(np.array([1, 4]) + a.first_page)        # 1 is referenced again: 2 goes, not 1
    assert um.where(np.arange(5) + a.first_page).tolist() == [HOST, DEVICE, HOST, DEVICE, DEVICE]


def test_density_sweep_faults_at_leaves_0_1_2_4_8_16():
    um = UnifiedMemory(2**24, 2**24, prefetch="density")
    a = um.alloc(2 * 2**20)
    um.access(a)
    assert um.stats.faults == 6 and um.stats.migrations == 512


def test_link_utilization_series():
    # 1 ms of latency per fault, 1 ms to move a page, hits free: fault on page 0 ([0, 1] ms dead, link busy
    # [1, 2] ms), a hit, fault on page 1 (dead [2, 3], busy [3, 4]). Four 1-ms bins: busy 0, 1, 0, 1.
    um = UnifiedMemory(4 * PS, 4 * PS, fault_latency=1e-3, link_bandwidth=PS / 1e-3, device_bandwidth=1e30)
    a = um.alloc(2 * PS)
    assert um.link_utilization(3)[1].tolist() == [0, 0, 0]  # nothing happened yet
    um.access_pages(np.array([0, 0, 1]) + a.first_page)
    t, u = um.link_utilization(bins=4)
    assert np.allclose(t, [0, 1e-3, 2e-3, 3e-3]) and np.allclose(u, [0, 1, 0, 1], atol=1e-3)
    assert np.allclose(um.link_utilization(bins=8)[1], [0, 0, 1, 1, 0, 0, 1, 1], atol=1e-3)  # half-ms bins
    assert np.allclose(um.link_utilization(bins=3)[1], [0.25, 0.5, 0.75], atol=1e-3)
    assert um.link_utilization(bins=1)[1] == pytest.approx([0.5], abs=1e-4)


def snapshot(um):
    everything = np.arange(len(um.pages) + 3)
    return (um.stats.as_dict(), um.where(everything).tolist(), um.frame_of(everything).tolist(), um.n_device,
            um.n_host, dict(um.allocations), um.link_utilization(10)[1].tolist())


def test_refused_calls_leave_the_pool_unchanged():
    um = UnifiedMemory(2 * PS, 2 * PS, prefetch="sequential", fault_batch=3)
    a = um.alloc(3 * PS)
    um.access_pages(np.array([0, 1, 2, 1]) + a.first_page)
    before = snapshot(um)
    refused = [
        (MemoryError, "does not fit", lambda: um.alloc(2 * PS)),
        (ValueError, r"pages\[1\] must be a page of a live allocation \(pages \[0, 3\)\), got 99",
         lambda: um.access_pages(np.array([a.first_page, 99]))),
        (ValueError, r"pages\[0\] must be a page of a live allocation", lambda: um.access_pages([3])),
        (ValueError, r"pages\[2\] must be a page number >= 0, got -1", lambda: um.access_pages([0, 1, -1])),
        (TypeError, "integer page numbers", lambda: um.access_pages(np.array([0.5]))),
        (TypeError, "integer page numbers", lambda: um.access_pages(["0"])),
        (ValueError, "1-D", lambda: um.access_pages(np.zeros((2, 2), np.int64))),
        (ValueError, "offset must be an int in", lambda: um.access(a, offset=3 * PS)),
        (TypeError, "offset must be an int", lambda: um.access(a, offset=1.0)),
        (ValueError, "nbytes must be an int in", lambda: um.access(a, offset=PS, nbytes=2 * PS + 1)),
        (TypeError, "allocation must be Allocation", lambda: um.access(a.first_page)),
        (ValueError, "live Allocation", lambda: um.free(type(a)(a.first_page, 1, 5))),
        (TypeError, "nbytes must be a positive int", lambda: um.alloc(4096.0)),
        (ValueError, "nbytes must be a positive int", lambda: um.alloc(0)),
        (TypeError, "name must be a str", lambda: um.alloc(PS, name=3)),
        (TypeError, "bins must be a positive int", lambda: um.link_utilization(2.0)),
        (ValueError, "bins must be a positive int", lambda: um.link_utilization(0)),
    ]
    for error, message, call in refused:
        with pytest.raises(error, match=message):
            call()
        assert snapshot(um) == before, message
    um.free(a)
    with pytest.raises(ValueError, match="live Allocation"):
        um.free(a)
    with pytest.raises(ValueError, match=r"none is allocated"):
        um.access_pages([0])
    b = um.alloc(4 * PS)  # every page came back
    um.access(b)
    assert um.stats.accesses == 4 + 4 and um.n_device == 2 and um.n_host == 2


def test_the_keyword_constructor_and_the_config_build_the_same_pool():
    from labkit.unified_memory import UMConfig
    cfg = UMConfig(4 * PS, 8 * PS, eviction="clock", fault_batch=8)
    a, b = UnifiedMemory(4 * PS, 8 * PS, eviction="clock", fault_batch=8), UnifiedMemory(config=cfg)
    assert a.config == b.config == cfg and (a.device_pages, a.host_pages, a.page_size) == (4, 8, PS)
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['evictoin'\]"):
        UnifiedMemory(PS, PS, evictoin="lru")
    with pytest.raises(TypeError, match="not both"):
        UnifiedMemory(PS, config=cfg)
    with pytest.raises(TypeError, match="config must be UMConfig"):
        UnifiedMemory(config={"device_bytes": PS})
    with pytest.raises(TypeError, match="needs device_bytes and host_bytes"):
        UnifiedMemory(PS)


def test_where_and_frame_of_answer_for_any_page_number():
    um = UnifiedMemory(2 * PS, 2 * PS)
    a = um.alloc(3 * PS)
    assert um.where([a.first_page, 10**9]).tolist() == [HOST, FREE]
    assert um.frame_of(np.array([a.first_page + 2, 10**9], np.uint32)).tolist() == [0, -1]
    with pytest.raises(ValueError, match=r"pages\[2\] must be a page number >= 0, got -5"):
        um.where([0, 10**9, -5])
    with pytest.raises(TypeError, match="integer page numbers"):
        um.frame_of([0.0])


def test_page_numbers_and_bins_of_the_wrong_kind_are_refused():
    um = UnifiedMemory(2 * PS, 8 * PS)
    um.alloc(3 * PS)
    assert_refused(lambda: um.where([-1]), ValueError, "pages[0]", -1, "a page number >= 0")  # not the last page
    assert_refused(lambda: um.frame_of([2, -1]), ValueError, "pages[1]", -1, "a page number >= 0")
    assert um.where([10**9]).tolist() == [FREE]  # past the page table: not allocated
    assert_refused(lambda: um.link_utilization(bins=True), TypeError, "bins", True, "a positive int")
    assert_refused(lambda: um.link_utilization(bins=0), ValueError, "bins", 0, "a positive int")
