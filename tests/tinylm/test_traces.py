"""Recorded TinyLM traces: structure, bytes per token (against param_counts), KV growth, scaling."""
import numpy as np
import pytest

from labkit import specs
from labkit.tinylm import param_counts
from labkit.tinylm import record_decode_trace
from labkit.unified_memory.layouts import layout, scale_trace, total_bytes, trace_pages


@pytest.fixture(scope="module")
def trace(pretrained):
    model, tok = pretrained
    return model, record_decode_trace(model, tok.encode("Hello"), 3)


def test_order_and_kv_growth(trace):
    model, tr = trace
    cfg = model.cfg
    assert len(tr) == 3
    for t, events in enumerate(tr):
        assert len(events) == 1 + 11 * cfg.n_layers + 2
        assert events[0][0] == "tok_emb" and events[0][2] - events[0][1] == 1
        assert [e[0] for e in events[-2:]] == ["norm", "lm_head"]
        layers = [int(e[0].split(".")[1]) for e in events[1:-2]]
        assert layers == sorted(layers)
        kv = [e for e in events if e[0] == "kv.0.k"]
        assert kv == [("kv.0.k", 0, 5 + 1 + t)]  # prompt of 5, this token: the cache grows by one a step


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
