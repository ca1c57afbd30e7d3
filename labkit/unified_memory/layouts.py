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

from .._checks import check_int, check_positive, check_positive_int, fail
from ..tinylm import Event, linear_layers


def layout(spec, bytes_per_weight: float = 2, kv_tokens: int | None = None,
           kv_bytes_per_element: float = 2) -> dict[str, tuple[int, int, int]]:
    """tensor name -> (byte offset, bytes per row, rows) for a ModelSpec (labkit.specs), every tensor
    starting on a 4 KiB boundary. KV cache: kv_tokens positions (default: spec.context) per layer."""
    if not hasattr(spec, "n_kv_heads"):
        raise TypeError(f"spec must be a labkit.specs.ModelSpec, got {type(spec).__name__}")
    check_positive("bytes_per_weight", bytes_per_weight, unit="bytes")
    check_positive("kv_bytes_per_element", kv_bytes_per_element, unit="bytes")
    kv_tokens = check_positive_int("kv_tokens", spec.context if kv_tokens is None else kv_tokens, unit="positions")
    hd = spec.d_model // spec.n_heads
    w = lambda cols: int(round(cols * bytes_per_weight))  # noqa: E731  bytes of one row
    shapes, previous = [], None
    for e in linear_layers(spec):
        if e.layer_type != previous and e.layer_type in ("attention", "mlp"):  # each sub-block opens with its norm
            shapes.append((f"layers.{e.layer}.{'attn' if e.layer_type == 'attention' else 'mlp'}_norm",
                           w(spec.d_model), 1))
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


def _check_layout(lay) -> dict:
    """`lay` itself if it is a non-empty layout (from layout()), else the error."""
    if not isinstance(lay, dict) or not lay:
        fail("lay", lay, "a non-empty layout {tensor: (offset, bytes per row, rows)} from layout()",
             TypeError if not isinstance(lay, dict) else ValueError)
    return lay


def total_bytes(lay: dict) -> int:
    """Bytes spanned by a layout (its last tensor's end, 4 KiB aligned)."""
    _check_layout(lay)
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
    check_positive_int("page_size", page_size, unit="bytes")
    check_int("first_page", first_page, 0)
    _check_layout(lay)
    starts, ends = [], []
    for index, event in enumerate(events):
        if not isinstance(event, (tuple, list)) or len(event) != 3:
            fail(f"events[{index}]", event, "an event (tensor name, first row, end row)", TypeError)
        name, r0, r1 = event
        check_int(f"events[{index}] first row", r0, 0)
        check_int(f"events[{index}] end row", r1, 1)
        if name not in lay:
            fail("event tensor", name, "a tensor of the layout")
        off, row, rows = lay[name]
        if not 0 <= r0 < r1 <= rows:
            fail(f"rows of {name!r}", (r0, r1), f"a non-empty range [r0, r1) inside its {rows} rows")
        starts.append((off + r0 * row) // page_size)
        ends.append(-(-(off + r1 * row) // page_size))
    starts, ends = np.array(starts, np.int64), np.array(ends, np.int64)
    lengths = ends - starts
    idx = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return first_page + idx + np.arange(lengths.sum())


def step_pages(steps: list[list[Event]], spec, lay: dict, tiny_layout: dict, page_size: int = 4096) -> list[np.ndarray]:
    """Virtual page numbers of each recorded TinyLM decode step (record_decode_trace) scaled to `spec` and laid
    out in `lay`: one array per token (notebook 02 replays them)."""
    if not isinstance(steps, (list, tuple)):
        fail("steps", steps, "a list of per-token event lists (record_decode_trace)", TypeError)
    return [trace_pages(scale_trace(events, spec, tiny_layout), lay, page_size) for events in steps]


def module_bytes(lay: dict, n_layers: int) -> dict[str, int]:
    """Bytes of each module of a layout, in forward order: "embed", "layer0" ... (every tensor named
    layers.<i>.*), "output" (final norm + LM head). The units accelerate's device map places (notebook 02)."""
    check_positive_int("n_layers", n_layers, unit="layers")
    _check_layout(lay)
    for name in ("tok_emb", "norm", "lm_head"):
        if name not in lay:
            fail("lay", sorted(lay)[:4], f"a layout (from layout()) with a {name!r} tensor")
    out = {"embed": lay["tok_emb"][1] * lay["tok_emb"][2]}
    for i in range(n_layers):
        out[f"layer{i}"] = sum(row * rows for name, (_, row, rows) in lay.items() if name.startswith(f"layers.{i}."))
    out["output"] = lay["norm"][1] + lay["lm_head"][1] * lay["lm_head"][2]
    return out


def ngl_args(lay: dict, n_layers: int) -> dict:
    """The layer arguments of labkit.memory_wall.offload.ngl_curve for a layout: layer_bytes (the decoder
    layers in order), output_bytes, embedding_row_bytes (one row: what a token reads)."""
    sizes = module_bytes(lay, n_layers)
    return {"layer_bytes": [sizes[f"layer{i}"] for i in range(n_layers)], "output_bytes": sizes["output"],
            "embedding_row_bytes": lay["tok_emb"][1]}
