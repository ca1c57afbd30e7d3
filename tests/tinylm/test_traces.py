"""Recorded TinyLM traces: structure and KV growth (their layout in pages: tests/unified_memory/test_layouts.py)."""
import pytest

from labkit.tinylm import record_decode_trace


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


def test_text_and_non_models_are_refused(pretrained):
    import pytest

    from labkit.tinylm import record_decode_trace as record
    model, _ = pretrained
    with pytest.raises(TypeError, match="prompt must be a list of token ids .*encode text with ByteTokenizer"):
        record(model, "abc", 2)
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        record(object(), [1, 2], 2)
