"""Which weight and KV-cache bytes a decoder touches for each generated token, in order (notebook 02).

`record_decode_trace` runs TinyLM with hooks and writes down, per decoded token, every tensor the
forward pass reads, as events (tensor, first row, end row):

    ("tok_emb", 72, 73)                 one embedding row: the token's
    ("layers.0.attn_norm", 0, 1)        a norm weight (one row of d_model)
    ("layers.0.wq", 0, 128) ...         a whole weight matrix, rows = output features
    ("kv.0.k", 0, 15), ("kv.0.v", 0, 15)  the cached keys/values of positions 0..t (the KV cache grows)
    ... x n_layers ..., ("norm", 0, 1), ("lm_head", 0, 256)

`layout` lays the tensors of any ModelSpec out in one address range (bytes), and `trace_pages` turns
events into virtual page numbers for labkit.unified_memory. `scale_trace` replays TinyLM's recorded order
on a bigger model: its per-layer pattern repeated for the big model's layers (its rows scaled to the big
tensors), so a 4-layer trace drives a Llama-2-7B (32 layers) or 70B (80 layers) layout.

    address  0 ........................................................................ total
             [tok_emb][L0: norm wq wk wv wo norm gate up down][L1 ...]...[norm][lm_head][kv.0.k][kv.0.v]...
"""

from __future__ import annotations

import numpy as np
import torch

Event = tuple[str, int, int]
_LINEAR = {"attn.wq": "wq", "attn.wk": "wk", "attn.wv": "wv", "attn.wo": "wo", "mlp.w_gate": "w_gate",
           "mlp.w_up": "w_up", "mlp.w_down": "w_down"}


@torch.no_grad()
def record_decode_trace(model, prompt: list[int], n_tokens: int) -> list[list[Event]]:
    """Events of each of `n_tokens` decode steps (greedy, KV cache) after `prompt`; see the module doc."""
    from .model import KVCache

    if not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive int, got {n_tokens!r}")
    if not prompt or len(prompt) + n_tokens > model.cfg.max_seq_len:
        raise ValueError(f"prompt length {len(prompt)} + n_tokens {n_tokens} must be in [1, {model.cfg.max_seq_len}]")
    weight = next(model.parameters())
    cache = KVCache(model.cfg, dtype=weight.dtype, device=weight.device)
    events: list[Event] = []
    hooks = []

    def hook(name, kind):
        def pre(module, args):
            if kind == "emb":
                for t in args[0].flatten().tolist():
                    events.append((name, t, t + 1))
                return
            if name.endswith(".wo"):  # attention reads the cache between the q/k/v and the output projections
                layer = name.split(".")[1]
                events.extend([(f"kv.{layer}.k", 0, cache.length + 1), (f"kv.{layer}.v", 0, cache.length + 1)])
            events.append((name, 0, module.weight.shape[0] if kind == "linear" else 1))
        return pre

    for full, module in model.named_modules():
        parts = full.split(".")
        if full == "tok_emb":
            hooks.append(module.register_forward_pre_hook(hook("tok_emb", "emb")))
        elif full in ("norm", "lm_head"):
            hooks.append(module.register_forward_pre_hook(hook(full, "linear" if full == "lm_head" else "norm")))
        elif len(parts) >= 3 and parts[0] == "layers":
            rest = ".".join(parts[2:])
            if rest in _LINEAR:
                hooks.append(module.register_forward_pre_hook(hook(f"layers.{parts[1]}.{_LINEAR[rest]}", "linear")))
            elif rest in ("attn_norm", "mlp_norm"):
                hooks.append(module.register_forward_pre_hook(hook(f"layers.{parts[1]}.{rest}", "norm")))
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


def layout(spec, bytes_per_weight: float = 2, kv_tokens: int | None = None,
           kv_bytes_per_element: float = 2) -> dict[str, tuple[int, int, int]]:
    """tensor name -> (byte offset, bytes per row, rows) for a ModelSpec (labkit.specs), every tensor
    starting on a 4 KiB boundary. KV cache: kv_tokens positions (default: spec.context) per layer."""
    if not hasattr(spec, "n_kv_heads"):
        raise TypeError(f"spec must be a labkit.specs.ModelSpec, got {type(spec).__name__}")
    if not isinstance(bytes_per_weight, (int, float)) or bytes_per_weight <= 0:
        raise ValueError(f"bytes_per_weight must be a positive number, got {bytes_per_weight!r}")
    kv_tokens = spec.context if kv_tokens is None else kv_tokens
    if not isinstance(kv_tokens, int) or kv_tokens < 1:
        raise ValueError(f"kv_tokens must be a positive int, got {kv_tokens!r}")
    d, hd = spec.d_model, spec.d_model // spec.n_heads
    w = lambda cols: int(round(cols * bytes_per_weight))  # noqa: E731
    shapes = [("tok_emb", w(d), spec.vocab_size)]
    for i in range(spec.n_layers):
        shapes += [(f"layers.{i}.attn_norm", w(d), 1), (f"layers.{i}.wq", w(d), spec.n_heads * hd),
                   (f"layers.{i}.wk", w(d), spec.n_kv_heads * hd), (f"layers.{i}.wv", w(d), spec.n_kv_heads * hd),
                   (f"layers.{i}.wo", w(spec.n_heads * hd), d), (f"layers.{i}.mlp_norm", w(d), 1),
                   (f"layers.{i}.w_gate", w(d), spec.d_ff), (f"layers.{i}.w_up", w(d), spec.d_ff),
                   (f"layers.{i}.w_down", w(spec.d_ff), d)]
    shapes += [("norm", w(d), 1)] + ([] if spec.tied_embeddings else [("lm_head", w(d), spec.vocab_size)])
    kv_row = int(round(spec.n_kv_heads * hd * kv_bytes_per_element))
    shapes += [(f"kv.{i}.{kv}", kv_row, kv_tokens) for i in range(spec.n_layers) for kv in "kv"]
    out, offset = {}, 0
    for name, row, rows in shapes:
        out[name] = (offset, row, rows)
        offset += -(-row * rows // 4096) * 4096
    if spec.tied_embeddings:
        out["lm_head"] = out["tok_emb"]
    return out


def total_bytes(lay: dict) -> int:
    """Bytes spanned by a layout (its last tensor's end, 4 KiB aligned)."""
    return max(-(-(off + row * rows) // 4096) * 4096 for off, row, rows in lay.values())


def scale_trace(events: list[Event], spec, tiny_layout: dict) -> list[Event]:
    """TinyLM events of one token replayed on `spec`: TinyLM's layer-0 pattern for each of spec's layers,
    rows scaled to the big tensors (a whole matrix stays whole; an embedding row keeps its token id)."""
    big = layout(spec, kv_tokens=1)
    layer0 = [e for e in events if e[0].startswith(("layers.0.", "kv.0."))]
    head = [e for e in events if not e[0].startswith(("layers.", "kv."))]
    first = [e for e in head if e[0] == "tok_emb"]
    last = [e for e in head if e[0] != "tok_emb"]

    def scaled(name, r0, r1, big_name):
        if name.startswith("kv."):
            return big_name, r0, r1                      # positions stay positions
        if name == "tok_emb":
            return big_name, r0, r1                      # the token's row
        rows_tiny, rows_big = tiny_layout[name][2], big[big_name][2]
        return big_name, r0 * rows_big // rows_tiny, -(-r1 * rows_big // rows_tiny)

    out = [scaled(n, a, b, n) for n, a, b in first]
    for i in range(spec.n_layers):
        for n, a, b in layer0:
            out.append(scaled(n, a, b, n.replace(".0.", f".{i}.", 1)))
    out += [scaled(n, a, b, n) for n, a, b in last]
    return out


def trace_pages(events: list[Event], lay: dict, page_size: int = 4096, first_page: int = 0) -> np.ndarray:
    """Virtual page numbers touched by `events`, in order (a page touched by consecutive rows once)."""
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    starts, ends = [], []
    for name, r0, r1 in events:
        if name not in lay:
            raise ValueError(f"tensor {name!r} is not in the layout")
        off, row, rows = lay[name]
        if not 0 <= r0 < r1 <= rows:
            raise ValueError(f"rows [{r0}, {r1}) of {name!r} are outside its {rows} rows")
        starts.append((off + r0 * row) // page_size)
        ends.append(-(-(off + r1 * row) // page_size))
    starts, ends = np.array(starts, np.int64), np.array(ends, np.int64)
    lengths = ends - starts
    idx = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return first_page + idx + np.arange(lengths.sum())
