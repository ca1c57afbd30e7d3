"""The calculator and the measurement: a measured TinyLM step holds exactly 4 bytes of weights, 4 of gradients and
8 of Adam states per parameter (16), the profiler's peak covers what the step held, adapter counts equal the
parameters add_lora creates, checkpointing saves activations, and the paged-state replay counts faults."""
import torch

from labkit.finetune import lora, memory
from labkit.specs import model as spec
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused

CFG = TinyLMConfig(d_model=32, n_layers=4, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)


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
