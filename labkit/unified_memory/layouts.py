"""Tensors laid out in pages: where each weight and KV-cache row of a model lives in one address range,
and TinyLM's recorded decode trace replayed on a bigger model (notebook 02).

`layout` places the tensors of any Llama-style ModelSpec (or TinyLMConfig) in forward order, each starting
on a 4 KiB boundary; tensor names are those of labkit.tinylm's table of linear layers and of its traces.
`trace_pages` turns trace events into virtual page numbers for the paging engine. `scale_trace` replays
TinyLM's recorded order on a bigger model: its per-layer pattern repeated for the big model's layers (rows
scaled to the big tensors), so a 4-layer trace drives a Llama-2-7B (32 layers) or 70B (80 layers) layout.

    address  0 ........................................................................ total
             [tok_emb][L0: attn_norm wq wk wv wo mlp_norm gate up down][L1 ...]...[norm][lm_head][kv.0.k][kv.0.v]...
"""

from __future__ import annotations

import numpy as np

from ..tinylm import Event, linear_layers

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
    hd = spec.d_model // spec.n_heads
    w = lambda cols: int(round(cols * bytes_per_weight))  # noqa: E731  bytes of one row
    shapes, previous = [], None
    for e in linear_layers(spec):
        if e.layer_type != previous and e.layer_type in ("attention", "mlp"):  # each sub-block opens with its norm
            shapes.append((f"layers.{e.layer}.{'attn' if e.layer_type == 'attention' else 'mlp'}_norm", w(spec.d_model), 1))
        if e.layer_type == "head":
            shapes.append(("norm", w(spec.d_model), 1))
            if spec.tied_embeddings:
                break
        out_features, in_features = e.shape
        shapes.append((e.path, w(in_features), out_features))
        previous = e.layer_type
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
