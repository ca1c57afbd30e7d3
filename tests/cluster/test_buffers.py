"""labkit.cluster.buffers: liveness and the planned peaks agree with torch's own allocator accounting, and the
planner never lets two live buffers share a byte (hypothesis, a byte-grid painting and an exhaustive optimum
on small cases as the independent references)."""
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from labkit.cluster.buffers import (Buffer, BufferPlan, allocator_peak, check_plan, liveness, measured_peak,
                                    memory_events, peak_live, plan_buffers)
from labkit.cluster.graph import capture_decode
from labkit.tinylm import TinyLM, TinyLMConfig, load_pretrained

from ..refusals import assert_refused


@pytest.fixture(scope="module")
def pretrained() -> TinyLM:
    return load_pretrained()[0]


def attention_scratch(cfg: TinyLMConfig, cached: int) -> int:
    """Bytes the CPU attention kernel allocates and frees inside one call at this length (measured alone,
    with the same profiler): the only allocations no graph value accounts for."""
    q = torch.randn(1, cfg.n_heads, 1, cfg.head_dim)
    k = torch.randn(1, cfg.n_heads, cached + 1, cfg.head_dim)
    attend = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    out, lse = attend(q, k, k)
    return allocator_peak(lambda: attend(q, k, k)) - out.untyped_storage().nbytes() - lse.untyped_storage().nbytes()


def test_the_profiler_still_lists_memory_events_in_order():
    """memory_events reads torch's private kineto_results: this fails the day a torch release changes it."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a, b
    try:
        events = memory_events(prof)
    except AttributeError as e:
        pytest.fail(f"torch {torch.__version__} changed its profiler's private kineto_results ({e}): "
                    "labkit.cluster.buffers.memory_events needs another way to the memory events in order")
    assert events == [4000, 8000, -4000, -8000], f"torch {torch.__version__}: memory events {events}"


def test_allocator_peak_reads_known_allocations():
    def work():
        a = torch.empty(1000)  # 4000 bytes
        del a
        b, c = torch.empty(500), torch.empty(300)  # 3200 bytes alive together
        return b, c

    assert allocator_peak(work) == 4000
    assert allocator_peak(lambda: [torch.empty(250) for _ in range(3)]) == 3000  # the list keeps all three


@pytest.mark.parametrize("cached", [0, 16, 200])
def test_planned_peaks_match_torchs_accounting(pretrained, cached):
    """With freeing at last use the allocator's peak is the planned peak plus at most one op's internal scratch
    (torch's CPU allocator reports the bytes asked for, unrounded, so alignment=1 is the comparable plan);
    keeping every value, it is the sum of all activations plus at most that scratch."""
    decode = capture_decode(pretrained, cached=cached)
    plan = plan_buffers(liveness(decode.graph_module, decode.inputs), alignment=1)
    scratch = attention_scratch(pretrained.cfg, cached)
    freed = measured_peak(decode.graph_module, decode.inputs, reuse=True)
    kept = measured_peak(decode.graph_module, decode.inputs, reuse=False)
    assert 0 <= freed - plan.peak_live_bytes <= scratch, (freed, plan.peak_live_bytes, scratch)
    assert 0 <= kept - plan.no_reuse_bytes <= scratch, (kept, plan.no_reuse_bytes, scratch)
    assert plan.peak_live_bytes < plan.no_reuse_bytes / 3  # reuse is the point: TinyLM's step keeps few values


def test_liveness_follows_the_graph():
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=32))
    decode = capture_decode(model, cached=3)
    gm = decode.graph_module
    nodes = list(gm.graph.nodes)
    k_before = decode.inputs[1].clone()
    buffers = liveness(gm, decode.inputs)
    assert torch.equal(decode.inputs[1], k_before)  # the run wrote into copies
    by_name = {b.name: b for b in buffers}
    kinds = {n.name: n for n in nodes}
    for b in buffers:
        node = kinds[b.name.split("[")[0]]
        assert node.op == "call_function" and nodes.index(node) == b.first
        assert node.target not in (torch.ops.aten.view.default, torch.ops.aten.copy_.default)
        val = node.meta["val"]
        if isinstance(val, torch.Tensor):  # make_fx's record of the value: its size, independent of the run
            assert b.nbytes == val.numel() * val.element_size()
    assert not {n.name for n in nodes if n.op in ("placeholder", "get_attr")} & set(by_name)
    logits = nodes[-1].args[0][0] if isinstance(nodes[-1].args[0], (list, tuple)) else nodes[-1].args[0]
    while logits.name not in by_name:  # the output is a view of the lm_head's matmul
        logits = logits.args[0]
    assert by_name[logits.name].last == len(nodes) - 1
    # a view extends its base's life: the base buffer lives at least as long as every view's reader
    for n in nodes:
        if n.target == torch.ops.aten._unsafe_view.default and n.args[0].name in by_name:
            assert by_name[n.args[0].name].last >= max(nodes.index(u) for u in n.users)


def paint(buffers, plan) -> None:
    """Brute force: mark every (step, byte) cell each buffer occupies; no cell twice."""
    cells = set()
    for b in buffers:
        start = plan.offsets[b.name]
        for step in range(b.first, b.last + 1):
            for byte in range(start, start + plan.size(b)):
                assert (step, byte) not in cells, f"{b.name} overlaps at step {step}, byte {byte}"
                cells.add((step, byte))


intervals = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=14)


def as_buffers(spec) -> list[Buffer]:
    return [Buffer(f"b{i}", size, first, first + length) for i, (size, first, length) in enumerate(spec)]


@settings(max_examples=150, deadline=None)
@given(intervals, st.sampled_from([1, 4, 16]))
def test_plan_never_overlaps_live_buffers(spec, alignment):
    buffers = as_buffers(spec)
    plan = plan_buffers(buffers, alignment)
    check_plan(buffers, plan)
    paint(buffers, plan)
    assert all(o % alignment == 0 for o in plan.offsets.values())
    assert plan.peak_live_bytes <= plan.arena_bytes <= plan.no_reuse_bytes
    steps = range(min(b.first for b in buffers), max(b.last for b in buffers) + 1)
    assert plan.peak_live_bytes == max(sum(plan.size(b) for b in buffers if b.first <= s <= b.last) for s in steps)
    assert plan.no_reuse_bytes == sum(plan.size(b) for b in buffers)


def optimal_arena(buffers) -> int:
    """Exhaustive search over every offset of every buffer (sizes in bytes, alignment 1): the true optimum."""
    best = sum(b.nbytes for b in buffers)

    def place(i, offsets):
        nonlocal best
        if i == len(buffers):
            best = min(best, max(o + b.nbytes for o, b in zip(offsets, buffers)))
            return
        b = buffers[i]
        for o in range(best - b.nbytes + 1):
            if all(not (b.overlaps(c) and o < oc + c.nbytes and oc < o + b.nbytes) for oc, c in zip(offsets, buffers)):
                place(i + 1, offsets + [o])

    place(0, [])
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4), st.integers(0, 3)), min_size=1, max_size=5))
def test_greedy_plan_against_the_exhaustive_optimum(spec):
    buffers = as_buffers(spec)
    plan = plan_buffers(buffers, alignment=1)
    assert plan.peak_live_bytes <= optimal_arena(buffers) <= plan.arena_bytes


def test_greedy_by_size_is_a_heuristic():
    """Largest first puts d on a's bytes (never alive together), then c finds no gap under b: 10 bytes where
    the optimum (a at 0, b at 5, c at 0, d at 2) is the peak, 8."""
    buffers = [Buffer("a", 5, 0, 2), Buffer("b", 3, 2, 4), Buffer("c", 2, 3, 6), Buffer("d", 5, 5, 7)]
    plan = plan_buffers(buffers, alignment=1)
    assert plan.offsets == {"a": 0, "d": 0, "b": 5, "c": 8}
    assert (plan.peak_live_bytes, plan.arena_bytes, plan.no_reuse_bytes) == (8, 10, 15)
    assert optimal_arena(buffers) == 8


def test_check_plan_names_the_two_buffers():
    buffers = [Buffer("x", 64, 0, 3), Buffer("y", 64, 2, 5), Buffer("z", 64, 4, 6)]
    bad = BufferPlan({"x": 0, "y": 32, "z": 128}, 192, 192, 128, 1)
    with pytest.raises(ValueError, match=r"plan must be .*got .*x \[0, 64\) and y \[32, 96\)"):
        check_plan(buffers, bad)
    with pytest.raises(ValueError, match="z at offset None"):
        check_plan(buffers, BufferPlan({"x": 0, "y": 64}, 192, 192, 128, 1))
    check_plan(buffers, BufferPlan({"x": 0, "y": 64, "z": 0}, 128, 192, 128, 1))  # x and z never meet


def test_bad_input_is_refused_by_name():
    b = Buffer("a", 8, 0, 1)
    assert_refused(lambda: Buffer("a", 0, 0, 1), ValueError, "nbytes", 0, "a positive int")
    assert_refused(lambda: Buffer("a", 8, 3, 1), ValueError, "last", 1, ">= 3")
    assert_refused(lambda: Buffer(1, 8, 0, 1), TypeError, "name", 1, "str")
    assert_refused(lambda: plan_buffers([b, "c"]), TypeError, "buffers", [b, "c"], "a list of Buffer")
    assert_refused(lambda: plan_buffers([b, b]), ValueError, "buffers", "a", "unique names")
    assert_refused(lambda: plan_buffers([b], alignment=0), ValueError, "alignment", 0, "a positive int")
    assert_refused(lambda: peak_live("b"), TypeError, "buffers", "b", "a list of Buffer")
    assert_refused(lambda: check_plan([b], {"a": 0}), TypeError, "plan", {"a": 0}, "a BufferPlan")
    assert_refused(lambda: allocator_peak(3), TypeError, "fn", 3, "a callable")
    torch.manual_seed(0)
    decode = capture_decode(TinyLM(TinyLMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=8,
                                                max_seq_len=8)), cached=2)
    gm = decode.graph_module
    assert_refused(lambda: liveness("gm", decode.inputs), TypeError, "gm", "gm", "torch.fx.GraphModule")
    assert_refused(lambda: liveness(gm, decode.inputs[:2]), ValueError, "inputs", "2 values", "3 values")
    assert_refused(lambda: measured_peak(gm, decode.inputs, reuse="yes"), TypeError, "reuse", "yes", "True or False")
    tokens, k, v = decode.inputs
    assert_refused(lambda: liveness(gm, (1, 2, 3)), TypeError, "inputs", 1, "a tensor (int64 [1, 1]) at inputs[0]")
    assert_refused(lambda: measured_peak(gm, (tokens, k[..., :4], v)), ValueError, "inputs",
                   "inputs[1], placeholder k_1: float32 [1, 1, 1, 8, 4]", "float32 [1, 1, 1, 8, 8] at inputs[1]")
    assert_refused(lambda: liveness(gm, (tokens.float(), k, v)), ValueError, "inputs",
                   "inputs[0], placeholder tokens_1: float32 [1, 1]", "int64 [1, 1] at inputs[0]")
    assert_refused(lambda: BufferPlan({"a": "0"}, 8, 8, 8, 1), TypeError, "offsets['a']", "0", "a non-negative int")
    assert_refused(lambda: BufferPlan({"a": -8}, 8, 8, 8, 1), ValueError, "offsets['a']", -8, "a non-negative int")
    assert_refused(lambda: BufferPlan({1: 0}, 8, 8, 8, 1), TypeError, "offsets", 1, "keyed by buffer name")
    assert_refused(lambda: BufferPlan({"a": 0}, 8, 8, 8, 0), ValueError, "alignment", 0, "a positive int")
    assert_refused(lambda: BufferPlan({"a": 0}, 8, 8.0, 8, 1), TypeError, "no_reuse_bytes", 8.0, "int")
    changed = plan_buffers([b])
    changed.offsets["a"] = "0"  # offsets is a dict: check_plan checks it again
    assert_refused(lambda: check_plan([b], changed), TypeError, "offsets['a']", "0", "a non-negative int")
    assert peak_live([]) == 0 and plan_buffers([]).arena_bytes == 0
    assert liveness(gm, decode.inputs)  # a real graph has activations
