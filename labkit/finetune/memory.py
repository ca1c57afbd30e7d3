"""Where training's bytes go (notebook 09, section 1): the calculator and the measurement.

Mixed-precision Adam holds 16 bytes per trained parameter (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054):

    weights (16-bit)  2 | gradients (16-bit)  2 | FP32 master copy  4 | Adam m  4 | Adam v  4     = 16 bytes

TinyLM trains in FP32 on the CPU, which happens to give the same 16: weights 4 + gradients 4 + m 4 + v 4.
Activations per layer, 16-bit, per token (Korthikanti et al. 2022, arXiv:2205.05198, table 2, no parallelism):
d_model * (34 + 5 * heads * seq / d_model) bytes; with flash attention the scores are never stored and the
second term drops, leaving 34 * d_model; full recomputation keeps only each layer's 16-bit input, 2 * d_model.

Methods (bytes per parameter of the model / of the adapters):
    full    16 per parameter
    lora    the frozen base in 16-bit (2) + 16 per adapter parameter
    qlora   the frozen linears in NF4 with double quantization (4.127 bits, Dettmers et al. 2023), the
            embeddings and norms in 16-bit, + 16 per adapter parameter
Adapters of rank r on every linear of labkit.tinylm.linear_layers(spec) (attention and one dense MLP per layer;
a mixture of experts' experts get none), r * (in + out) parameters each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._checks import check_bool, check_choice, check_positive_int, check_type, fail
from ..cluster import buffers
from ..specs import ModelSpec, model as model_spec
from ..tinylm import check_tinylm, linear_layers

METHODS = ("full", "lora", "qlora")
ADAM_BYTES = {"weights": 2, "gradients": 2, "master": 4, "adam m": 4, "adam v": 4}
"""Bytes per trained parameter under mixed-precision Adam (ZeRO's 16)."""
NF4_DQ_BITS = 4 + 8 / 64 + 32 / (64 * 256)  # NF4 with double quantization: 4.127 bits per weight (QLoRA)
ACT_BYTES_PER_D = 34         # Korthikanti et al. 2022: bytes per token per layer per d_model unit, 16-bit
CHECKPOINTED_BYTES_PER_D = 2  # full recomputation: one 16-bit layer input per token per layer


def adapted_linears(spec) -> list:
    """The linears of linear_layers(spec) that get LoRA adapters: all but the embedding and a tied head."""
    tied = getattr(spec, "tied_embeddings", getattr(spec, "tie_embeddings", False))
    return [e for e in linear_layers(spec) if e.layer_type != "embedding" and not (e.path == "lm_head" and tied)]


def adapter_params(spec, rank: int) -> int:
    """LoRA parameters of rank `rank` on every adapted linear (adapted_linears): rank * (in + out) each."""
    check_positive_int("rank", rank)
    return sum(rank * (out + inp) for e in adapted_linears(spec) for out, inp in [e.shape])


def max_rank(spec) -> int:
    """The largest LoRA rank training_memory accepts for `spec` (a ModelSpec, a TinyLMConfig or a name of
    labkit.specs): the smallest side of any adapted linear (B A has rank at most that, so a larger r adds
    parameters and no expressive power)."""
    return min(min(e.shape) for e in adapted_linears(model_spec(spec) if isinstance(spec, str) else spec))


def _spec(spec) -> ModelSpec:
    if isinstance(spec, str):
        return model_spec(spec)
    return check_type("spec", spec, ModelSpec, "a labkit.specs.ModelSpec or a model name")


def training_memory(spec, method: str = "full", tokens: int = 4096, rank: int = 16,
                    checkpointing: bool = False) -> dict[str, float]:
    """Bytes to fine-tune `spec` (a ModelSpec or a name of labkit.specs) with `method` on a batch of `tokens`
    tokens (batch x sequence): weights, gradients, optimizer (master copy + Adam's m and v), activations (flash
    attention; `checkpointing`: only each layer's input, plus one layer recomputed) and their total. `rank`
    (lora, qlora) is at most the smallest side of every linear it adapts."""
    s = _spec(spec)
    check_choice("method", method, METHODS)
    check_positive_int("tokens", tokens)
    check_bool("checkpointing", checkpointing)
    if method != "full":
        check_positive_int("rank", rank)
        if rank > max_rank(s):
            e = min(adapted_linears(s), key=lambda e: min(e.shape))
            fail("rank", rank, f"at most {min(e.shape)} (the smallest side of {s.name}'s {e.path}, {e.shape})")
    n = s.n_params
    if method == "full":
        trained, weights = n, 2 * n
    else:
        trained = adapter_params(s, rank)
        if method == "lora":
            weights = 2 * n + 2 * trained
        else:
            c = s.counts()
            small = c["embedding"] + c["norm"] + c.get("router", 0)
            weights = (n - small) * NF4_DQ_BITS / 8 + 2 * small + 2 * trained
    per_layer = tokens * s.d_model
    if checkpointing:
        acts = s.n_layers * per_layer * CHECKPOINTED_BYTES_PER_D + per_layer * ACT_BYTES_PER_D
    else:
        acts = s.n_layers * per_layer * ACT_BYTES_PER_D
    out = {"weights": float(weights), "gradients": 2.0 * trained, "optimizer": 12.0 * trained,
           "activations": float(acts)}
    out["total"] = sum(out.values())
    return out


@dataclass(frozen=True)
class StepMemory:
    """One measured training step of TinyLM, bytes: weights (parameters and frozen bases), gradients, optimizer
    states, activations (what autograd saved for backward, unique storages, parameters and buffers excluded), the
    peak (what existed before the step plus the allocator's peak during it, from torch's profiler)."""
    weights: int
    gradients: int
    optimizer: int
    activations: int
    peak: int

    def as_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "peak": self.peak}


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind `tensors`, each storage counted once (views of one tensor, or tensors that
    share memory, are one allocation)."""
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes an optimizer keeps between steps: every tensor of optimizer.state (Adam's m and v, 8-bit codes and
    absmaxes, and the step counters torch keeps as 0-dim tensors), each storage once. The one rule for an
    optimizer's bytes: measure_step, finetune.zero and AdamW8bit.state_bytes count with it (notebook 09)."""
    check_type("optimizer", optimizer, torch.optim.Optimizer)
    return storage_bytes(t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor))


def weight_bytes(model) -> int:
    """Bytes of a model's parameters and buffers (frozen LoRA bases included), rotary tables excluded."""
    check_tinylm(model)
    bufs = [b for name, b in model.named_buffers() if not name.startswith("rope_")]
    return storage_bytes(list(model.parameters()) + bufs) + sum(
        m.nbytes() - storage_bytes(m.buffers()) for m in model.modules() if type(m).__name__ == "FrozenBase")


def lm_loss(model, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of tokens [B, T] (over the positions where mask [B, T - 1] is True)."""
    return next_token_loss(model(tokens[:, :-1]), tokens, mask)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """lm_loss from logits [B, T - 1, vocab] already computed for tokens [B, T]."""
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
    if mask is None:
        return losses.mean()
    m = mask.reshape(-1).float()
    return (losses * m).sum() / m.sum().clamp(min=1)


def measure_step(model, tokens: torch.Tensor, optimizer: torch.optim.Optimizer, forward=None) -> StepMemory:
    """Run two training steps of `model` on tokens [B, T] (the first creates the optimizer states), measuring
    the second: StepMemory. `forward(model, tokens)` -> loss, lm_loss by default (checkpointing passes its own)."""
    check_tinylm(model)
    check_type("optimizer", optimizer, torch.optim.Optimizer)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] < 2:
        fail("tokens", getattr(tokens, "shape", tokens), "an int64 tensor [batch, time >= 2]")
    forward = forward or lm_loss
    params = {id(p) for p in model.parameters()}
    saved: list[torch.Tensor] = []

    def pack(t):
        if id(t) not in params and t.numel() > 1:
            saved.append(t)
        return t

    def step(record: bool):
        optimizer.zero_grad(set_to_none=True)
        if record:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = forward(model, tokens)
        else:
            loss = forward(model, tokens)
        loss.backward()
        optimizer.step()

    step(False)
    optimizer.zero_grad(set_to_none=True)
    states = optimizer_state_bytes(optimizer)
    resident = weight_bytes(model) + states
    peak = buffers.allocator_peak(lambda: step(True))  # lab 08's accounting: the profiler's memory events
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    param_storages = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    acts = [t for t in saved if t.untyped_storage().data_ptr() not in param_storages]
    return StepMemory(weight_bytes(model), storage_bytes(grads), states, storage_bytes(acts), resident + peak)
