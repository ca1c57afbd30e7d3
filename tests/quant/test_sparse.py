"""2:4 structured sparsity against a group-by-group loop written independently (which 2 of 4 are kept, the
compressed layout, the packed indices), the dense torch matmul of the pruned weight, the bit count of the
format, lab 01's roofline by hand, and bad input."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import quality
from labkit.quant.policy import quantize_model
from labkit.quant.qtensor import quantize, quantized_bytes
from labkit.quant import sparse
from labkit.specs import device
from labkit.tinylm import TinyLM, TinyLMConfig, corpus, iter_linears, perplexity, task_correct

from ..refusals import assert_refused


def brute_keep(group: list[float]) -> list[int]:
    """The positions kept in one group of 4: the 2 largest |w|, the lower position first on a tie."""
    return sorted(sorted(range(4), key=lambda j: (-abs(group[j]), j))[:2])


def brute_compress(w: list[list[float]]) -> tuple[list[list[float]], list[list[int]], list[list[float]]]:
    """(kept values, indices, pruned dense matrix), one group of 4 at a time."""
    values, indices, dense = [], [], []
    for row in w:
        v, i, d = [], [], [0.0] * len(row)
        for g in range(0, len(row), 4):
            for j in brute_keep(row[g:g + 4]):
                v.append(row[g + j]), i.append(j)
                d[g + j] = row[g + j]
        values.append(v), indices.append(i), dense.append(d)
    return values, indices, dense


# small integers make ties common; a few are fractional, negative zero included
entries = st.one_of(st.integers(-3, 3).map(float), st.floats(-8, 8, allow_nan=False, width=32))
matrices = st.integers(1, 4).flatmap(lambda out: st.integers(1, 5).flatmap(
    lambda groups: st.lists(st.lists(entries, min_size=4 * groups, max_size=4 * groups), min_size=out, max_size=out)))


@settings(max_examples=80, deadline=None)
@given(w=matrices)
def test_two_of_every_four_the_largest_and_an_exact_round_trip(w):
    t = torch.tensor(w, dtype=torch.float32)
    values, indices, dense = brute_compress(t.tolist())
    mask = sparse.mask_2_4(t)
    groups, kept = t.abs().reshape(-1, 4), mask.reshape(-1, 4)
    assert (kept.sum(1) == 2).all()  # exactly 2 of every 4
    dropped_max = torch.where(kept, -1.0, groups).amax(1)
    kept_min = torch.where(kept, groups, float("inf")).amin(1)
    assert (kept_min >= dropped_max).all()  # the kept ones are the largest in magnitude
    s = sparse.compress_2_4(t)
    assert s.values.tolist() == values and s.indices.tolist() == indices
    assert torch.equal(s.decompress(), torch.tensor(dense)) and torch.equal(sparse.prune_2_4(t), torch.tensor(dense))
    again = sparse.compress_2_4(s.decompress())  # an already 2:4 matrix round-trips exactly
    assert torch.equal(again.decompress(), s.decompress()) and torch.equal(again.values.abs(), s.values.abs())


@settings(max_examples=40, deadline=None)
@given(w=matrices, batch=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_sparse_matmul_equals_the_dense_matmul_of_the_pruned_weight(w, batch, seed):
    t = torch.tensor(w, dtype=torch.float32)
    x = torch.randn(batch, 2, t.shape[1], generator=torch.Generator().manual_seed(seed))
    s = sparse.compress_2_4(t)
    y = sparse.sparse_matmul(x, s)
    assert y.shape == (batch, 2, t.shape[0])
    torch.testing.assert_close(y, x @ sparse.prune_2_4(t).T, rtol=1e-5, atol=1e-4)
    q = sparse.compress_2_4(t, 8, group_size=2, scheme="sym")
    torch.testing.assert_close(sparse.sparse_matmul(x, q), x @ q.decompress().T, rtol=1e-5, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(w=matrices)
def test_packed_indices_hold_four_per_byte_low_bits_first(w):
    s = sparse.compress_2_4(torch.tensor(w))
    flat = [i for row in s.indices.tolist() for i in row]
    flat += [0] * (-len(flat) % 4)
    expected = [sum(flat[b + j] << (2 * j) for j in range(4)) for b in range(0, len(flat), 4)]
    assert s.packed_indices().tolist() == expected


def test_bits_per_weight_count_values_indices_and_scales():
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(0))
    s16 = sparse.compress_2_4(w)
    assert s16.nbytes() == 96 * 128 * 2 + 96 * 128 // 4 and s16.bits_per_weight() == 9.0
    assert s16.bits_per_weight(value_bytes=4) == 17.0
    s4 = sparse.compress_2_4(w, 4, 32, "asym")
    assert s4.nbytes() == quantized_bytes(96 * 128, 4, 32, "asym") + 96 * 128 // 4 and s4.bits_per_weight() == 3.5
    kept = w.gather(1, s16.columns)
    assert torch.equal(s4.values, quantize(kept, 4, "asym", 32).dequantize())  # INT4 of the kept values
    assert torch.equal(s4.indices, s16.indices) and s4.q.codes.shape == (96, 128)


def small(tied: bool = True, context: int = 32) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(TinyLMConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=128,
                               max_seq_len=context, tie_embeddings=tied))


@pytest.mark.parametrize("bits", [None, 4])
def test_sparsify_model_prunes_attention_and_mlp_only(bits):
    model = small()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned, report = sparse.sparsify_model(model, bits=bits)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the input is left alone
    n_pruned, nbytes = 0, 0
    for (entry, old), (_, new) in zip(iter_linears(model), iter_linears(pruned)):
        if entry.layer_type in ("attention", "mlp"):
            s = sparse.compress_2_4(old.weight.detach(), bits)
            assert torch.equal(new.weight, s.decompress())
            n_pruned, nbytes = n_pruned + old.weight.numel(), nbytes + s.nbytes()
            x = torch.randn(3, old.weight.shape[1])
            torch.testing.assert_close(new(x), sparse.sparse_matmul(x, s), rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(new.weight, old.weight)
    params = sum(p.numel() for p in model.parameters())
    assert report["sparse_bits"] == 8 * nbytes / n_pruned == (9.0 if bits is None else 3.5)
    assert report["bytes"] == nbytes + 4 * (params - n_pruned) and report["fp32_bytes"] == 4 * params
    assert report["compression"] == 4 * params / report["bytes"]
    only_mlp, r = sparse.sparsify_model(model, ("mlp",))
    assert torch.equal(only_mlp.layers[0].attn.wq.weight, model.layers[0].attn.wq.weight)
    assert {row["type"] for row in r["layers"]} == {"mlp"}


def test_sparse_rows_are_sweep_rows_against_the_base():
    model = small(context=256)  # the tasks' length
    tasks, text = quality.quality_tasks(per_kind=3), corpus.corpus("test", n_bytes=256, seed=0)
    base = quality.evaluate(model, tasks, text)
    base["ok"] = [True] * len(tasks)  # a base that answers everything: the retention is the share kept
    rows = sparse.sparse_rows(model, tasks, text, base)
    assert list(rows) == ["attn+MLP INT4 g32", "attn+MLP 2:4", "attn+MLP 2:4 + INT4 g32"]
    models = [quantize_model(model, {"attention": "int4", "mlp": "int4"})[0], sparse.sparsify_model(model)[0],
              sparse.sparsify_model(model, bits=4)[0]]
    for row, m in zip(rows.values(), models):
        assert row["ppl"] == perplexity(m, text) and row["ok"] == task_correct(m, tasks)
        assert (row["retention"] == quality.retention(row["ok"], base["ok"])
                and row["lost"] == len(tasks) - sum(row["ok"]))
    assert set(quality.ROW_KEYS) <= set(rows["attn+MLP 2:4"])  # notebook 03 prints them with the sweep's table


def test_tensor_core_time_is_the_roofline_by_hand():
    h100 = device("h100-sxm")  # 989.4 TFLOP/s dense BF16, 3.35 TB/s
    one = sparse.tensor_core_time(h100, 1, 4096, 4096, 16)
    assert one["bytes"] == 4096 * 4096 * 2 + 2 * 8192 and one["flop"] == 2 * 4096 * 4096
    assert one["bound"] == "memory" and one["seconds"] == pytest.approx(one["bytes"] / 3.35e12)
    sp = sparse.tensor_core_time(h100, 1, 4096, 4096, 9, sparse=True)
    assert sp["flop"] == 4096 * 4096 and sp["seconds"] == pytest.approx((4096 * 4096 * 9 / 8 + 2 * 8192) / 3.35e12)
    big, big_sp = (sparse.tensor_core_time(h100, 8192, 4096, 4096, b, sparse=s) for b, s in ((16, False), (9, True)))
    assert big["bound"] == big_sp["bound"] == "compute"
    assert big["seconds"] == pytest.approx(2 * 8192 * 4096 ** 2 / 989.4e12)
    assert big["seconds"] / big_sp["seconds"] == pytest.approx(2.0)  # half the multiplies at the same rate


def test_bad_input_is_refused_by_name():
    assert_refused(lambda: sparse.mask_2_4(torch.zeros(2, 6)), ValueError, "w.shape", (2, 6),
                   "[out, in] with in a multiple of 4")
    assert_refused(lambda: sparse.mask_2_4(torch.zeros(2, 4, dtype=torch.int8)), TypeError, "w", torch.int8,
                   "a floating-point tensor")
    s = sparse.compress_2_4(torch.randn(2, 8))
    bad = s.indices.clone()
    bad[0, :2] = torch.tensor([2, 1], dtype=torch.uint8)
    assert_refused(lambda: sparse.Sparse24(s.values, bad, (2, 8)), ValueError, "indices", [2, 1],
                   "each pair strictly increasing")
    for pair in ([1, 1], [3, 3], [0, 4]):  # one position kept twice (the other 3 of 4 lost), or past the group
        bad[0, :2] = torch.tensor(pair, dtype=torch.uint8)
        assert_refused(lambda: sparse.Sparse24(s.values, bad, (2, 8)), ValueError, "indices", pair,
                       "pairs of positions in 0..3, each pair strictly increasing")
    assert_refused(lambda: sparse.Sparse24(s.values, s.indices, (2, 6)), ValueError, "shape", (2, 6),
                   "in a multiple of 4")
    assert_refused(lambda: sparse.Sparse24(s.values, s.indices.long(), (2, 8)), TypeError, "indices", torch.int64,
                   "a uint8 tensor")
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 8\] \(s's input dimension\), got shape \(3, 4\)"):
        sparse.sparse_matmul(torch.zeros(3, 4), s)
    assert_refused(lambda: sparse.sparse_matmul(torch.zeros(3, 8), "s"), TypeError, "s", "s", "Sparse24")
    assert torch.equal(s.decompress(), sparse.compress_2_4(s.decompress()).decompress())  # still usable
    model = small()
    assert_refused(lambda: sparse.sparsify_model(model, "mlp"), TypeError, "types", "mlp", "a non-empty sequence")
    assert_refused(lambda: sparse.sparsify_model(model, ("embedding",)), ValueError, "types", ("embedding",),
                   "layer types from ('attention', 'mlp')")
    quantized, _ = quantize_model(model, {"mlp": "int4"})
    with pytest.raises(TypeError, match="model's layers.0.mlp.w_gate must be an nn.Linear, got QuantLinear"):
        sparse.sparsify_model(quantized)
    assert_refused(lambda: sparse.tensor_core_time(device("h100-sxm"), 1, 8, 8, dtype="int4"), ValueError, "dtype",
                   "int4", "one of the dtypes h100-sxm lists")
    assert_refused(lambda: sparse.tensor_core_time(device("h100-sxm"), 0, 8, 8), ValueError, "batch", 0, "positive int")
    assert_refused(lambda: sparse.sparse_rows(model, [], b"", {"ppl": 1.0}), ValueError, "base", ["ppl"], "'ok'")
