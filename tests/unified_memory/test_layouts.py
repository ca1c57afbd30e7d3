"""TinyLM's recorded traces laid out in pages: bytes per token against param_counts, scaling to Llama-2,
page numbers by hand, the helpers notebook 02 uses (step_pages, module_bytes, ngl_args)."""
import numpy as np
import pytest

from labkit import specs
from labkit.tinylm import param_counts, record_decode_trace
from labkit.unified_memory.layouts import (layout, module_bytes, ngl_args, scale_trace, step_pages, total_bytes,
                                           trace_pages)

from ..refusals import assert_refused


@pytest.fixture(scope="module")
def trace(pretrained):
    """(TinyLM, its 3 decode steps after the prompt "Hello")."""
    return pretrained[0], record_decode_trace(pretrained[0], pretrained[1].encode("Hello"), 3)


def test_bytes_per_token_match_the_parameter_count(trace):
    model, tr = trace
    cfg = model.cfg
    lay = layout(specs.model("tinylm"), bytes_per_weight=4, kv_bytes_per_element=4)
    for t, events in enumerate(tr):
        nbytes = sum((r1 - r0) * lay[n][1] for n, r0, r1 in events)
        kv = 2 * cfg.n_layers * (6 + t) * cfg.n_kv_heads * cfg.head_dim * 4
        # every weight once, except the embedding: one row in, then all of it again as the tied lm_head
        assert nbytes == 4 * (param_counts(cfg)["total"] + cfg.d_model) + kv
    pages = trace_pages(tr[0], lay, 4096)
    assert pages.min() >= 0 and pages.max() < total_bytes(lay) // 4096


def test_scaled_to_llama_2_7b(trace):
    model, tr = trace
    spec = specs.model("llama-2-7b")
    tiny = layout(specs.model("tinylm"), bytes_per_weight=4)
    events = scale_trace(tr[0], spec, tiny)
    assert len(events) == 1 + 11 * spec.n_layers + 2
    lay = layout(spec, kv_tokens=256)
    pages = trace_pages(events, lay)
    weights = 2 * (spec.published_params - spec.vocab_size * spec.d_model + spec.d_model)
    kv = 2 * spec.n_layers * 6 * spec.d_model * 2
    assert weights + kv <= len(pages) * 4096 <= weights + kv + len(events) * 4096
    assert len(np.unique(pages)) == len(pages)  # each tensor starts on its own page: no page twice


def test_trace_pages_by_hand_and_errors():
    lay = {"a": (0, 100, 100), "b": (12288, 8192, 2)}
    assert trace_pages([("a", 0, 50), ("b", 1, 2)], lay, 4096).tolist() == [0, 1, 5, 6]
    with pytest.raises(ValueError, match="rows"):
        trace_pages([("a", 0, 101)], lay)
    with pytest.raises(ValueError, match="'c'"):
        trace_pages([("c", 0, 1)], lay)
    with pytest.raises(TypeError, match="ModelSpec"):
        layout("llama")


def test_step_pages_one_array_per_token(trace):
    _, tr = trace
    spec, tiny = specs.model("llama-2-7b"), layout(specs.model("tinylm"), bytes_per_weight=4)
    lay = layout(spec, kv_tokens=256)
    steps = step_pages(tr, spec, lay, tiny, 2**18)
    assert len(steps) == 3 and all(s.dtype == np.int64 for s in steps)
    assert steps[0].tolist() == trace_pages(scale_trace(tr[0], spec, tiny), lay, 2**18).tolist()
    assert len(steps[2]) >= len(steps[0])  # the KV cache grows


def test_module_bytes_and_ngl_args_by_hand():
    lay = {"tok_emb": (0, 10, 4), "layers.0.attn_norm": (40, 10, 1), "layers.0.attn.wq": (50, 10, 3),
           "layers.1.mlp.w_up": (80, 20, 2), "norm": (120, 10, 1), "lm_head": (130, 10, 5), "kv.0.k": (180, 4, 2)}
    assert module_bytes(lay, 2) == {"embed": 40, "layer0": 40, "layer1": 40, "output": 60}
    assert ngl_args(lay, 2) == {"layer_bytes": [40, 40], "output_bytes": 60, "embedding_row_bytes": 10}
    spec = specs.model("llama-2-70b")
    sizes = module_bytes(layout(spec, kv_tokens=1), spec.n_layers)
    assert sum(sizes.values()) == pytest.approx(2 * spec.published_params, rel=0.002)  # FP16 weights
    with pytest.raises(ValueError, match="lay must be a layout"):
        module_bytes({"tok_emb": (0, 1, 1)}, 1)
    with pytest.raises(TypeError, match="n_layers"):
        module_bytes(lay, 2.0)


def test_layout_refuses_bad_settings():
    spec = specs.model("tinylm")
    for kwargs, error in ((dict(bytes_per_weight=0), ValueError), (dict(bytes_per_weight="2"), TypeError),
                          (dict(kv_tokens=0), ValueError), (dict(kv_tokens=1.5), TypeError),
                          (dict(kv_bytes_per_element=-1), ValueError)):
        with pytest.raises(error, match=next(iter(kwargs))):
            layout(spec, **kwargs)
    with pytest.raises(TypeError, match="page_size"):
        trace_pages([], {}, page_size=4096.0)


def test_layouts_and_events_of_the_wrong_shape_are_refused():
    lay = {"w": (0, 8, 4)}
    assert_refused(lambda: total_bytes({}), ValueError, "lay", {}, "a non-empty layout")
    assert_refused(lambda: module_bytes(None, 2), TypeError, "lay", None, "a non-empty layout")
    assert_refused(lambda: trace_pages([("w",)], lay), TypeError, "events[0]", ("w",), "an event (tensor name")
    assert_refused(lambda: trace_pages([("w", 0.5, 2)], lay), TypeError, "events[0] first row", 0.5, "an int >= 0")
    assert_refused(lambda: step_pages(None, specs.model("llama-2-7b"), lay, lay), TypeError, "steps", None, "a list")
    assert trace_pages([("w", 0, 4)], lay).tolist() == [0]


@pytest.mark.parametrize("bytes_per_weight", [4, 2, 0.5])
def test_every_tensor_starts_on_its_own_4_kib_page_right_after_the_previous(bytes_per_weight):
    """TinyLM's norms are 128 weights (a fraction of a page): each still gets a page of its own, and the next
    tensor starts on the page after the previous one ends (counted here from the sizes, in forward order)."""
    spec = specs.model("tinylm")
    lay = layout(spec, bytes_per_weight=bytes_per_weight, kv_tokens=3)
    tensors = sorted((off, row * rows, name) for name, (off, row, rows) in lay.items() if name != "lm_head")
    assert tensors[0][0] == 0 and tensors[1][2] == "layers.0.attn_norm"
    for (off, size, name), (next_off, _, _) in zip(tensors, tensors[1:]):
        assert off % 4096 == 0 and next_off == off + 4096 * ((size + 4095) // 4096), name
    assert total_bytes(lay) == tensors[-1][0] + 4096 * ((tensors[-1][1] + 4095) // 4096)
