import hashlib

import pytest

from labkit.rng import Rng
from labkit.tinylm import ByteTokenizer
from labkit.tinylm import corpus as data

from ..refusals import assert_refused


def test_corpus_is_deterministic_and_seeded():
    a = data.corpus("train", 200_000, seed=0)
    assert a == data.corpus("train", 200_000, seed=0)
    assert a != data.corpus("train", 200_000, seed=1)
    assert a != data.corpus("val", 200_000, seed=0)
    assert len(a) == 200_000


def test_corpus_bytes_are_the_same_on_every_machine():
    # Golden digest: the corpus must not change with the platform or Python version. If you change the
    # generator on purpose, retrain TinyLM (python -m labkit.train) and update this digest.
    digest = hashlib.sha256(data.corpus("train", 100_000, seed=0)).hexdigest()
    assert digest == GOLDEN_TRAIN_SHA256


GOLDEN_TRAIN_SHA256 = "bf875231f5bbbcc6ceae41258ecc84bad7d1159df1ed053062f62c9fc1e03203"


def test_corpus_holds_every_kind_and_kind_of_names_it():
    for kind in data.TASK_KINDS:
        assert all(data.kind_of(t.prompt + t.answer) == kind for t in data.make_tasks(kind, 50))
    docs = data.corpus("train", 50_000).decode().split("\n")[:-1]
    kinds = [data.kind_of(d) for d in docs]
    assert set(kinds) == set(data.DOC_KINDS)
    assert all(d[0].isupper() and d.rstrip().endswith(".") for d, k in zip(docs, kinds) if k == "text")


@pytest.mark.parametrize("kind", data.TASK_KINDS)
@pytest.mark.parametrize("split", data.SPLITS)
def test_task_answers_are_right(kind, split):
    for t in data.make_tasks(kind, 300, split, seed=3):
        assert t.kind == kind and "\n" not in t.prompt + t.answer
        if kind == "arithmetic":
            a, b = t.prompt.rstrip("=").split("+")
            assert int(t.answer) == int(a) + int(b)
            assert data.arithmetic_split(int(a), int(b)) == split
        elif kind == "recall":
            body, *questions = (t.prompt + t.answer)[len("kv: "):].split(" ? ")
            pairs = dict(p.split("=") for p in body.split())
            assert len(pairs) == len(body.split()), "keys must be distinct"
            assert len(questions) == 3 and len({q.split("=")[0] for q in questions}) == 3
            for q in questions:
                key, value = q.split("=")
                assert pairs[key] == value
            assert t.prompt.endswith(f" ? {key}=") and t.answer == value
            assert len(t.prompt + t.answer) < 256
        else:
            assert t.prompt == f"copy {t.answer} -> "


def test_arithmetic_splits_are_disjoint_and_cover_all_pairs():
    owners = {(a, b): data.arithmetic_split(a, b) for a in range(100) for b in range(100)}
    counts = {s: sum(v == s for v in owners.values()) for s in data.SPLITS}
    assert sum(counts.values()) == 10_000
    assert counts["val"] > 300 and counts["test"] > 300
    train_lines = set(data.corpus("train", 300_000).decode().split("\n"))
    test = data.make_tasks("arithmetic", 200, "test")
    assert not any(t.prompt + t.answer in train_lines for t in test)


def test_tasks_are_deterministic_and_seeded():
    assert data.make_tasks("recall", 5, seed=0) == data.make_tasks("recall", 5, seed=0)
    assert data.make_tasks("recall", 5, seed=0) != data.make_tasks("recall", 5, seed=1)
    assert data.make_tasks("copy", 5, "val") != data.make_tasks("copy", 5, "test")


def test_bad_input_gets_clear_errors():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="split must be one of"):
        data.corpus("training")
    with pytest.raises(ValueError, match="n_bytes must be a positive int, got 0"):
        data.corpus("train", 0)
    with pytest.raises(ValueError, match="kind must be one of"):
        data.make_tasks("sorting", 3)
    with pytest.raises(ValueError, match="n must be a positive int"):
        data.make_tasks("copy", -1)
    with pytest.raises(ValueError, match=r"ids must be byte values \(ints in \[0, 256\)\), got 300"):
        tok.decode([65, 300])
    with pytest.raises(TypeError, match="got 65.7"):
        tok.decode([65.7])
    with pytest.raises(TypeError, match="seed must be a non-negative int, got '1'"):
        data.corpus("train", 10, seed="1")
    with pytest.raises(TypeError, match="seed must be a non-negative int, got 1.5"):
        data.make_tasks("copy", 2, seed=1.5)
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        Rng(0).below(0)
    with pytest.raises(ValueError, match="text must be valid Unicode"):
        tok.encode("\ud800")
    with pytest.raises(TypeError, match="text must be str or bytes"):
        tok.encode(42)
    with pytest.raises(TypeError, match="document must be a str, got bytes"):
        data.kind_of(b"copy a -> a")
    with pytest.raises(TypeError, match="seed must be an int"):
        Rng(1.5)


def test_arithmetic_split_takes_two_digit_operands_only():
    assert_refused(lambda: data.arithmetic_split("a", 2), TypeError, "a", "a", "an int in [0, 99]")
    assert_refused(lambda: data.arithmetic_split(3, 100), ValueError, "b", 100, "an int in [0, 99]")
