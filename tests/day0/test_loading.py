"""Sharded loading: the ranks' slices put back together are the stored tensors (read by the real library), each
rank reads 1/tp of the split tensors plus the replicated ones and never opens a shard without any of its
tensors, precision conversion equals torch's (BF16) or stays within the INT4 grid's half step, weights land in
the arena, a broken release places nothing, and the ranks' models over real gloo ranks give the single-process
logits within 1e-4."""
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from labkit.day0 import loading, release as rel
from labkit.day0.arena import Arena, plan_arena
from labkit.day0.config import small_config
from labkit.day0.model import TinyVLM, tp_plan
from labkit.parallel import Pool
from labkit.quant import QTensor
from tests.refusals import assert_refused

DIM = {"column": 0, "vocab": 0, "row": 1}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    return TinyVLM(small_config(n_heads=8, n_kv_heads=4)).eval()  # TP 1, 2 and 4 all divide it (GQA 2:1)


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    rel.write_release(model.state_dict(), model.config, out, "20KB")
    return out


@pytest.fixture(scope="module")
def reference(folder):
    """Every stored tensor, read by the library itself, shard by shard."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from([1, 2, 4]), st.sampled_from(["column", "row", "vocab",
                                                                                         "replicated"]))
def test_rank_slices_are_torch_chunks(a, b, tp, style):
    w = torch.arange(a * tp * b * tp, dtype=torch.float32).reshape(a * tp, b * tp)
    for rank in range(tp):
        spec = loading.rank_slice(tuple(w.shape), style, rank, tp)
        want = w if style == "replicated" else w.chunk(tp, dim=DIM[style])[rank]
        assert torch.equal(w[spec], want)
        assert loading.slice_bytes(tuple(w.shape), spec, 4) == want.numel() * 4


@pytest.mark.parametrize("rank, tp, name, error, expected", [
    (2, 2, "rank", ValueError, "an int in [0, 1]"), (-1, 2, "rank", ValueError, "an int in [0, 1]"),
    (0, 0, "tp", ValueError, "a positive int"), (0.5, 2, "rank", TypeError, "an int in [0, 1]")])
def test_a_rank_outside_the_group_is_refused(rank, tp, name, error, expected):
    """A rank outside [0, tp), or a tp below 1, is refused by name for every style: rank_slice((8, 4), "column",
    rank=2, tp=2) must not return slice(8, 12), past the tensor."""
    for style in ("column", "row", "replicated"):
        assert_refused(lambda: loading.rank_slice((8, 4), style, rank, tp), error, name, rank if name == "rank" else tp,
                       expected)


def rank_parts(folder, tp, **kw):
    return [loading.load_rank(folder, r, tp, **kw) for r in range(tp)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_slices_put_back_together_are_the_stored_tensors(model, folder, reference, tp):
    plan = tp_plan(model.config)
    parts = rank_parts(folder, tp)
    for name, style in plan.items():
        got = [p[0].get(name) for p in parts]
        if style == "encoder":
            assert all(g is None for g in got), name
        elif style == "replicated":
            assert all(torch.equal(g, reference[name]) for g in got), name
        else:
            assert torch.equal(torch.cat(got, dim=DIM[style]), reference[name]), name
    assert all(set(p[0]) == {n for n, s in plan.items() if s != "encoder"} for p in parts)
    full = loading.load_full(folder)
    assert full.keys() == reference.keys() and all(torch.equal(full[n], reference[n]) for n in full)
    encoder = loading.load_encoder(folder)
    assert set(encoder) == {n for n, s in plan.items() if s == "encoder"}
    assert all(torch.equal(t, reference[n]) for n, t in encoder.items())


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reads_its_share_only(model, folder, tp):
    split = replicated = 0
    plan = tp_plan(model.config)
    for path in folder.glob("*.safetensors"):  # sizes from the library's view of the headers
        with safe_open(path, "pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                nbytes = torch.Size(s.get_shape()).numel() * 4
                style = plan[name]
                split += nbytes * (style in DIM)
                replicated += nbytes * (style == "replicated")
    for tensors, stats in rank_parts(folder, tp):
        assert stats.bytes_read <= split / tp + replicated
        assert stats.bytes_read == sum(t.numel() * t.element_size() for t in tensors.values())
        assert stats.tensors == len(tensors) and stats.seconds > 0


def test_a_rank_never_opens_a_shard_without_its_tensors(model, folder, monkeypatch, tmp_path):
    opened = []
    real = loading.safe_open

    def counting(path, *args, **kw):
        opened.append(path.rsplit("/", 1)[-1])
        return real(path, *args, **kw)

    monkeypatch.setattr(loading, "safe_open", counting)
    index = rel.read_release(folder).index["weight_map"]
    plan = tp_plan(model.config)
    mine = {index[n] for n, s in plan.items() if s != "encoder"}
    encoder_only = set(index.values()) - mine
    assert encoder_only  # the split leaves shards that hold only the encoder: the test can fail
    for rank in range(2):
        opened.clear()
        _, stats = loading.load_rank(folder, rank, 2)
        assert sorted(opened) == sorted(mine) == sorted(stats.files) and stats.files_opened == len(mine)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    release = rel.read_release(copy)
    for file in encoder_only:  # gone after the release was checked: the ranks still load, the encoder does not
        (copy / file).unlink()
    assert len(loading.load_rank(release, 1, 2)[0]) == len(loading.rank_tensors(release, 1, 2))
    with pytest.raises(rel.ReleaseError, match=f"{sorted(encoder_only)[0]}: cannot be opened"):
        loading.load_encoder(release)


def test_bf16_is_torch_s_conversion(model, folder, reference):
    for tensors, _ in rank_parts(folder, 2, dtype=torch.bfloat16):
        for name, t in tensors.items():
            assert t.dtype == torch.bfloat16
    whole, _ = loading.load_rank(folder, 0, 1, dtype="bfloat16")
    assert all(torch.equal(whole[n], reference[n].to(torch.bfloat16)) for n in whole)


def test_int4_linears_stay_within_half_a_step(model, folder, reference):
    plan = tp_plan(model.config)
    parts = rank_parts(folder, 2, dtype="int4", threads=2)
    for name, style in plan.items():
        if style == "encoder":
            continue
        got = [p[0][name] for p in parts]
        if style in ("column", "row"):
            assert all(isinstance(q, QTensor) and q.bits == 4 for q in got), name
            w_hat = torch.cat([q.dequantize() for q in got], dim=DIM[style])
            steps = torch.cat([q.scale.repeat_interleave(q.group_len if q.group_size != "channel" else q.shape[1],
                                                         dim=1) for q in got], dim=DIM[style])
            assert ((w_hat - reference[name]).abs() <= steps / 2 * (1 + 1e-5) + 1e-7).all(), name
            assert (w_hat != reference[name]).any(), name  # really quantized
        else:  # embedding (tied head) and norms stay float32, exactly
            whole = torch.cat(got) if style == "vocab" else got[0]
            assert torch.equal(whole, reference[name]) and torch.equal(got[-1], got[0]) == (style != "vocab"), name


@pytest.mark.parametrize("dtype", [torch.float32, "int4"])
def test_weights_land_in_the_arena(folder, dtype):
    sizes = loading.placed_sizes(folder, 1, 2, dtype)
    arena = Arena(plan_arena(sizes, kv_bytes=4096, activation_bytes=1024))
    tensors, _ = loading.load_rank(folder, 1, 2, dtype=dtype, arena=arena)
    plain, _ = loading.load_rank(folder, 1, 2, dtype=dtype)
    assert arena.missing() == []
    for name, t in tensors.items():
        parts = [t.codes, t.scale, t.zero] if isinstance(t, QTensor) else [t]
        assert all(arena.holds(p) for p in parts), name
        same = plain[name]
        if isinstance(t, QTensor):
            assert torch.equal(t.dequantize(), same.dequantize()), name
        else:
            assert torch.equal(t, same), name


class Recorder:
    """The smallest arena: anything with place(name, tensor, dtype) -> tensor and discard(name) will do."""

    def __init__(self):
        self.names = []

    def place(self, name, tensor, dtype=None):
        self.names.append(name)
        return tensor.to(dtype or tensor.dtype, copy=True)

    def discard(self, name):
        self.names.remove(name)


def test_a_broken_release_places_nothing(folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    last = sorted(broken.glob("model-*.safetensors"))[-1]
    last.write_bytes(last.read_bytes()[:-4])
    arena = Recorder()
    with pytest.raises(rel.ReleaseError, match=f"{last.name}: truncated"):
        loading.load_rank(broken, 0, 2, arena=arena)
    assert arena.names == []
    tensors, _ = loading.load_rank(folder, 0, 2, arena=arena)  # the good one: every tensor goes through place()
    assert sorted(arena.names) == sorted(tensors)


@pytest.mark.parametrize("dtype", [torch.bfloat16, "int4"])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_load_that_fails_half_way_leaves_the_arena_as_it_was(folder, tmp_path, dtype, threads):
    """A shard that changes after the release was checked (a tensor gone from the last file): the reads of the
    other files have been placed when it fails; they are discarded, and a retry into the same arena works."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    release = rel.read_release(copy)
    wanted = loading.rank_tensors(release, 0, 2)
    last = max(f for f, _ in wanted.values())
    victim = next(n for n, (f, _) in wanted.items() if f == last)
    good = load_file(copy / last)
    save_file({n: t for n, t in good.items() if n != victim}, copy / last, metadata={"format": "pt"})
    arena = Arena(plan_arena(loading.placed_sizes(release, 0, 2, dtype), kv_bytes=256, activation_bytes=0))
    with pytest.raises(rel.ReleaseError, match=f"{last}: reading tensor '{victim}' failed"):
        loading.load_rank(release, 0, 2, dtype=dtype, threads=threads, arena=arena)
    assert arena.missing() == [r.name for r in arena.plan.weights]  # nothing left placed
    save_file(good, copy / last, metadata={"format": "pt"})
    tensors, _ = loading.load_rank(release, 0, 2, dtype=dtype, threads=threads, arena=arena)
    plain, _ = loading.load_rank(folder, 0, 2, dtype=dtype)
    assert arena.missing() == []
    for name, t in tensors.items():
        same = plain[name]
        assert torch.equal(t.dequantize(), same.dequantize()) if isinstance(t, QTensor) else torch.equal(t, same)


def test_bad_arguments_are_refused(folder):
    release = rel.read_release(folder)
    assert_refused(lambda: loading.load_rank(release, 2, 2), ValueError, "rank", 2, "an int in [0, 1]")
    assert_refused(lambda: loading.load_rank(release, 0, 3), ValueError, "tp", 3, "a divisor of n_heads=8")
    assert_refused(lambda: loading.load_rank(release, 0, 0), ValueError, "tp", 0, "a positive int")
    assert_refused(lambda: loading.load_rank(release, 0, 2, dtype="float16"), ValueError, "dtype", "float16",
                   "torch.float32, torch.bfloat16 or 'int4'")
    assert_refused(lambda: loading.load_rank(release, 0, 2, dtype=torch.float16), ValueError, "dtype", torch.float16,
                   "torch.float32")
    assert_refused(lambda: loading.load_rank(release, 0, 2, dtype=16), TypeError, "dtype", 16, "torch.float32")
    assert_refused(lambda: loading.load_rank(release, 0, 2, threads=0), ValueError, "threads", 0, "a positive int")
    assert_refused(lambda: loading.load_rank(release, 0, 2, arena=object()), TypeError, "arena", "object",
                   "an object with place(name, tensor, dtype)")
    assert_refused(lambda: loading.load_encoder(release, "int4"), ValueError, "dtype", "int4", "torch.float32 or")


def rank_logits(rank, world, folder, tokens, dtype):
    """One gloo rank: its model from the release, the full logits."""
    with torch.no_grad():
        return loading.build_rank_model(folder, rank, world, dtype=dtype)(tokens)


@pytest.fixture(scope="module")
def pool2():
    with Pool(2, timeout=20) as pool:
        yield pool


@pytest.mark.timeout(120)
def test_rank_models_over_gloo_give_the_full_model_s_logits(model, folder, pool2):
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.language_model(tokens)
    runs = pool2.run(rank_logits, str(folder), tokens, torch.float32, timeout=60)
    assert all(r.shape == ref.shape and (r - ref).abs().max() < 1e-4 for r in runs)
    runs = pool2.run(rank_logits, str(folder), tokens, torch.bfloat16, timeout=60)  # BF16 weights and activations
    assert all(r.dtype == torch.bfloat16 and (r.float() - ref).abs().max() < 0.05 * ref.abs().max() for r in runs)
    # INT4: the reference is the same model with each rank's dequantized slices put back together
    parts = rank_parts(folder, 2, dtype="int4")
    quant = TinyVLM(model.config).eval()
    quant.load_state_dict(model.state_dict())
    for name, style in tp_plan(model.config).items():
        if style in ("column", "row"):
            w = torch.cat([p[0][name].dequantize() for p in parts], dim=DIM[style])
            quant.get_parameter(name).data.copy_(w)
    with torch.no_grad():
        ref4 = quant.language_model(tokens)
    runs = pool2.run(rank_logits, str(folder), tokens, "int4", timeout=60)
    assert all((r - ref4).abs().max() < 1e-4 for r in runs)
    assert (ref4 - ref).abs().max() > 1e-4  # the quantization did change the model


def test_a_release_with_its_own_rope_theta_loads_with_it(tmp_path):
    """rope_theta 500000 (Llama 3's) in config.json: the whole model and a TP=1 rank model give the written
    model's logits; the same weights under the default 10000 do not (positions past the first few rotate apart)."""
    torch.manual_seed(1)
    model = TinyVLM(small_config(rope_theta=500000.0)).eval()
    rel.write_release(model.state_dict(), model.config, tmp_path, "20KB")
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    default = TinyVLM(small_config()).eval()
    default.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref = model.language_model(tokens)
        assert (default.language_model(tokens) - ref).abs().max() > 1e-2
        assert (loading.load_model(tmp_path).language_model(tokens) - ref).abs().max() < 1e-5
        assert (loading.build_rank_model(tmp_path, 0, 1)(tokens) - ref).abs().max() < 1e-5
