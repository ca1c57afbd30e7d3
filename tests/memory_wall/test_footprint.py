import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.memory_wall import footprint as fp
from labkit import specs
from labkit.tinylm import TinyLM, TinyLMConfig

from ..refusals import assert_refused


class PeakLiveBytes(TorchDispatchMode):
    """Brute force: follow every tensor storage that an op creates until Python frees it; keep the peak."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.storages = 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.storages:
                key, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
                self.storages.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, key, n)
        return out

    def _freed(self, key, n):
        self.live -= n
        self.storages.discard(key)


@pytest.mark.parametrize("batch,seq", [(1, 64), (2, 48), (4, 16)])
def test_activation_bytes_bound_the_live_tensors_of_a_real_forward_pass(batch, seq):
    torch.manual_seed(0)
    cfg = TinyLMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=64)
    model = TinyLM(cfg).eval()
    spec = specs.ModelSpec("t", cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size,
                           cfg.max_seq_len, tied_embeddings=True)
    with torch.no_grad(), PeakLiveBytes() as probe:
        model(torch.zeros(batch, seq, dtype=torch.long))
    estimate = fp.activation_bytes(spec, batch, seq, bytes_per_element=4)
    assert 0.75 * estimate <= probe.peak <= 1.25 * estimate, (probe.peak, estimate)


def test_footprint_of_gpt3_in_fp16_is_350_gb_of_weights():
    f = fp.footprint(specs.model("gpt3-175b"), "fp16", batch=1, context=2048)
    assert round(f["weights"] / 1e9) == 349  # 174.6e9 parameters x 2 bytes
    # 96 layers x 96 heads x 128 x 2 (K and V) x 2 bytes = 4.5 MiB per token, 9 GiB for 2,048 tokens
    assert f["kv_cache"] == 2048 * 96 * 12288 * 2 * 2
    assert f["total"] == pytest.approx(f["weights"] + f["kv_cache"] + f["activations"])


def test_precisions_count_scales_as_llama_cpp_blocks_do():
    # llama.cpp block sizes (ggml-common.h): Q4_0 18 bytes, Q4_1 20 bytes, Q8_0 34 bytes per 32 weights
    assert fp.PRECISIONS["int4-g32 sym (Q4_0)"] == 18 * 8 / 32
    assert fp.PRECISIONS["int4-g32 asym (Q4_1)"] == 20 * 8 / 32
    assert fp.PRECISIONS["int8-g32 (Q8_0)"] == 34 * 8 / 32
    assert fp.bits_of(3.5) == 3.5


def test_dense_models_read_every_weight_matrix_once_per_step_but_only_the_batchs_embedding_rows():
    m = specs.model("llama-3-8b")  # untied: the input table is looked up, the output layer multiplied
    assert fp.params_read(m, 1) == m.n_params - (m.vocab_size - 1) * m.d_model
    assert fp.params_read(m, 64) - fp.params_read(m, 1) == 63 * m.d_model
    g3 = specs.model("gpt3-175b")  # tied, with learned positions
    assert fp.params_read(g3, 1) == g3.n_params - (g3.positions - 1) * g3.d_model


@pytest.mark.parametrize("tied", [True, False])
def test_decode_flops_agree_with_torchs_flop_counter_on_a_tinylm(tied):
    from torch.utils.flop_counter import FlopCounterMode

    from labkit.tinylm import KVCache
    cfg = TinyLMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=64,
                       tie_embeddings=tied)
    model = TinyLM(cfg).eval()
    spec = specs.ModelSpec("t", 2, 64, 4, 2, 96, 64, 64, tied_embeddings=tied)
    with torch.no_grad():
        cache = KVCache(cfg, 3, 64)
        model(torch.zeros(3, 20, dtype=torch.long), cache)
        with FlopCounterMode(display=False) as counter:
            model(torch.zeros(3, 1, dtype=torch.long), cache)
    attention = 3 * 4 * cfg.n_layers * 21 * cfg.n_heads * cfg.head_dim  # torch does not count CPU attention
    assert fp.decode_flops_per_step(spec, batch=3, context=21) - attention == counter.get_total_flops()


def test_moe_reads_the_active_experts_at_batch_1_and_tends_to_all_of_them():
    m = specs.model("mixtral-8x7b")
    rows = m.vocab_size * m.d_model  # the input embedding table: one row per token is read
    assert fp.params_read(m, 1) == pytest.approx(m.active_params - rows + m.d_model, rel=1e-12)
    assert fp.params_read(m, 1000) == pytest.approx(m.n_params - rows + 1000 * m.d_model, rel=1e-9)


def test_expected_experts_read_agree_with_simulated_routing():
    # Brute force: route `batch` tokens, each to 2 distinct experts of 8 chosen uniformly; count experts touched.
    m = specs.model("mixtral-8x7b")
    g = torch.Generator().manual_seed(0)
    expert = m.counts()["expert_mlp"]
    for batch in (1, 2, 4, 16):
        picks = torch.rand(20000, batch, 8, generator=g).argsort(-1)[..., :2]  # [trials, batch, 2]
        touched = torch.zeros(20000, 8).scatter_(1, picks.flatten(1), 1).sum(1).mean().item()
        simulated = m.n_params - m.n_layers * (8 - touched) * expert - (m.vocab_size - batch) * m.d_model
        assert fp.params_read(m, batch) == pytest.approx(simulated, rel=5e-3)


def test_decode_ceiling_of_llama_2_70b_in_fp16_on_one_h200():
    m, h200 = specs.model("llama-2-70b"), specs.device("h200")
    # batch 1, 4,096 tokens of context: 137.95 GB of weights + 1.34 GB of KV cache per token step
    step = fp.decode_bytes_per_step(m, "fp16", 1, 4096)
    assert step == (68_976_648_192 - 31999 * 8192) * 2 + 4096 * 80 * 8 * 128 * 2 * 2
    assert fp.decode_tokens_per_s(m, "fp16", 1, 4096, h200.bandwidth) == pytest.approx(4.8e12 / step)
    # batching multiplies the ceiling until the KV cache dominates the bytes read
    assert fp.decode_tokens_per_s(m, "fp16", 16, 4096, h200.bandwidth) > 10 * 4.8e12 / step


def test_large_batches_hit_the_compute_roof():
    m, h200 = specs.model("llama-2-70b"), specs.device("h200")
    memory_only = fp.decode_tokens_per_s(m, "bf16", 256, 128, h200.bandwidth)
    with_compute = fp.decode_tokens_per_s(m, "bf16", 256, 128, h200.bandwidth, peak_flops=h200.peak_flops["bf16"])
    assert with_compute == pytest.approx(256 * h200.peak_flops["bf16"] / fp.decode_flops_per_step(m, 256, 128))
    assert with_compute < memory_only
    # at batch 1 the compute roof is far away: both agree
    assert fp.decode_tokens_per_s(m, "bf16", 1, 128, h200.bandwidth, peak_flops=h200.peak_flops["bf16"]) == \
        fp.decode_tokens_per_s(m, "bf16", 1, 128, h200.bandwidth)


def test_what_fits_is_weights_plus_kv_cache_against_the_devices_memory():
    m, h100 = specs.model("llama-2-70b"), specs.device("h100-sxm")
    # by hand: 137.95 GB of BF16 weights + 1.34 GB of KV cache at batch 1 x 4,096 tokens = 139.3 GB
    need = m.n_params * 2 + 4096 * 2 * 80 * 8 * 128 * 2
    assert fp.devices_needed(m, "bf16", 1, 4096, h100.memory_bytes) == -(-need // h100.memory_bytes) == 2
    assert not fp.fits(m, "bf16", 1, 4096, h100.memory_bytes)
    assert fp.fits(m, "bf16", 1, 4096, need) and not fp.fits(m, "bf16", 1, 4096, need - 1)
    assert fp.fits(m, "int4-g32 sym (Q4_0)", 1, 4096, h100.memory_bytes)
    # activations do not count: a long prefill's temporaries are transient
    f = fp.footprint(m, "bf16", 8, 32768)
    assert fp.fits(m, "bf16", 8, 32768, f["weights"] + f["kv_cache"]) and f["activations"] > 0


LLAMA = specs.model("llama-2-7b")

# (function, arguments, error, argument named, bad value, what the message says was expected)
REFUSED = [
    (fp.bits_of, ("int3",), ValueError, "precision", "int3", "one of ['fp32'"),
    (fp.bits_of, (64,), ValueError, "precision", 64, "or a number of bits in (0, 32]"),
    (fp.bits_of, (0,), ValueError, "precision", 0, "or a number of bits in (0, 32]"),
    (fp.bits_of, (float("nan"),), ValueError, "precision", float("nan"), "or a number of bits"),
    (fp.bits_of, (None,), TypeError, "precision", None, "or a number of bits"),
    (fp.bits_of, (True,), TypeError, "precision", True, "or a number of bits"),
    (fp.activation_bytes, ("llama-2-7b", 1, 16), TypeError, "spec", "llama-2-7b", "a labkit.specs.ModelSpec"),
    (fp.activation_bytes, (LLAMA, 0, 16), ValueError, "batch", 0, "a positive int (sequences)"),
    (fp.activation_bytes, (LLAMA, 1, 1.5), TypeError, "seq_len", 1.5, "a positive int (tokens)"),
    (fp.activation_bytes, (LLAMA, 1, 16, -2), ValueError, "bytes_per_element", -2, "a positive finite number"),
    (fp.footprint, (LLAMA, "int3"), ValueError, "precision", "int3", "one of ['fp32'"),
    (fp.footprint, (LLAMA, 40), ValueError, "precision", 40, "a number of bits in (0, 32]"),
    (fp.footprint, (LLAMA, "bf16", 0), ValueError, "batch", 0, "a positive int"),
    (fp.footprint, (LLAMA, "bf16", 1, -1), ValueError, "context", -1, "a positive int (tokens)"),
    (fp.footprint, (LLAMA, "bf16", 1, "2048"), TypeError, "context", "2048", "a positive int"),
    (fp.footprint, (LLAMA, "bf16", 1, 16, 0), ValueError, "kv_bytes_per_element", 0, "a positive finite number"),
    (fp.footprint, (LLAMA, "bf16", 1, 16, 2, None), TypeError, "act_bytes_per_element", None, "a positive"),
    (fp.footprint, (None,), TypeError, "spec", None, "a labkit.specs.ModelSpec"),
    (fp.params_read, (LLAMA, 0), ValueError, "batch", 0, "a positive int"),
    (fp.params_read, ({}, 1), TypeError, "spec", {}, "a labkit.specs.ModelSpec"),
    (fp.decode_flops_per_step, (LLAMA, 1, 0), ValueError, "context", 0, "a positive int"),
    (fp.decode_flops_per_step, (LLAMA, 2.0), TypeError, "batch", 2.0, "a positive int"),
    (fp.decode_bytes_per_step, (LLAMA, "q4"), ValueError, "precision", "q4", "one of ['fp32'"),
    (fp.decode_bytes_per_step, (LLAMA, "bf16", 1, 16, -1), ValueError, "kv_bytes_per_element", -1, "a positive"),
    (fp.decode_tokens_per_s, (LLAMA, "bf16", 1, 16, 0), ValueError, "bandwidth", 0, "a finite number >= 1"),
    (fp.decode_tokens_per_s, (LLAMA, "bf16", 1, 16, 1e12, 2, -1), ValueError, "peak_flops", -1, "a positive"),
    (fp.decode_tokens_per_s, (LLAMA, "bf16", 1, 16, 1e12, 2, "1e15"), TypeError, "peak_flops", "1e15", "a positive"),
    (fp.devices_needed, (LLAMA, "bf16", 1, 16, 0), ValueError, "memory_bytes", 0, "a finite number >= 1"),
    (fp.fits, (LLAMA, "bf16", 1, 16, "80e9"), TypeError, "memory_bytes", "80e9", "a finite number >= 1"),
    (fp.fits, (LLAMA, "bf16", 0, 16, 80e9), ValueError, "batch", 0, "a positive int"),
]


@pytest.mark.parametrize("fn,args,error,name,value,expected", REFUSED,
                         ids=[f"{r[0].__name__}-{r[3]}-{r[4]!r}" for r in REFUSED])
def test_bad_input_is_refused_with_the_argument_the_value_and_the_expectation(fn, args, error, name, value, expected):
    assert_refused(lambda: fn(*args), error, name, value, expected)


@pytest.mark.parametrize("name,batch,context", [("llama-2-70b", 8, 4096), ("llama-3-8b", 3, 1000),
                                                ("gpt3-175b", 5, 2048), ("mixtral-8x7b", 16, 512)])
def test_every_sequence_of_a_batch_has_its_own_kv_cache(name, batch, context):
    # by hand: K and V, per layer, per KV head, head_dim elements of 2 bytes, per token of every sequence
    m = specs.model(name)
    per_token = 2 * m.n_layers * m.n_kv_heads * (m.d_model // m.n_heads) * 2
    f = fp.footprint(m, "bf16", batch, context)
    assert f["kv_cache"] == batch * context * per_token
    assert f["weights"] == m.n_params * 2 and f["total"] == f["weights"] + f["kv_cache"] + f["activations"]
    # a decode step reads the weights once for the whole batch, and every sequence's KV cache
    weights_read = fp.params_read(m, batch) * 2
    assert fp.decode_bytes_per_step(m, "bf16", batch, context) == weights_read + batch * context * per_token
    assert fp.decode_tokens_per_s(m, "bf16", batch, context, 1e12) == pytest.approx(
        batch * 1e12 / (weights_read + batch * context * per_token), rel=1e-12)


def test_devices_are_counted_for_weights_and_kv_cache_where_the_kv_cache_tips_the_balance():
    # Llama-2-7B in BF16: 13.5 GB of weights fit one 80 GB H100; 32 sequences of 4,096 tokens add 68.7 GB
    m = specs.model("llama-2-7b")
    weights, kv = m.n_params * 2, 32 * 4096 * 2 * 32 * 32 * 128 * 2
    assert weights < 80e9 < weights + kv
    assert fp.devices_needed(m, "bf16", 32, 4096, 80e9) == 2 and not fp.fits(m, "bf16", 32, 4096, 80e9)
    assert fp.devices_needed(m, "bf16", 1, 4096, 80e9) == 1


REFUSED_NOW = [
    (fp.footprint, ("llama-2-7b",), TypeError, "spec", "llama-2-7b", "labkit.specs.model('llama-2-7b') makes one"),
    (fp.decode_bytes_per_step, ("llama-3-8b",), TypeError, "spec", "llama-3-8b", "not a name"),
    (fp.footprint, (LLAMA, float("nan")), ValueError, "precision", float("nan"), "a number of bits in (0, 32]"),
    (fp.footprint, (LLAMA, "bf16", True), TypeError, "batch", True, "a positive int"),
    (fp.footprint, (LLAMA, "bf16", 1, 16, float("inf")), ValueError, "kv_bytes_per_element", float("inf"), "finite"),
    (fp.decode_tokens_per_s, (LLAMA, "bf16", 1, 16, 1e-300), ValueError, "bandwidth", 1e-300, ">= 1 (bytes/s)"),
    (fp.decode_tokens_per_s, (LLAMA, "bf16", 1, 16, float("nan")), ValueError, "bandwidth", float("nan"), ">= 1"),
    (fp.devices_needed, (LLAMA, "bf16", 1, 16, 1e-300), ValueError, "memory_bytes", 1e-300, ">= 1 (bytes)"),
    (fp.devices_needed, (LLAMA, "bf16", 1, 16, float("inf")), ValueError, "memory_bytes", float("inf"), ">= 1"),
    (fp.devices_needed, (LLAMA, "bf16", 1, 16, []), TypeError, "memory_bytes", [], "a finite number"),
]


@pytest.mark.parametrize("fn,args,error,name,value,expected", REFUSED_NOW,
                         ids=[f"{r[0].__name__}-{r[3]}-{r[4]!r}" for r in REFUSED_NOW])
def test_names_instead_of_specs_and_out_of_range_numbers_are_refused(fn, args, error, name, value, expected):
    assert_refused(lambda: fn(*args), error, name, value, expected)
