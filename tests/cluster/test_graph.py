"""labkit.cluster.graph: the captured decode step equals the real model's eager step (logits and the keys and
values it writes into the cache), its op counts follow from the config, and the fusion groups cover every
fusible node once, with the labels the model's structure predicts. (The cross-check against the kernels
inductor really generates is in test_compiled.py: it needs a C++ compiler.)"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from labkit.cluster.graph import (ANCHORS, FUSIBLE, KINDS, Decode, capture_decode, fused_kernels, fusion_groups,
                                  op_kind, op_table)
from labkit.tinylm import TinyLM, TinyLMConfig, load_pretrained

from ..refusals import assert_refused

# The graph calls the same aten kernels as eager, in the same order: equal to the bit in practice; 1e-5 leaves
# room for a different thread split of a reduction (CPU float sums are not order-invariant).
ATOL = 1e-5


@pytest.fixture(scope="module")
def pretrained() -> TinyLM:
    return load_pretrained()[0]


def small(n_layers=2, **kw) -> TinyLM:
    torch.manual_seed(1)
    cfg = TinyLMConfig(**{"vocab_size": 97, "d_model": 48, "n_layers": n_layers, "n_heads": 6, "n_kv_heads": 2,
                          "d_ff": 80, "max_seq_len": 40, **kw})
    return TinyLM(cfg).eval()


@pytest.mark.parametrize("cached", [0, 1, 16, 200, 255])
def test_graph_logits_equal_the_eager_model(pretrained, cached):
    decode = capture_decode(pretrained, cached=cached, seed=cached)
    tokens, k, v = decode.inputs
    cache = decode.cache()
    assert cache.length == cached and torch.equal(cache.k, k)
    with torch.no_grad():
        eager = pretrained(tokens, cache)  # the model's own forward, checks included
    args = decode.fresh_inputs()
    with torch.no_grad():
        graph = decode.graph_module(*args)
    assert graph.shape == eager.shape == (1, 1, pretrained.cfg.vocab_size)
    torch.testing.assert_close(graph, eager, atol=ATOL, rtol=0)
    torch.testing.assert_close(args[1], cache.k, atol=ATOL, rtol=0)  # the new keys written where eager writes them
    torch.testing.assert_close(args[2], cache.v, atol=ATOL, rtol=0)
    torch.testing.assert_close(decode.run(), eager, atol=ATOL, rtol=0)
    assert torch.equal(decode.inputs[1], k)  # run() works on copies: repeatable


def test_a_batch_and_untied_embeddings():
    model = small(tie_embeddings=False)
    decode = capture_decode(model, cached=5, batch=3)
    assert decode.inputs[0].shape == (3, 1)
    with torch.no_grad():
        eager = model(decode.inputs[0], decode.cache())
    torch.testing.assert_close(decode.run(), eager, atol=ATOL, rtol=0)


def test_the_graph_runs_the_loop_the_model_holds():
    """capture_decode calls the model's own run_blocks (the one forward calls), also after compile_blocks_apart
    has wrapped it for torch.compile; the graph still equals the eager step."""
    from labkit.tinylm import compile_blocks_apart
    model = compile_blocks_apart(small())
    loop, calls = model.run_blocks, []

    def recording(*args, **kw):
        calls.append(len(args[0]))
        return loop(*args, **kw)

    model.run_blocks = recording
    decode = capture_decode(model, cached=3)
    assert calls == [2, 2]  # the prefill (forward) and the traced step
    with torch.no_grad():
        eager = model(decode.inputs[0], decode.cache())
    torch.testing.assert_close(decode.run(), eager, atol=ATOL, rtol=0)


def test_a_graph_is_specialised_to_its_length():
    """Pinned, documented behaviour: the graph captured at 7 cached positions, fed a cache of 4 (same shapes),
    computes position 7's step: it writes the new keys into slot 7 and its logits are not the eager ones."""
    model = small()
    at7, at4 = capture_decode(model, cached=7), capture_decode(model, cached=4, seed=4)
    tokens, k, v = at4.fresh_inputs()
    assert k.shape == at7.inputs[1].shape  # nothing in the shapes tells the lengths apart
    with torch.no_grad():
        eager = model(tokens, at4.cache())
        wrong = at7.graph_module(tokens, k, v)
    torch.testing.assert_close(at4.run(), eager, atol=ATOL, rtol=0)  # its own graph is right
    assert (wrong - eager).abs().max() > 1e-2
    assert k[:, :, :, 7].abs().sum() > 0 and torch.equal(k[:, :, :, 4], at4.inputs[1][:, :, :, 4])  # slot 7 written


def test_in_place_ops_keep_their_kind():
    """Only copy_ (and clone/_to_copy) is a copy; add_ and mul_ are pointwise like add and mul."""
    def f(x, buf):
        y = x * 2
        y.add_(1)
        y.mul_(x)
        buf.copy_(y)
        return y.sum()

    gm = make_fx(f)(torch.randn(4), torch.zeros(4))
    kinds = {op: kind for op, kind, _ in op_table(gm)}
    assert kinds["aten.add_.Tensor"] == kinds["aten.mul_.Tensor"] == kinds["aten.mul.Tensor"] == "pointwise"
    assert kinds["aten.copy_.default"] == "copy" and kinds["aten.sum.default"] == "reduction"


def test_prefilled_cache_is_the_models_own():
    model = small()
    decode = capture_decode(model, cached=7, seed=3)
    gen = torch.Generator().manual_seed(3)  # capture_decode's documented prefill: random tokens from `seed`
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 7), generator=gen)
    cache = decode.cache()
    cache.rewind(0)
    with torch.no_grad():
        model(prompt, cache)
    torch.testing.assert_close(cache.k, decode.inputs[1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("n_layers", [1, 3])
def test_op_counts_follow_from_the_config(n_layers):
    gm = capture_decode(small(n_layers), cached=4).graph_module
    rows = op_table(gm)
    counts = {op: c for op, _, c in rows}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(counts.values()) == len(calls)
    assert all(kind in KINDS for _, kind, _ in rows)
    assert [c for _, _, c in rows] == sorted((c for _, _, c in rows), reverse=True)
    by_kind = {}
    for _, kind, c in rows:
        by_kind[kind] = by_kind.get(kind, 0) + c
    assert by_kind["matmul"] == 7 * n_layers + 1  # q, k, v, o, gate, up, down per block, then lm_head
    assert by_kind["attention"] == n_layers
    assert counts["aten.copy_.default"] == 2 * n_layers  # keys and values into the cache
    assert counts["aten.rsqrt.default"] == 2 * n_layers + 1  # two norms per block and the final one
    assert counts["aten.silu.default"] == n_layers


def test_fusion_groups_cover_each_fusible_node_once():
    gm = capture_decode(small(3), cached=4).graph_module
    groups = fusion_groups(gm)
    names = [n for g in groups for n in g.nodes]
    assert len(names) == len(set(names))
    fusible = {n.name for n in gm.graph.nodes if n.op == "call_function" and op_kind(n) in FUSIBLE}
    assert set(names) == fusible
    nodes = {n.name: n for n in gm.graph.nodes}
    assert all(op_kind(nodes[n]) not in ANCHORS for n in names)
    order = [n.name for n in gm.graph.nodes]
    firsts = [order.index(g.nodes[0]) for g in groups]
    assert firsts == sorted(firsts)


def _no_anchor_between(gm, group) -> bool:
    """Brute force: no matmul/attention node both depends on one member and is depended on by another."""
    nodes = {n.name: n for n in gm.graph.nodes}
    members = {nodes[n] for n in group.nodes}

    def downstream(n):
        seen, todo = set(), [n]
        while todo:
            for u in todo.pop().users:
                if u not in seen:
                    seen.add(u)
                    todo.append(u)
        return seen

    below = set().union(*(downstream(m) for m in members))
    anchors = {a for a in below if a.op == "call_function" and op_kind(a) in ANCHORS}
    return not any(m in downstream(a) for a in anchors for m in members)


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_labels_follow_the_model(n_layers):
    gm = capture_decode(small(n_layers), cached=4).graph_module
    groups = fusion_groups(gm)
    labels = [g.label for g in groups]
    assert labels.count("rmsnorm") == 1  # the first norm reads the embedding, no residual before it
    assert labels.count("residual+rmsnorm") == 2 * n_layers  # every later norm is fused with the add before it
    assert labels.count("swiglu") == n_layers
    assert labels.count("rotary") == n_layers  # the queries'
    assert labels.count("rotary+cache write+repeat kv") == n_layers  # the keys': rotated, stored, repeated
    assert labels.count("cache write+repeat kv") == n_layers  # the values'
    assert len(groups) == 6 * n_layers + 1
    assert all(_no_anchor_between(gm, g) for g in groups)
    kernels = fused_kernels(groups)
    assert len(kernels) == 4 * n_layers + 1  # what inductor launches (module docstring, test_compiled)
    assert kernels[1] == "rotary | rotary+cache write+repeat kv | cache write+repeat kv"


def test_bad_input_is_refused_by_name():
    model = small()
    assert_refused(lambda: capture_decode("tinylm"), TypeError, "model", "tinylm", "a TinyLM")
    assert_refused(lambda: capture_decode(model, cached=-1), ValueError, "cached", -1, "in [0, 39]")
    assert_refused(lambda: capture_decode(model, cached=40), ValueError, "cached", 40, "in [0, 39]")
    assert_refused(lambda: capture_decode(model, cached=2.0), TypeError, "cached", 2.0, "an int")
    assert_refused(lambda: capture_decode(model, batch=0), ValueError, "batch", 0, "a positive int")
    assert_refused(lambda: op_table(3), TypeError, "gm", 3, "torch.fx.GraphModule")
    assert_refused(lambda: fusion_groups(None), TypeError, "gm", None, "torch.fx.GraphModule")
    assert_refused(lambda: fused_kernels(["rmsnorm"]), TypeError, "groups", ["rmsnorm"], "FusionGroup")
    assert isinstance(capture_decode(model, cached=0), Decode)
