"""TinyLM's decode step as an aten graph, its ops, and the groups of ops a compiler fuses (notebook 08, part 1).

    capture_decode(model, cached=16)      make_fx (real tracing) over the model's own modules:
        tokens [B, 1] -> tok_emb -> Block 0..L-1 (a KVCache whose k, v are graph inputs) -> norm -> lm_head -> logits
    op_table(gm)                          (aten op, kind, count): what one decode step executes
    fusion_groups(gm)                     connected pointwise/reduction/copy chains between matmul/attention
                                          anchors, labelled "rmsnorm", "rotary", "swiglu", "residual", ...
    fused_kernels(groups)                 one kernel per anchor depth (vertical + horizontal fusion)
    check_inputs(gm, inputs)              refuses inputs unlike the traced ones (count, type, shape, dtype)

Why the parts and not `model.forward`: forward checks its input values (`tokens.min() < 0`), a data-dependent
branch make_fx refuses; the parts are forward's own, called unchanged: model.rope, tok_emb, the blocks through
model.run_blocks (the loop forward calls, labkit.tinylm.model.run_blocks, with a KVCache), norm, lm_head.
The cache's k and v tensors are graph inputs: the step writes the new token's keys and values into them in
place (aten.copy_ into a slice), so run a captured graph on copies (Decode.fresh_inputs) to repeat it.
A graph is specialised to its `cached` length: the rotary positions, the cache slot copy_ writes and the
attention length are constants in it, and k, v have the max_len shape whatever the length, so a cache of
another length gives wrong logits without an error. One graph per length (or per length bucket, padded and
masked), as CUDA-graph runners capture them.

What inductor fuses, measured on the pretrained TinyLM (torch 2.13, CPU, one decode step at 16 cached
positions, torch._inductor.compile of this graph, labkit.cluster.compiled.inductor_kernels): 17 kernel
launches = 4 per layer + 1, the same count and order as fused_kernels(): rmsnorm | rotary (q), rotary + cache
write + repeat kv (k), cache write + repeat kv (v): three groups at one depth, one loop nest in inductor |
residual + rmsnorm | swiglu, ..., and residual + the final rmsnorm. Matmuls and attention stay library calls
(extern mm, the CPU flash-attention kernel). Honest differences: inductor also folds the embedding gather into
the first rmsnorm kernel (here it is an "other" op, outside every group); it picks horizontal fusions by its own
heuristics (shared reads, loop sizes), the depth rule here only matches it on this model; and
torch._inductor.metrics.generated_kernel_count says 65 for this graph: it counts the kernel objects the code
generator created, not launches (9 distinct kernels after de-duplication, 17 calls).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .._checks import check_int, check_positive_int, check_type, fail
from ..tinylm import KVCache, TinyLM

KINDS = ("matmul", "attention", "pointwise", "reduction", "view", "copy", "other")
ANCHORS = ("matmul", "attention")  # library kernels: fusion stops at them
FUSIBLE = ("pointwise", "reduction", "copy")
MATMULS = {"mm", "bmm", "addmm", "matmul", "linear", "baddbmm"}
REDUCTIONS = {"mean", "sum", "amax", "amin", "max", "min", "prod", "var", "std", "_softmax", "softmax",
              "_log_softmax", "logsumexp", "argmax", "argmin"}
COPIES = {"copy_", "clone", "_to_copy", "contiguous", "copy"}
VIEWS = {"_unsafe_view", "getitem", "alias", "detach"}
LABELS = ("residual", "rmsnorm", "rotary", "swiglu", "cache write", "repeat kv")  # the order inside a label


@dataclass
class Decode:
    """One captured decode step: `graph_module(tokens, k, v)` returns the logits [B, 1, vocab] of `tokens`
    [B, 1] continuing `cached` positions held in k, v [n_layers, B, n_kv_heads, max_len, head_dim].
    Specialised to `cached`: the positions, the slot the new keys and values are written to and the attention
    length are baked in, so k, v holding another number of positions give wrong logits silently (their shape
    is the same; run() always uses the captured inputs). Capture one Decode per length."""
    graph_module: torch.fx.GraphModule
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    cached: int
    model: TinyLM

    def fresh_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, k copy, v copy): the graph writes into k and v, so each run gets its own copies."""
        tokens, k, v = self.inputs
        return tokens, k.clone(), v.clone()

    def run(self) -> torch.Tensor:
        """The graph's logits [B, 1, vocab] (equal to eager `model(tokens, cache)` within float rounding)."""
        with torch.no_grad():
            return self.graph_module(*self.fresh_inputs())

    def cache(self) -> KVCache:
        """A KVCache holding the captured state (a copy): `model(tokens, decode.cache())` is the eager step."""
        c = KVCache(self.model.cfg, batch_size=self.inputs[0].shape[0], dtype=self.inputs[1].dtype)
        _, c.k, c.v = self.fresh_inputs()
        c.length = self.cached
        return c


def capture_decode(model: TinyLM, cached: int = 16, batch: int = 1, seed: int = 0) -> Decode:
    """Trace one decode step of `model` after `cached` positions (random tokens from `seed`, prefilled with the
    model's own forward) for a batch of `batch` sequences. About 400 aten nodes for the course TinyLM.
    The graph is only valid at `cached` positions (see Decode): capture again for another length."""
    check_type("model", model, TinyLM, "a TinyLM")
    cfg = model.cfg
    check_int("cached", cached, 0, cfg.max_seq_len - 1, "positions already in the cache")
    check_positive_int("batch", batch)
    check_int("seed", seed)
    dtype = model.tok_emb.weight.dtype
    gen = torch.Generator().manual_seed(seed)
    prefill = KVCache(cfg, batch_size=batch, dtype=dtype)
    with torch.no_grad():
        if cached:
            model(torch.randint(0, cfg.vocab_size, (batch, cached), generator=gen), prefill)
    tokens = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen)  # [B, 1]
    shell = KVCache(cfg, batch_size=batch, max_len=1, dtype=dtype)  # its k, v become the traced inputs

    def step(tokens, k, v):
        shell.k, shell.v, shell.length = k, v, cached
        cos, sin, start = model.rope(tokens, shell)
        x = model.run_blocks(model.layers, model.tok_emb(tokens), cos, sin, shell, start)  # forward's own loop
        return model.lm_head(model.norm(x))

    with torch.no_grad():
        gm = make_fx(step, tracing_mode="real")(tokens, prefill.k.clone(), prefill.v.clone())
    return Decode(gm, (tokens, prefill.k, prefill.v), cached, model)


def _check_gm(gm) -> torch.fx.GraphModule:
    return check_type("gm", gm, torch.fx.GraphModule, "a torch.fx.GraphModule (capture_decode(...).graph_module)")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def check_inputs(gm: torch.fx.GraphModule, inputs) -> tuple:
    """`inputs` as a tuple, refused by name unless it holds one value per placeholder of `gm` and, where make_fx
    recorded a placeholder's value (node.meta["val"]), a tensor of its shape and dtype: a graph traced at one
    shape fails inside an aten kernel, or computes garbage, at another. (Used by labkit.cluster.buffers and
    compiled.inductor_kernels.)"""
    _check_gm(gm)
    check_type("inputs", inputs, (tuple, list), "a tuple of the graph's inputs (capture_decode(...).inputs)")
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(inputs) != len(holders):
        fail("inputs", f"{len(inputs)} values", f"{len(holders)} values, one per graph input")
    for i, (x, node) in enumerate(zip(inputs, holders)):
        want = node.meta.get("val")
        if not isinstance(want, torch.Tensor):
            continue  # a hand-built graph records nothing to compare with
        where = f"inputs[{i}], placeholder {node.name}"
        if not isinstance(x, torch.Tensor):
            fail("inputs", x, f"a tensor ({_describe(want)}) at {where}", TypeError)
        if x.shape != want.shape or x.dtype != want.dtype:
            fail("inputs", f"{where}: {_describe(x)}", f"tensors as traced: {_describe(want)} at {where}")
    return tuple(inputs)


def op_name(node: torch.fx.Node) -> str:
    """'aten.mm.default' for an aten call, 'getitem' for picking one result of a multi-output op."""
    return node.target.__name__ if getattr(node.target, "__module__", None) == "_operator" else str(node.target)


def op_kind(node: torch.fx.Node) -> str:
    """One of KINDS for a call_function node (aten's own tags say pointwise / reduction / view)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return "view" if op_name(node) in VIEWS else "other"
    name = target.overloadpacket.__name__
    if name in MATMULS:
        return "matmul"
    if "scaled_dot_product" in name or "attention" in name:
        return "attention"
    if name in COPIES:  # an in-place pointwise op (add_, mul_) keeps its pointwise tag below
        return "copy"
    if name == "cat" or torch.Tag.pointwise in target.tags:  # inductor lowers a small cat as a pointwise gather
        return "pointwise"
    if name in REDUCTIONS or torch.Tag.reduction in target.tags:
        return "reduction"
    if target.is_view or name in VIEWS:
        return "view"
    return "other"


def op_table(gm: torch.fx.GraphModule) -> list[tuple[str, str, int]]:
    """(aten op, kind, count) of every op the graph calls, most frequent first."""
    counts = Counter((op_name(n), op_kind(n)) for n in _check_gm(gm).graph.nodes if n.op == "call_function")
    return sorted(((op, kind, c) for (op, kind), c in counts.items()), key=lambda r: (-r[2], r[0]))


@dataclass(frozen=True)
class FusionGroup:
    """Connected fusible nodes (pointwise, reduction, copy; views pass through) with no anchor (matmul or
    attention) between them: one kernel for a fusing compiler. `depth`: anchors on the longest path from the
    graph's inputs (groups at one depth sit between the same anchors)."""
    label: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    depth: int


def _root(node):
    """The node whose storage `node` views (follows view ops back to a non-view)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and op_kind(node) == "view":
        node = node.args[0]
    return node


def _packet(node) -> str:
    return getattr(node.target, "overloadpacket", node.target).__name__ if node.op == "call_function" else ""


def _label(members: list[torch.fx.Node]) -> str:
    ops = {_packet(n) for n in members}
    found = set()
    for n in members:
        args = [a for a in n.args if isinstance(a, torch.fx.Node)]
        if _packet(n) == "add" and len(args) == 2 and any(
                _root(a).op == "call_function" and op_kind(_root(a)) in ANCHORS for a in args):
            found.add("residual")  # a matmul's output added to the stream
        if _written(n) is not None:
            found.add("cache write")  # the new keys or values written into the cache input
        if _packet(n) == "clone" and args and _packet(args[0]) == "expand":
            found.add("repeat kv")  # grouped-query attention: each key/value head copied for its query heads
    found |= {"rmsnorm"} if {"pow", "mean", "rsqrt"} <= ops else set()
    found |= {"rotary"} if {"neg", "cat", "mul", "add"} <= ops else set()
    found |= {"swiglu"} if {"silu", "mul"} <= ops else set()
    return "+".join(x for x in LABELS if x in found) or "+".join(sorted(ops))


def _dependencies(n: torch.fx.Node, writes: dict) -> list[torch.fx.Node]:
    """The nodes `n` reads (through views), and the last copy_ into any graph input it reads: fx draws no
    edge from the write into the cache to the later read of the cache, so it is added here."""
    roots = [_root(a) for a in n.all_input_nodes]
    return roots + [writes[r] for r in roots if r in writes and writes[r] is not n]


def _written(n: torch.fx.Node):
    """The graph input a copy_ node writes into (the KV cache), else None."""
    if n.op == "call_function" and _packet(n) == "copy_" and _root(n.args[0]).op == "placeholder":
        return _root(n.args[0])
    return None


def _depths(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, int]:
    """Anchors on the longest path from the graph's inputs to each node."""
    depth, writes = {}, {}
    for n in gm.graph.nodes:
        depth[n] = max((depth[a] + (a.op == "call_function" and op_kind(a) in ANCHORS)
                        for a in _dependencies(n, writes)), default=0)
        if _written(n) is not None:
            writes[_written(n)] = n
    return depth


def fusion_groups(gm: torch.fx.GraphModule) -> list[FusionGroup]:
    """The fusible groups of the graph, in execution order. A fusible node joins the fusible nodes it reads
    (through views) when both sit at the same anchor depth, so that no anchor lies between them on any path:
    a value that must exist before a matmul runs and is read again after it (the residual stream between
    blocks) is stored to memory anyway. Groups at one depth do not read each other: see fused_kernels."""
    depth, parent, writes = _depths(_check_gm(gm)), {}, {}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in gm.graph.nodes:
        if n.op != "call_function" or op_kind(n) not in FUSIBLE:
            continue
        parent[n] = n
        for r in _dependencies(n, writes):
            if r in parent and depth[r] == depth[n]:
                parent[find(r)] = find(n)
        if _written(n) is not None:
            writes[_written(n)] = n
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in parent:  # dict order = execution order
        groups.setdefault(find(n), []).append(n)
    order = {n: i for i, n in enumerate(parent)}
    return [FusionGroup(_label(m), tuple(x.name for x in m), tuple(sorted({_packet(x) for x in m})), depth[m[0]])
            for m in sorted(groups.values(), key=lambda m: order[m[0]])]


def fused_kernels(groups: list[FusionGroup]) -> list[str]:
    """One label per anchor depth that has fusible work, its groups' labels joined by " | ": the kernels a compiler
    launches when it also fuses independent groups between the same two anchors (inductor's CPU backend
    does: 17 for TinyLM's decode step, see the module docstring)."""
    if not isinstance(groups, list) or not all(isinstance(g, FusionGroup) for g in groups):
        fail("groups", groups, "a list of FusionGroup (fusion_groups(gm))", TypeError)
    by_depth: dict[int, list[str]] = {}
    for g in groups:
        by_depth.setdefault(g.depth, []).append(g.label)
    return [" | ".join(labels) for _, labels in sorted(by_depth.items())]
