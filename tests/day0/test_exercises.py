"""Notebook 07's exercises: each reference passes its own check, common mistakes fail it, a stub gets the
reference, the notebook's solutions (written out here independently, as a learner would) pass, and each
reference agrees with an independent one: torch's own RMSNorm, torch.chunk, a brute-force overlap test, and
what the loader and the block manager really do."""
import pytest
import torch
import torch.nn.functional as F

from labkit.day0 import TinyVLM, exercises as ex, small_config
from labkit.day0.loading import load_full, load_rank
from labkit.day0.release import write_release
from labkit.kv_cache import BlockManager, block_hash
from labkit.rng import Rng


def qk_norm(x, weight, eps):
    rms = x.square().mean(dim=-1, keepdim=True).add(eps).sqrt()
    return x / rms * weight


def rank_part(weight, style, rank, tp):
    if style == "replicated":
        return weight
    dim = 1 if style == "row" else 0
    n = weight.shape[dim] // tp
    return weight.narrow(dim, rank * n, n)


def block_extra_keys(images, start, end):
    return tuple((h, offset - start) for offset, length, h in images if offset < end and offset + length > start)


EXERCISES = [(qk_norm, ex.QK_NORM), (rank_part, ex.RANK_PART), (block_extra_keys, ex.BLOCK_KEYS)]


@pytest.mark.parametrize("fn, exercise", EXERCISES, ids=lambda v: getattr(v, "name", ""))
def test_the_notebook_solution_and_the_reference_pass(fn, exercise, capsys):
    learner = lambda *a: exercise.reference(*a)  # noqa: E731 (the reference, as a learner's own function)
    assert exercise.check(fn) is fn and exercise.check(learner) is learner
    assert capsys.readouterr().out.count("[PASS]") == 2


@pytest.mark.parametrize("fn, exercise", [
    (lambda x, w, eps: x / (x.square().mean(-1, keepdim=True).sqrt() + eps) * w, ex.QK_NORM),  # eps outside
    (lambda x, w, eps: x * torch.rsqrt(x.square().mean(1, keepdim=True) + eps) * w, ex.QK_NORM),  # over heads
    (lambda x, w, eps: x * torch.rsqrt(x.square().mean((1, 3), keepdim=True) + eps) * w, ex.QK_NORM),  # a token
    (lambda x, w, eps: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps), ex.QK_NORM),    # no weight
    (lambda x, w, eps: F.layer_norm(x, x.shape[-1:], w, None, eps), ex.QK_NORM),                # mean removed
    (lambda w, s, r, tp: rank_part(w, {"row": "column", "column": "row"}.get(s, s), r, tp) if w.dim() == 2
     else rank_part(w, s, r, tp), ex.RANK_PART),                                                   # row <-> column
    (lambda w, s, r, tp: w if s == "replicated" else (w[r::tp] if s != "row" else w[:, r::tp]), ex.RANK_PART),
    (lambda w, s, r, tp: rank_part(w, s, tp - 1 - r, tp), ex.RANK_PART),                           # ranks reversed
    (lambda i, s, e: tuple((h, o) for o, n, h in i if o < e and o + n > s), ex.BLOCK_KEYS),        # absolute offset
    (lambda i, s, e: tuple((h, o - s) for o, n, h in i if s <= o < e), ex.BLOCK_KEYS),             # starts inside only
    (lambda i, s, e: tuple((h, o - s) for o, n, h in i if o <= e and o + n >= s), ex.BLOCK_KEYS),  # touching counts
    (lambda i, s, e: tuple(h for o, n, h in i if o < e and o + n > s), ex.BLOCK_KEYS),             # hashes only
], ids=["eps outside the root", "over the heads", "over a token's heads together", "no weight", "layer norm",
        "row and column swapped", "interleaved", "ranks reversed", "absolute offsets", "only images starting inside",
        "touching counts", "hashes only"])
def test_common_mistakes_fail(fn, exercise, capsys):
    assert exercise.check(fn) is exercise.reference  # the notebook goes on with the reference
    assert capsys.readouterr().out.startswith("[FAIL]")


@pytest.mark.parametrize("exercise", [e for _, e in EXERCISES], ids=lambda e: e.name)
def test_a_stub_is_todo(exercise, capsys):
    def stub(*args):
        raise NotImplementedError("exercise: write this part")
    assert exercise.check(stub) is exercise.reference and capsys.readouterr().out.startswith("[TODO]")


# --- the references against independent ones ---------------------------------------------------------------

def test_qk_norm_is_torch_rms_norm_over_head_dim():
    rng = Rng(1)
    for _ in range(30):
        x, w, eps = ex.random_qk_norm_case(rng)
        assert torch.allclose(ex.QK_NORM.reference(x, w, eps), F.rms_norm(x, x.shape[-1:], w, eps), rtol=1e-5,
                              atol=1e-6)


def test_rank_part_is_torch_chunk_and_the_parts_tile_the_tensor():
    rng = Rng(2)
    for _ in range(60):
        w, style, _, tp = ex.random_rank_part_case(rng)
        parts = [ex.rank_part(w, style, r, tp) for r in range(tp)]
        if style == "replicated":
            assert all(torch.equal(p, w) for p in parts)
            continue
        dim = 1 if style == "row" else 0
        assert all(torch.equal(p, c) for p, c in zip(parts, torch.chunk(w, tp, dim)))
        assert torch.equal(torch.cat(parts, dim), w)


def test_rank_part_is_what_the_loader_loads(tmp_path):
    torch.manual_seed(0)
    model = TinyVLM(small_config())
    write_release(model.state_dict(), model.config, tmp_path, max_shard_size="20KB")
    full = load_full(tmp_path)
    from labkit.day0.release import read_release
    plan = read_release(tmp_path).plan
    for rank in range(2):
        tensors, _ = load_rank(tmp_path, rank, 2)
        assert tensors and all(torch.equal(t, ex.rank_part(full[n], plan[n], rank, 2)) for n, t in tensors.items())


def test_block_keys_are_brute_force_overlaps():
    rng = Rng(3)
    for _ in range(200):
        images, start, end = ex.random_block_keys_case(rng)
        inside = [(h, o - start) for o, n, h in images if set(range(o, o + n)) & set(range(start, end))]
        assert list(ex.block_extra_keys(images, start, end)) == inside


def test_block_keys_are_what_the_block_manager_hashes():
    """Two prompts with the same placeholder tokens and different images: the first block's hash is the
    block_hash of its tokens with block_extra_keys as extra keys, and differs between the images."""
    bs, tokens = 8, [256] * 12 + [1, 2, 3, 4]
    hashes = []
    for i, image in enumerate(("aaaa", "bbbb")):
        bm = BlockManager(8, bs)
        spans = [(2, 9, image)]
        bm.allocate(f"s{i}", tokens, mm=spans)
        bm.mark_computed(f"s{i}", len(tokens))
        first = bm.block_table(f"s{i}")[0]
        assert bm.block_extra_keys(first) == ex.block_extra_keys(spans, 0, bs)
        hashes.append(block_hash(None, tokens[:bs], ex.block_extra_keys(spans, 0, bs)))
    assert hashes[0] != hashes[1]


def test_random_cases_are_valid_inputs():
    rng = Rng(4)
    for _ in range(50):
        x, w, eps = ex.random_qk_norm_case(rng)
        assert x.dim() == 4 and w.shape == x.shape[-1:] and (w > 0).all() and eps > 0
        weight, style, rank, tp = ex.random_rank_part_case(rng)
        assert 0 <= rank < tp and all(d % tp == 0 for d in weight.shape) and style in ex.STYLES
        images, start, end = ex.random_block_keys_case(rng)
        assert all(a[0] + a[1] <= b[0] for a, b in zip(images, images[1:])) and 0 <= start < end
