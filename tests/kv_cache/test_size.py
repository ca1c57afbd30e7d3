"""KV bytes per token against the published arithmetic (DeepSeek-V3: (512 + 64) x 61 x 2 = 70,272)
and the per-head formula written out here."""
import pytest

from labkit.kv_cache import size
from labkit.specs import model
from tests.refusals import assert_refused


def test_the_table_follows_the_formulas():
    rows = {r["model"]: r for r in size.kv_size_table(context=1000, batch=3)}
    assert rows["deepseek-v3"]["bytes/token"] == (512 + 64) * 61 * 2 == 70_272
    assert rows["llama-2-7b"]["bytes/token"] == 2 * 32 * 32 * 128 * 2
    assert rows["llama-3-70b"]["bytes/token"] == 2 * 80 * 8 * 128 * 2
    assert rows["llama-2-7b-mqa"]["bytes/token"] == 2 * 32 * 1 * 128 * 2
    assert rows["opt-13b"]["GiB (3 x 1000)"] == pytest.approx(2 * 40 * 5120 * 2 * 3000 / 2**30)
    assert {r["attention"] for r in rows.values()} == {"MHA", "GQA", "MQA", "MLA"}


@pytest.mark.parametrize("name, kind", [("llama-2-7b", "MHA"), ("llama-3-8b", "GQA"), ("deepseek-v3", "MLA")])
def test_attention_kind(name, kind):
    assert size.attention_kind(model(name)) == kind
    assert size.attention_kind(size.mqa_example()) == "MQA"


def test_kv_bytes_grows_linearly_with_context_and_batch():
    s = model("llama-3-8b")
    assert size.kv_bytes(s, 8192, 4) == 4 * 2 * size.kv_bytes(s, 4096, 1)
    assert size.kv_bytes(s, 10, 1, bytes_per_element=1) * 2 == size.kv_bytes(s, 10, 1)


def test_bad_input_is_refused():
    assert_refused(lambda: size.kv_bytes(model("llama-3-8b"), 0), ValueError, "context", 0, "a positive int")
    assert_refused(lambda: size.attention_kind("llama"), TypeError, "spec", "llama", "a labkit.specs.ModelSpec")
