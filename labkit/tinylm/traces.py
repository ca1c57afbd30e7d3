"""Which weight and KV-cache bytes TinyLM touches for each generated token, in order (notebook 02).

`record_decode_trace` runs TinyLM with hooks and writes down, per decoded token, every tensor the
forward pass reads, as events (tensor, first row, end row). Tensor names are the paths of TinyLM's table of
linear layers (labkit.tinylm.config), the norms' module paths, and kv.<layer>.k / kv.<layer>.v:

    ("tok_emb", 72, 73)                   one embedding row: the token's
    ("layers.0.attn_norm", 0, 1)          a norm weight (one row of d_model)
    ("layers.0.attn.wq", 0, 128) ...      a whole weight matrix, rows = output features
    ("kv.0.k", 0, 15), ("kv.0.v", 0, 15)  the cached keys/values of positions 0..t (the KV cache grows),
                                          recorded by the cache when attention asks it for them
    ... x n_layers ..., ("norm", 0, 1), ("lm_head", 0, 256)

labkit.unified_memory.layouts lays these tensors out in pages and scales the trace to bigger models.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int
from .cache import KVCache
from .config import check_tinylm, iter_linears
from .generate import check_prompt
from .model import RMSNorm

Event = tuple[str, int, int]


class _RecordingCache(KVCache):
    """A contiguous cache that writes down which cached positions attention reads."""

    def __init__(self, cfg, events: list, **kw):
        super().__init__(cfg, **kw)
        self.events = events

    def update(self, layer, k, v):
        end = self.length + k.shape[2]
        self.events.extend([(f"kv.{layer}.k", 0, end), (f"kv.{layer}.v", 0, end)])
        return super().update(layer, k, v)


@torch.no_grad()
def record_decode_trace(model, prompt: list[int], n_tokens: int) -> list[list[Event]]:
    """Events of each of `n_tokens` decode steps (greedy, KV cache) after `prompt`; see the module doc."""
    check_positive_int("n_tokens", n_tokens)
    prompt = check_prompt(prompt, check_tinylm(model).cfg.vocab_size)
    if not prompt or len(prompt) + n_tokens > model.cfg.max_seq_len:
        raise ValueError(f"prompt length {len(prompt)} + n_tokens {n_tokens} must be in [1, {model.cfg.max_seq_len}]")
    weight = next(model.parameters())
    events: list[Event] = []
    cache = _RecordingCache(model.cfg, events, dtype=weight.dtype, device=weight.device)

    def rows_of(name, module, embedding):
        def pre(_, args):
            if embedding:
                events.extend((name, t, t + 1) for t in args[0].flatten().tolist())
            else:
                events.append((name, 0, 1 if isinstance(module, RMSNorm) else module.weight.shape[0]))
        return pre

    watched = [(e.path, m, e.layer_type == "embedding") for e, m in iter_linears(model, skip_tied=False)]
    watched += [(name, m, False) for name, m in model.named_modules() if isinstance(m, RMSNorm)]
    hooks = [m.register_forward_pre_hook(rows_of(name, m, emb)) for name, m, emb in watched]
    try:
        device = weight.device
        logits = model(torch.tensor([prompt], device=device), cache)
        out = []
        for _ in range(n_tokens):
            events.clear()
            nxt = int(logits[0, -1].argmax())
            logits = model(torch.tensor([[nxt]], device=device), cache)
            out.append(list(events))
    finally:
        for h in hooks:
            h.remove()
    return out
