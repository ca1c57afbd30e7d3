"""The arena plan (no overlaps, aligned, in bounds, total = padded sum), placement into one buffer (views share
its storage and equal the tensors; bad placements refused, nothing half-done), and the fragmentation replays
checked against an independent byte map."""
import itertools
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from labkit.day0 import arena as A
from labkit.day0.config import TinyVLMConfig, small_config
from labkit.day0.loading import load_rank, placed_sizes
from labkit.day0.model import TinyVLM, tp_plan
from labkit.day0.plan import footprint
from labkit.day0.release import read_release, write_release
from tests.refusals import assert_refused

sizes_st = st.lists(st.integers(1, 5000), min_size=1, max_size=20)
aligns = st.sampled_from([1, 2, 8, 64, 256, 512])


def pad(n, a):
    return (n + a - 1) // a * a


@settings(max_examples=150, deadline=None)
@given(sizes_st, st.integers(0, 9000), st.integers(0, 9000), aligns)
def test_plan_is_aligned_disjoint_in_bounds_and_sums(sizes, kv, act, a):
    names = [f"t{i}" for i in range(len(sizes))]
    plan = A.plan_arena(dict(zip(names, sizes)), kv, act, alignment=a)
    regions = [*plan.weights, plan.kv, plan.activations]
    assert [r.name for r in plan.weights] == names and [r.nbytes for r in plan.weights] == sizes
    for r in regions:
        assert r.offset % a == 0 and 0 <= r.offset and r.end <= plan.total
    for first, second in zip(regions, regions[1:]):  # in order, never overlapping
        assert first.end <= second.offset
    assert plan.total == sum(pad(n, a) for n in sizes) + pad(kv, a) + pad(act, a)
    assert plan.padding == plan.total - sum(sizes) - kv - act >= 0
    assert plan.kv.offset >= max(r.end for r in plan.weights)


def model_tensors(dtype=torch.bfloat16):
    torch.manual_seed(0)
    state = TinyVLM(small_config()).state_dict()
    return {k: v.to(dtype) for k, v in state.items() if k != "language_model.lm_head.weight"}


def inside(arena, t):
    base = arena.buffer.untyped_storage().data_ptr()
    return t.untyped_storage().data_ptr() == base and base <= t.data_ptr() < base + arena.nbytes


def reread(arena, name, like):
    """The bytes of `name`'s slot, read back from the buffer as `like`'s dtype and shape."""
    r = arena.plan.region(name)
    return arena.buffer[r.offset:r.end].view(like.dtype).view(like.shape)


def test_a_whole_model_lives_in_the_arena():
    tensors = model_tensors()
    plan = A.plan_arena({k: v.numel() * v.element_size() for k, v in tensors.items()}, 4096, 1024)
    arena = A.Arena(plan)
    assert arena.nbytes == plan.total and arena.missing() == list(tensors)
    views = {k: arena.place(k, v) for k, v in tensors.items()}
    assert arena.missing() == []
    for k, v in views.items():
        assert v.dtype == tensors[k].dtype and v.shape == tensors[k].shape and torch.equal(v, tensors[k])
        assert inside(arena, v) and arena.holds(v) and v.data_ptr() - arena.buffer.data_ptr() == plan.region(k).offset
    assert arena.kv_region().numel() == 4096 and inside(arena, arena.kv_region())
    assert arena.activation_region().data_ptr() - arena.buffer.data_ptr() == plan.activations.offset
    arena.buffer.zero_()  # the views are the arena: clearing it clears them
    assert all(not v.any() for v in views.values())
    assert not arena.holds(tensors["language_model.norm.weight"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64]),
                          st.lists(st.integers(1, 6), min_size=0, max_size=3)), min_size=1, max_size=8), aligns)
def test_placed_views_equal_the_tensors(specs, a):
    g = torch.Generator().manual_seed(len(specs))
    tensors = {f"t{i}": (torch.randn(shape, generator=g) * 50).to(dt) for i, (dt, shape) in enumerate(specs)}
    plan = A.plan_arena({k: v.numel() * v.element_size() for k, v in tensors.items()}, 0, 0, alignment=max(a, 8))
    arena = A.Arena(plan)
    for k, v in tensors.items():
        out = arena.place(k, v)
        assert torch.equal(out, v) and inside(arena, out)
    assert all(torch.equal(reread(arena, k, v), v) for k, v in tensors.items())  # none overwritten by later ones


def test_bad_placements_are_refused_and_leave_the_arena_usable():
    arena = A.Arena(A.plan_arena({"a": 16, "b": 8}, 32, 0))
    assert_refused(lambda: arena.place("c", torch.zeros(4)), ValueError, "name", "c", "a tensor of this arena plan")
    with pytest.raises(ValueError, match=r"^tensor must be 16 bytes, the size planned for a"):
        arena.place("a", torch.zeros(3))
    assert arena.missing() == ["a", "b"]  # nothing reserved by the failures
    arena.place("a", torch.ones(4))
    assert_refused(lambda: arena.place("a", torch.ones(4)), ValueError, "name", "a", "not placed yet")
    assert_refused(lambda: arena.place("b", [0.0, 1.0]), TypeError, "tensor", [0.0, 1.0], "torch.Tensor")
    assert arena.missing() == ["b"] and torch.equal(arena.buffer[:16].view(torch.float32), torch.ones(4))
    assert_refused(lambda: arena.discard("b"), ValueError, "name", "b", "a tensor placed in this arena")
    assert_refused(lambda: arena.place("b", torch.ones(4), "bf16"), TypeError, "dtype", "bf16", "a torch.dtype")
    arena.discard("a")  # undone: it may be placed again
    assert arena.missing() == ["a", "b"]
    assert torch.equal(arena.place("a", torch.full((4,), 2.0)), torch.full((4,), 2.0))


def test_place_converts_on_the_copy_as_torch_does():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    arena = A.Arena(A.plan_arena({"w": x.numel() * 2}, 0, 0))
    with pytest.raises(ValueError, match="the size planned for w"):
        arena.place("w", x)  # FP32 is twice the slot
    view = arena.place("w", x, torch.bfloat16)
    assert view.dtype == torch.bfloat16 and torch.equal(view, x.to(torch.bfloat16)) and arena.holds(view)


def test_threads_place_each_tensor_once():
    tensors = model_tensors(torch.float32)
    arena = A.Arena(A.plan_arena({k: v.numel() * 4 for k, v in tensors.items()}, 0, 0))
    errors = []

    def load(names):
        for k in names:
            try:
                arena.place(k, tensors[k])
            except ValueError as e:
                errors.append(str(e))

    names = list(tensors)
    work = [names[i::2] + names for i in range(4)]  # every name attempted 4 to 6 times, concurrently
    threads = [threading.Thread(target=load, args=(w,)) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert arena.missing() == [] and len(errors) == sum(map(len, work)) - len(names)
    assert all("not placed yet" in e for e in errors)
    assert all(torch.equal(reread(arena, k, v), v) for k, v in tensors.items())


def test_plan_input_refusals():
    assert_refused(lambda: A.plan_arena({"a": 4}, -1, 0), ValueError, "kv_bytes", -1, "non-negative int")
    assert_refused(lambda: A.plan_arena({"a": 4}, 0, 0, alignment=48), ValueError, "alignment", 48, "power of two")
    assert_refused(lambda: A.plan_arena({"a": 0}, 0, 0), ValueError, "tensors['a']", 0, "positive int")
    assert_refused(lambda: A.plan_arena([("a", 4), ("a", 8)], 0, 0), ValueError, "tensors", "a", "distinct")
    assert_refused(lambda: A.plan_arena(5, 0, 0), TypeError, "tensors", 5, "a dict of name -> bytes")
    assert_refused(lambda: A.Arena({"a": 4}), TypeError, "plan", {"a": 4}, "ArenaPlan")
    entries = [type("Entry", (), {"name": "x", "nbytes": 12})()]
    assert A.tensor_sizes(entries) == {"x": 12} and A.plan_arena(entries, 0, 0).total == 256


def byte_map_check(replay):
    """Replay the events on a byte map (independent of the allocator's hole list): every allocation lands on
    free bytes and frees live ones; returns the maximal free runs before the last (failed or KV) allocation."""
    used, live, runs = bytearray(replay.capacity), {}, None
    for e in replay.events:
        if e.op == "fail" or e.name in ("kv_cache", "activations"):
            runs = free_runs(used)
        if e.op == "alloc":
            assert not any(used[e.offset:e.offset + e.size]) and e.offset + e.size <= replay.capacity
            used[e.offset:e.offset + e.size] = b"\1" * e.size
            live[e.offset] = e.size
        elif e.op == "free":
            assert live.pop(e.offset) == e.size
            used[e.offset:e.offset + e.size] = bytes(e.size)
        assert e.free_bytes == used.count(0)
    return runs


def free_runs(used):
    """Lengths of the maximal runs of free (0) bytes, in address order."""
    return [len(list(run)) for used_byte, run in itertools.groupby(used) if not used_byte]


def test_naive_load_fails_with_enough_bytes_free_and_the_plan_fits():
    fp32 = {k: v.numel() * 4 for k, v in model_tensors(torch.float32).items()}
    kv = 64 * 1024
    plan = A.plan_arena({k: n // 2 for k, n in fp32.items()}, kv, 256)
    naive = A.replay_naive_load(fp32, kv, plan.total)
    runs = byte_map_check(naive)
    assert not naive.fits and naive.failed == "kv_cache" and naive.failed_size == kv and naive.fragmented
    assert sum(runs) == naive.free_bytes >= kv > max(runs) == naive.largest_hole  # the failure is real
    assert [n for _, n in naive.holes] == runs
    assert naive.peak_bytes > sum(n // 2 for n in fp32.values())  # the temporaries came on top
    planned = A.replay_planned(plan)
    byte_map_check(planned)
    assert planned.fits and planned.kv_offset == plan.kv.offset and planned.failed is None
    offsets = {e.name: e.offset for e in planned.events if e.op == "alloc"}
    assert offsets == {**{r.name: r.offset for r in plan.weights}, "kv_cache": plan.kv.offset,
                       "activations": plan.activations.offset}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 400).map(lambda n: 4 * n), min_size=1, max_size=12), st.integers(1, 3000),
       st.integers(0, 2000), st.integers(1, 3), aligns, st.sampled_from(["first_fit", "best_fit"]))
def test_replays_agree_with_the_byte_map(sizes, kv, act, in_flight, a, policy):
    tensors = {f"t{i}": n for i, n in enumerate(sizes)}
    plan = A.plan_arena({k: n // 2 for k, n in tensors.items()}, kv, act, alignment=a)
    naive = A.replay_naive_load(tensors, kv, plan.total, act, in_flight=in_flight, alignment=a, policy=policy)
    runs = byte_map_check(naive)
    assert naive.fits == (naive.failed is None)
    if not naive.fits:  # it failed because no run of free bytes was large enough
        assert max(runs, default=0) < naive.failed_size and naive.fragmented == (sum(runs) >= naive.failed_size)
        assert [n for _, n in naive.holes] == runs
    planned = A.replay_planned(plan, policy=policy)  # exactly enough
    assert planned.fits and planned.events[-1].free_bytes == 0 and planned.kv_offset == plan.kv.offset
    too_small = A.replay_planned(plan, capacity=plan.total - 1, policy=policy)
    assert not too_small.fits and not too_small.fragmented
    assert too_small.failed == ("activations" if act else "kv_cache")


def test_a_tensor_parallel_rank_of_the_released_size_fragments():
    """TinyVLM's own size at TP=2: each whole FP32 tensor read, the rank's BF16 slice kept; the arena sized by
    the footprint (labkit.day0.plan)."""
    cfg = TinyVLMConfig()
    with torch.device("meta"):
        state = TinyVLM(cfg).state_dict()
    styles = {n: s for n, s in tp_plan(cfg).items() if s != "encoder"}
    stored = {n: state[n].numel() * 4 for n in sorted(styles)}  # safetensors' file order: sorted names
    kept = {n: state[n].numel() * 2 // (1 if styles[n] == "replicated" else 2) for n in stored}
    f = footprint(cfg, tp=2)
    plan = A.plan_arena(kept, f["kv_cache"], f["activations"])
    naive = A.replay_naive_load(stored, f["kv_cache"], plan.total, f["activations"], loaded=kept)
    runs = byte_map_check(naive)
    assert naive.fragmented and max(runs) < naive.failed_size <= sum(runs)
    assert A.replay_planned(plan).fits


def test_replay_refusals():
    assert_refused(lambda: A.replay_naive_load({"a": 8}, 8, 100, loaded={"b": 4}), ValueError, "loaded", ["a", "b"],
                   "exactly the names")
    assert_refused(lambda: A.replay_naive_load({"a": 6}, 8, 100), ValueError, "tensors['a']", 6, "multiple of")
    assert_refused(lambda: A.replay_naive_load({"a": 8}, 0, 100), ValueError, "kv_bytes", 0, "positive int")
    assert_refused(lambda: A.replay_naive_load({"a": 8}, 8, 100, in_flight=0), ValueError, "in_flight", 0, "positive")
    assert_refused(lambda: A.replay_naive_load({"a": 8}, 8, 100, policy="worst"), ValueError, "policy", "worst",
                   "one of")
    plan = A.plan_arena({"a": 8}, 0, 8)
    assert_refused(lambda: A.replay_planned(plan), ValueError, "plan", "an ArenaPlan with kv_bytes=0", "KV region")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_device_arena_takes_host_tensors():
    tensors = model_tensors()
    arena = A.Arena(A.plan_arena({k: v.numel() * 2 for k, v in tensors.items()}, 4096, 0), device="cuda")
    for k, v in tensors.items():
        out = arena.place(k, v)
        assert out.is_cuda and arena.holds(out) and torch.equal(out.cpu(), v)


def test_the_loader_fills_a_rank_arena_from_the_release(tmp_path):
    cfg = small_config()
    torch.manual_seed(0)
    write_release(TinyVLM(cfg).state_dict(), cfg, tmp_path, max_shard_size="40KB")
    release = read_release(tmp_path)
    in_file_order = sorted(release.tensors.items(), key=lambda kv: (kv[1].file, kv[1].start))
    assert A.tensor_sizes(in_file_order) == {n: t.nbytes for n, t in in_file_order}  # release entries accepted
    f = footprint(cfg, tp=2)
    plan = A.plan_arena(placed_sizes(tmp_path, 1, 2, torch.bfloat16), f["kv_cache"], f["activations"])
    arena = A.Arena(plan)
    placed, _ = load_rank(tmp_path, 1, 2, dtype=torch.bfloat16, threads=2, arena=arena)
    plain, _ = load_rank(tmp_path, 1, 2, dtype=torch.bfloat16, threads=1)
    assert arena.missing() == [] and placed.keys() == plain.keys()
    assert all(arena.holds(placed[k]) and torch.equal(placed[k], plain[k]) for k in plain)
    assert plan.weight_bytes == f["decoder_weights"]


class ArenaMachine(RuleBasedStateMachine):
    """Placements, refused placements and writes to the KV and activation regions in any order: the arena
    always holds exactly the tensors placed, intact, and names the others missing."""

    SHAPES = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((2, 2, 2), torch.int8), ((1,), torch.float16),
              ((4, 3), torch.int64)]

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.tensors = {f"t{i}": (torch.randn(shape, generator=g) * 20).to(dt) for i, (shape, dt) in
                        enumerate(self.SHAPES)}
        self.arena = A.Arena(A.plan_arena({k: v.numel() * v.element_size() for k, v in self.tensors.items()}, 40, 24))
        self.placed = set()

    @rule(i=st.integers(0, len(SHAPES) - 1))
    def place(self, i):
        name = f"t{i}"
        if name in self.placed:
            with pytest.raises(ValueError, match="not placed yet"):
                self.arena.place(name, self.tensors[name])
        else:
            assert torch.equal(self.arena.place(name, self.tensors[name]), self.tensors[name])
            self.placed.add(name)

    @rule(i=st.integers(0, len(SHAPES) - 1), extra=st.integers(1, 3))
    def place_wrong_size(self, i, extra):
        t = self.tensors[f"t{i}"]
        with pytest.raises(ValueError, match="the size planned for"):
            self.arena.place(f"t{i}", torch.zeros(t.numel() + extra, dtype=t.dtype))

    @rule(i=st.integers(0, len(SHAPES) - 1))
    def discard(self, i):
        name = f"t{i}"
        if name in self.placed:
            self.arena.discard(name)
            self.placed.remove(name)
        else:
            with pytest.raises(ValueError, match="a tensor placed in this arena"):
                self.arena.discard(name)

    @rule(value=st.integers(0, 255))
    def write_the_other_regions(self, value):
        self.arena.kv_region().fill_(value)
        self.arena.activation_region().fill_(255 - value)

    @invariant()
    def holds_exactly_what_was_placed(self):
        assert set(self.arena.missing()) == set(self.tensors) - self.placed
        assert all(torch.equal(reread(self.arena, n, self.tensors[n]), self.tensors[n]) for n in self.placed)


TestArenaMachine = ArenaMachine.TestCase
TestArenaMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
