"""ContiguousAllocator against a byte-map reference; fragmentation makes a large request fail."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory.allocator import Block, ContiguousAllocator, fragmenting_workload

from ..refusals import assert_refused


def runs(used):
    """Maximal free runs (offset, length) of a byte map, by scanning it."""
    out, start = [], None
    for i, u in enumerate(used + [True]):
        if not u and start is None:
            start = i
        elif u and start is not None:
            out.append((start, i - start))
            start = None
    return out


def reference_offset(used, size, policy):
    fits = [(o, n) for o, n in runs(used) if n >= size]
    if not fits:
        return None
    return fits[0][0] if policy == "first_fit" else min(fits, key=lambda r: (r[1], r[0]))[0]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["first_fit", "best_fit"]), st.integers(8, 120),
       st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=40))
def test_matches_the_byte_map_reference(policy, capacity, program):
    a, used, live = ContiguousAllocator(capacity, policy), [False] * capacity, []
    for is_alloc, x in program:
        if is_alloc or not live:
            expected = reference_offset(used, x, policy)
            if expected is None:
                holes = list(a.holes)
                with pytest.raises(MemoryError, match="largest hole"):
                    a.alloc(x)
                assert a.holes == holes  # a failed request changes nothing
                continue
            b = a.alloc(x)
            assert b.offset == expected
            used[b.offset:b.offset + b.size] = [True] * b.size
            live.append(b)
        else:
            b = live.pop(x % len(live))
            a.free(b)
            used[b.offset:b.offset + b.size] = [False] * b.size
        assert a.holes == runs(used)  # holes merged, sorted, and exactly the free bytes
        assert a.free_bytes + sum(b.size for b in live) == capacity


def test_fragmentation_fails_a_request_that_paging_serves():
    a = ContiguousAllocator(1000)
    live = fragmenting_workload(a, [100] * 10)
    assert len(live) == 5 and a.free_bytes == 500 and a.largest_hole == 100
    assert a.fragmentation == pytest.approx(0.8)
    with pytest.raises(MemoryError, match="500 bytes free"):
        a.alloc(300)
    a.alloc(100)  # still usable after the failure


def test_best_fit_keeps_the_big_hole():
    first, best = ContiguousAllocator(100, "first_fit"), ContiguousAllocator(100, "best_fit")
    for al in (first, best):
        x, _, z, _ = al.alloc(30), al.alloc(10), al.alloc(10), al.alloc(50)
        al.free(x)
        al.free(z)  # holes: 30 at 0, 10 at 40
        al.alloc(10)
    assert first.largest_hole == 20 and best.largest_hole == 30


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="capacity"):
        ContiguousAllocator(0)
    with pytest.raises(ValueError, match="policy"):
        ContiguousAllocator(10, "worst_fit")
    a = ContiguousAllocator(10)
    with pytest.raises(ValueError, match="size"):
        a.alloc(0)
    with pytest.raises(ValueError, match="live Block"):
        a.free(Block(0, 5))
    for call, word in ((lambda: ContiguousAllocator(10.0), "capacity"), (lambda: a.alloc("5"), "size"),
                       (lambda: a.free((0, 5)), "block"), (lambda: fragmenting_workload([], [1]), "allocator"),
                       (lambda: a.alloc(True), "size")):
        with pytest.raises(TypeError, match=word):
            call()
    with pytest.raises(ValueError, match="free_every"):
        fragmenting_workload(a, [1], free_every=0)
    assert a.holes == [(0, 10)]


def test_sizes_that_are_not_a_list_are_refused():
    a = ContiguousAllocator(100)
    assert_refused(lambda: fragmenting_workload(a, None), TypeError, "sizes", None, "a list of allocation sizes")
    assert a.holes == [(0, 100)]
