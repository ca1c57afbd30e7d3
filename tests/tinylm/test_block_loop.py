"""labkit.tinylm.model.run_blocks is the one loop over TinyLM's blocks: no other labkit module runs blocks (ast),
checkpointing (model.checkpoint_every) and the compile choice (compile_blocks_apart) are the model's own, and
both give the plain forward's logits and gradients (reference: the same model with neither)."""
import ast
import copy
from pathlib import Path

import pytest
import torch

from labkit import tinylm as lm
from labkit.tinylm import model as model_py

from ..refusals import assert_refused
from .models import small_model

LABKIT = Path(lm.__file__).resolve().parent.parent
OWNER = "tinylm/model.py"  # the one module that runs blocks
# A module that runs blocks of another model: (path under labkit/, the function) -> why it is not TinyLM's loop.
OTHER_MODELS = {("day0/model.py", "VisionTower.forward"): "the ViT image encoder's own blocks"}
BLOCKS = {"layers", "blocks"}
# Recomputing a block runs the same ops in the same order: equal to the bit in practice; 1e-6 leaves room for a
# different thread split of a reduction.
ATOL = 1e-6


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _mentions_blocks(node: ast.AST) -> bool:  # model.layers, enumerate(self.blocks), m.layers[1:], ...
    return any(isinstance(n, ast.Attribute) and n.attr in BLOCKS for n in ast.walk(node))


def _is_blocks(node: ast.AST) -> bool:  # model.layers, or a list named layers / blocks
    return isinstance(node, ast.Attribute) and node.attr in BLOCKS or isinstance(node, ast.Name) and node.id in BLOCKS


def block_runs(source: str) -> list[tuple[int, str]]:
    """(line, function) of every place in `source` that runs a block: calls a name bound by a loop or
    comprehension over a model's `.layers` / `.blocks` (block(x), block.forward(x), checkpoint(block, x)), or
    calls an indexed block (model.layers[i](x), layers[i](x), checkpoint(layers[i], x)). Hooks, copies and
    attribute swaps on blocks are not runs, nor loops over lists of other modules."""
    tree = ast.parse(source)
    where: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.ClassDef):
            for item in fn.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    where.update({n: f"{fn.name}.{item.name}" for n in ast.walk(item)})
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                where.setdefault(n, fn.name)
    loops = []  # (names bound to blocks, the nodes where they are blocks)
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and _mentions_blocks(node.iter):
            loops.append((_names(node.target), node.body))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            bound = set().union(*(_names(g.target) for g in node.generators if _mentions_blocks(g.iter)))
            if bound:
                body = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
                loops.append((bound, body + [c for g in node.generators for c in g.ifs]))

    def runs(call: ast.Call, bound: set[str]) -> bool:
        f = call.func
        target = call.args[0] if call.args and (
            isinstance(f, ast.Name) and f.id == "checkpoint" or isinstance(f, ast.Attribute) and f.attr == "checkpoint"
        ) else f
        if isinstance(target, ast.Attribute) and target.attr in ("forward", "__call__"):
            target = target.value
        return (isinstance(target, ast.Name) and target.id in bound
                or isinstance(target, ast.Subscript) and _is_blocks(target.value))

    found = set()
    for bound, body in loops:
        for stmt in body:
            found |= {(n.lineno, where.get(n, "<module>")) for n in ast.walk(stmt)
                      if isinstance(n, ast.Call) and runs(n, bound)}
    found |= {(n.lineno, where.get(n, "<module>")) for n in ast.walk(tree)
              if isinstance(n, ast.Call) and runs(n, set())}
    return sorted(found)


def test_the_scan_finds_block_loops_and_leaves_hooks_and_copies_alone():
    runs = {
        "for i, block in enumerate(model.layers):\n    x = checkpoint(block, x, cos, sin)\n": [(2, "<module>")],
        "for b in self.blocks:\n    x = b(x)\n": [(2, "<module>")],
        "for b in m.layers[1:]:\n    x = b.forward(x)\n": [(2, "<module>")],
        "for i in range(len(m.layers)):\n    x = m.layers[i](x, cos, sin)\n": [(2, "<module>")],
        "def f(layers, x):\n    return layers[0](x)\n": [(2, "f")],
        "ys = [blk(x) for blk in model.layers]\n": [(1, "<module>")],
        "class S:\n    def forward(self, x):\n        return checkpoint(self.layers[2], x)\n": [(3, "S.forward")],
    }
    leaves = ["hooks = [b.attn.register_forward_hook(f) for b in model.layers]\n",
              "for block in self.layers:\n    block.attn = Other(cfg)\n",
              "copies = [copy.deepcopy(b) for b in full.layers]\n",
              "n = len(model.layers)\nx = block(x)\n",
              "ys = [m(x) for m in layers]\n"]  # a list of other modules (quant.speed's QuantLinears)
    for source, expected in runs.items():
        assert block_runs(source) == expected, source
    for source in leaves:
        assert block_runs(source) == [], source


def test_only_tinylm_model_runs_blocks():
    """The forward lives in one place: a second loop over the blocks (a hand-written forward for checkpointing,
    a stage, a captured graph) would let a change to the forward land in one copy and not the other."""
    found = {}
    for path in sorted(LABKIT.rglob("*.py")):
        rel = path.relative_to(LABKIT).as_posix()
        if rel != OWNER:
            found.update({(rel, fn): line for line, fn in block_runs(path.read_text())})
    assert set(OTHER_MODELS) <= set(found), "an exemption no longer needed: remove it from OTHER_MODELS"
    assert {k: v for k, v in found.items() if k not in OTHER_MODELS} == {}
    assert block_runs((LABKIT / OWNER).read_text()), "the scan finds run_blocks' own loop"


def _recording(monkeypatch) -> list[int]:
    """The layer index of every block run through torch's checkpoint by run_blocks."""
    seen, real = [], model_py.checkpoint

    def recording(block, *args, **kw):
        seen.append(args[4])  # block(x, cos, sin, cache, layer, start)
        return real(block, *args, **kw)

    monkeypatch.setattr(model_py, "checkpoint", recording)
    return seen


@pytest.mark.parametrize("every, blocks", [(1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3]), (5, [0])])
def test_checkpointed_forward_and_backward_equal_the_plain_ones(monkeypatch, every, blocks):
    seen = _recording(monkeypatch)
    plain = small_model(n_layers=4).train()
    ckpt = copy.deepcopy(plain)
    ckpt.checkpoint_every = every
    tokens = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(every))
    logits = [m(tokens) for m in (plain, ckpt)]
    assert seen == blocks
    for m, out in zip((plain, ckpt), logits):
        out.pow(2).mean().backward()
    assert torch.allclose(logits[1], logits[0], rtol=0, atol=ATOL)
    grads = [{n: p.grad for n, p in m.named_parameters()} for m in (plain, ckpt)]
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, rtol=0, atol=ATOL), name


def test_checkpointing_stays_out_of_inference_and_cached_steps(monkeypatch):
    seen = _recording(monkeypatch)
    m = small_model(n_layers=3)
    m.checkpoint_every = 1
    tokens = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        m(tokens)
    cache = lm.KVCache(m.cfg)
    m(tokens, cache)  # grad enabled, but recomputing would write the cache twice
    assert seen == [] and cache.length == 6
    m(tokens)
    assert seen == [0, 1, 2]


def test_checkpoint_every_refuses_what_is_not_a_count():
    m = small_model()
    assert m.checkpoint_every == 0
    assert_refused(lambda: setattr(m, "checkpoint_every", -1), ValueError, "checkpoint_every", -1, "an int >= 0")
    assert_refused(lambda: setattr(m, "checkpoint_every", 1.5), TypeError, "checkpoint_every", 1.5, "an int >= 0")
    assert m.checkpoint_every == 0


def _explain(m: lm.TinyLM) -> tuple[int, int]:
    cache = lm.KVCache(m.cfg)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3]]), cache)
        e = torch._dynamo.explain(m)(torch.tensor([[4]]), cache)
    return e.graph_count, e.graph_break_count


def test_compile_blocks_apart_is_one_model_choice_and_keeps_the_forward():
    """Each block its own graph (n_layers + 2 graphs per decode step) for the model it is applied to only; the
    model, the pipeline stage and the captured graph still run the same loop, and torch.compile's result (the
    eager backend: no C compiler needed) equals the plain forward."""
    m, other = small_model(n_layers=4), small_model(n_layers=4)
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = m(tokens)
    assert m.run_blocks is other.run_blocks is model_py.run_blocks
    assert lm.compile_blocks_apart(m) is m
    assert m.run_blocks._torchdynamo_orig_callable is model_py.run_blocks
    assert other.run_blocks is lm.run_blocks is model_py.run_blocks  # nothing global changed
    assert_refused(lambda: lm.compile_blocks_apart(3), TypeError, "model", 3, "a TinyLM")
    try:
        torch._dynamo.reset()
        assert _explain(m) == (4 + 2, 4 + 1)
        torch._dynamo.reset()
        assert _explain(other)[0] < 4 + 2  # the loop inlined: fewer graphs
        torch._dynamo.reset()
        with torch.no_grad():
            compiled = torch.compile(m, backend="eager")(tokens)
            eager = m(tokens)
    finally:
        torch._dynamo.reset()
    assert torch.allclose(compiled, plain, rtol=0, atol=ATOL) and torch.allclose(eager, plain, rtol=0, atol=ATOL)
