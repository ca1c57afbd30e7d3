"""The calculator and the measurement: a measured TinyLM step holds exactly 4 bytes of weights, 4 of gradients and
8 of Adam states per parameter (16), the profiler's peak covers what the step held, adapter counts equal the
parameters add_lora creates, checkpointing saves activations, and the paged-state replay counts faults."""
import pytest
import torch

from labkit.finetune import lora, memory
from labkit.specs import ModelSpec, model as spec
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused

CFG = TinyLMConfig(d_model=32, n_layers=4, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)
CFG_SPEC = ModelSpec("small", 4, 32, 2, 2, 64, 256, 32, tied_embeddings=True)  # every linear's smallest side: 32


def _model():
    torch.manual_seed(0)
    return TinyLM(CFG)


def test_a_measured_step_holds_16_bytes_per_parameter_plus_activations():
    model = _model()
    n = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, CFG.vocab_size, (4, 17))
    m = memory.measure_step(model, tokens, torch.optim.AdamW(model.parameters()))
    n_tensors = len(list(model.parameters()))
    assert (m.weights, m.gradients, m.optimizer) == (4 * n, 4 * n, 8 * n + 4 * n_tensors)  # + one float32 step each
    assert m.activations > 0 and m.peak >= m.weights + m.optimizer + m.gradients
    assert m.peak >= m.weights + m.optimizer + m.activations


def test_the_calculator_counts_what_add_lora_creates_and_the_16_bytes():
    model = lora.add_lora(_model(), rank=4, alpha=8.0)
    assert lora.trainable_params(model) == memory.adapter_params(CFG, 4)
    s = spec("llama-2-7b")
    full = memory.training_memory(s, "full", 1024)
    assert full["weights"] + full["gradients"] + full["optimizer"] == 16 * s.n_params
    assert full["activations"] == 34 * 1024 * s.d_model * s.n_layers
    q = memory.training_memory(s, "qlora", 1024)
    assert q["total"] < memory.training_memory(s, "lora", 1024)["total"] < full["total"]
    assert_refused(lambda: memory.training_memory(s, "sgd"), ValueError, "method", "sgd", "one of")
    assert_refused(lambda: memory.training_memory(s, tokens=0), ValueError, "tokens", 0, "positive")


def test_each_term_of_the_calculator_by_hand():
    """llama-2-7b (32 layers, d_model 4096, 6,738,415,616 parameters, embeddings of 32000 x 4096 untied, 65 norms
    of 4096), rank 16 on the 7 linears of each layer: every term written out from the papers' numbers."""
    s = spec("llama-2-7b")
    n, d, layers, tokens = 6_738_415_616, 4096, 32, 2048
    adapters = 32 * 16 * (4 * (4096 + 4096) + 3 * (11008 + 4096)) + 16 * (32000 + 4096)  # + the untied head
    assert (s.n_params, s.d_model, s.n_layers) == (n, d, layers) and memory.adapter_params(s, 16) == adapters
    small = 2 * 32000 * 4096 + 65 * 4096  # the embedding, the head and the norms stay 16-bit (QLoRA's recipe)
    lo = memory.training_memory(s, "lora", tokens, rank=16)
    assert lo["weights"] == 2 * n + 2 * adapters  # the 16-bit base and the adapters' own 16-bit copy
    assert lo["gradients"] == 2 * adapters and lo["optimizer"] == 12 * adapters  # master 4 + m 4 + v 4
    q = memory.training_memory(s, "qlora", tokens, rank=16)
    nf4_dq_bits = 4 + 8 / 64 + 32 / (64 * 256)  # 4.127: 4-bit codes, an 8-bit absmax per 64, an FP32 per 256 of those
    assert q["weights"] == pytest.approx((n - small) * nf4_dq_bits / 8 + 2 * small + 2 * adapters, rel=1e-12)
    assert q["weights"] == pytest.approx(0.5159 * (n - small) + 2 * small + 2 * adapters, rel=1e-4)
    plain = memory.training_memory(s, "full", tokens)["activations"]
    ckpt = memory.training_memory(s, "full", tokens, checkpointing=True)["activations"]
    assert plain == layers * tokens * d * 34  # Korthikanti et al. with flash attention: 34 d bytes per token per layer
    assert ckpt == layers * tokens * d * 2 + tokens * d * 34  # each layer's 16-bit input + one layer rebuilt


def test_a_lora_rank_beyond_the_smallest_side_of_an_adapted_layer_is_refused():
    tiny = memory.training_memory(CFG_SPEC, "lora", 64, rank=32)  # d_model 32: rank 32 still fits every linear
    assert tiny["gradients"] == 2 * memory.adapter_params(CFG_SPEC, 32)
    for method in ("lora", "qlora"):
        assert_refused(lambda: memory.training_memory(CFG_SPEC, method, 64, rank=33), ValueError, "rank", 33,
                       "at most 32")
        assert_refused(lambda: memory.training_memory(CFG_SPEC, method, 64, rank=0), ValueError, "rank", 0,
                       "positive")
    assert_refused(lambda: memory.training_memory("llama-2-7b", "qlora", 64, rank=5000), ValueError, "rank", 5000,
                   "at most 4096")
    gqa = ModelSpec("gqa", 2, 64, 4, 1, 128, 256, 32)  # wk and wv [16, 64]: the smallest side of every linear 16
    assert_refused(lambda: memory.training_memory(gqa, "lora", 64, rank=17), ValueError, "rank", 17, "at most 16")
    assert memory.training_memory(gqa, "lora", 64, rank=16)["gradients"] == 2 * memory.adapter_params(gqa, 16)


def test_an_optimizers_bytes_count_each_storage_once_and_the_step_counters():
    # the one rule zero.py, AdamW8bit.state_bytes and measure_step count with: torch's AdamW keeps m, v and a
    # 0-dim float32 step per parameter tensor; a tied weight is one parameter, one set of states
    w = torch.nn.Parameter(torch.randn(6, 4))
    b = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.AdamW([w, b])
    (w.sum() + b.sum()).backward()
    opt.step()
    states = [t for st in opt.state.values() for t in st.values()]
    assert memory.optimizer_state_bytes(opt) == sum(t.numel() * t.element_size() for t in states) == 8 * 28 + 2 * 4
    view = w.detach()[:2]  # a view of w's storage, and w itself: one storage
    assert memory.storage_bytes([w.detach(), view, b.detach()]) == 4 * 28
    with pytest.raises(TypeError, match="optimizer must be"):
        memory.optimizer_state_bytes([w])
