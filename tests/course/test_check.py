import numpy as np
import pytest
import torch

from labkit.course import check
from labkit import tinylm as lm
from labkit.tinylm.config import random_config


def reference(cfg):
    return lm.param_counts(cfg)


CASES = [(lm.TinyLMConfig(),)]


def random_case(rng):
    return (random_config(rng),)


def run(fn, capsys, **kw):
    used = check.exercise(fn, reference, cases=CASES, random_case=random_case, **kw)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, "one verdict line"
    return used, lines[0]


def test_pass_returns_the_learners_function(capsys):
    def mine(cfg):
        return dict(lm.param_counts(cfg))
    used, line = run(mine, capsys)
    assert used is mine
    assert line == "[PASS] mine matches the reference on 1 fixed and 20 random cases."


def test_not_implemented_falls_back_to_the_reference(capsys):
    def mine(cfg):
        raise NotImplementedError("exercise: write this part")
    used, line = run(mine, capsys)
    assert used is reference
    assert line.startswith("[TODO] mine: not implemented yet")


def test_wrong_answer_names_the_input_and_the_difference(capsys):
    def mine(cfg):  # forgets that untied embeddings count twice
        counts = lm.param_counts(cfg)
        if not cfg.tie_embeddings:
            counts["embedding"] //= 2
        return counts
    used, line = run(mine, capsys)
    assert used is reference
    assert line.startswith("[FAIL] mine(TinyLMConfig(") and "tie_embeddings=False" in line
    assert "returned ['embedding'] = " in line and ", not the answer for this case" in line


def test_a_crash_is_reported_not_raised(capsys):
    def mine(cfg):
        return 1 / 0
    used, line = run(mine, capsys)
    assert used is reference
    assert "raised ZeroDivisionError" in line


def test_verdict_is_deterministic(capsys):
    def mine(cfg):
        return {**lm.param_counts(cfg), "norm": 0} if cfg.n_layers == 3 else lm.param_counts(cfg)
    assert run(mine, capsys)[1] == run(mine, capsys)[1]


@pytest.mark.parametrize("got, expected, ok", [
    (3, 3, True), (3.0000000001, 3, True), (350_000_000_001, 350_000_000_000, False), (3.0, 3, True), (3.1, 3, False),
    ("a", "a", True), ("a", "b", False),
    ({"a": 1}, {"a": 1}, True), ({"a": 1}, {"a": 1, "b": 2}, False), ([1, 2], (1, 2), True),
    (torch.ones(2), torch.ones(2), True), (torch.ones(3), torch.ones(2), False), (True, False, False),
    (None, 1.0, False), ("1", 1, False),
])
def test_same(got, expected, ok):
    assert check.same(got, expected) is ok


def test_a_function_that_changes_its_input_does_not_spoil_the_reference(capsys):
    def mine(xs):
        xs.append(0)
        return sum(xs)
    used = check.exercise(mine, lambda xs: sum(xs) + 1, cases=[([1, 2],)])
    assert used is not mine and "returned 3, not the answer for this case" in capsys.readouterr().out


@pytest.mark.parametrize("got, expected, words", [
    ([1, 2, 3], [1, 5, 3], "as value 2 of 3: 2, not the answer for this case"),
    ({"a": 1}, {"b": 1}, "keys ['a'], expected keys ['b']"),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]),
     "a [2] float32 result whose first difference is at index (1,): 2.0, expected 2.5 (largest difference 0.5, "
     "1 of 2 elements differ)"),
    (torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int8), "dtype int32, expected int8"),
    (torch.zeros(2, 3), torch.zeros(3, 2),
     "tensor(shape [2, 3], float32) [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], expected shape [3, 2]"),
    (torch.tensor([0x3A], dtype=torch.uint8), torch.tensor([0xA3], dtype=torch.uint8),
     "index (0,): 58 (0x3a), expected 163 (0xa3)"),
    ("x", 3, "'x' (str), expected an int"),
    (2.0, 3, "2.0 (float), expected an int"),
])
def test_difference_says_where(got, expected, words):
    assert words in check.difference(got, expected)


def test_rerunning_the_check_on_the_reference_is_not_a_pass(capsys):
    used, line = run(reference, capsys)
    assert used is reference and line.startswith("[TODO] reference is the reference: run your exercise cell")


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one fixed case"):
        check.exercise(reference, reference)
    with pytest.raises(ValueError, match="at least one fixed case"):
        check.exercise(reference, reference, random_case=random_case, n_random=0)
    with pytest.raises(ValueError, match="n_random must be a non-negative int, got -1"):
        check.exercise(reference, reference, cases=CASES, n_random=-1)
    with pytest.raises(TypeError, match="callables"):
        check.exercise(None, reference, cases=CASES)


def test_an_exercise_object_supplies_cases_and_tolerance(capsys):
    ex = check.Exercise("halve", lambda x: x / 2, cases=[(1.0,), (3.0,)], random_case=lambda rng: (rng.below(100),),
                        n_random=5, rtol=1e-3)
    assert ex.check(lambda x: x / 2 * (1 + 1e-4)) is not ex.reference   # inside the tolerance
    assert capsys.readouterr().out.startswith("[PASS] halve matches the reference on 2 fixed and 5 random")
    assert check.exercise(lambda x: x / 2 * (1 + 1e-2), ex) is ex.reference  # outside it
    assert capsys.readouterr().out.startswith("[FAIL] halve(1.0) returned 0.505, not the answer for this case.")
    exact = check.Exercise("halve", lambda x: x / 2, cases=[(1.0,)], compare=lambda got, want: got == want)
    assert exact.check(lambda x: x * 0.5) is not exact.reference
    assert exact.check(lambda x: x / 2 + 1e-12) is exact.reference
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0, got -1"):
        check.exercise(reference, reference, cases=CASES, rtol=-1)


def test_integer_answers_must_come_in_the_asked_dtype_and_tensors_print_short(capsys):
    ref = lambda w: (w * 7).round().to(torch.int8)  # noqa: E731
    ex = check.Exercise("codes", ref, cases=[(torch.linspace(-1, 1, 64).reshape(8, 8),)])
    assert ex.check(lambda w: ref(w).to(torch.int32)) is ref
    line = capsys.readouterr().out
    assert "codes(tensor(shape [8, 8], float32)) returned dtype int32, expected int8" in line and len(line) < 200
    assert check.same(torch.ones(2, dtype=torch.float64), torch.ones(2))  # floats: any float dtype


@pytest.mark.parametrize("got, expected", [
    (True, 1), (1, True), (False, 0), (0, False), (True, 1.0), (1.0, True), (np.True_, 1), (1, np.True_),
])
def test_a_bool_is_not_a_number_and_a_number_is_not_a_bool(got, expected):
    assert check.same(got, expected) is False
    assert check.same(expected, expected) is True


@pytest.mark.parametrize("got, expected", [
    (torch.tensor([1, 2]), torch.tensor([1.0, 2.0])),                    # int for float
    (torch.tensor([1.0, 2.0]), torch.tensor([1, 2])),                    # float for int
    (torch.tensor([True, False]), torch.tensor([1.0, 0.0])),             # bool for float
    (torch.tensor([1.0, 0.0]), torch.tensor([True, False])),             # float for bool
    (torch.tensor([1 + 0j]), torch.tensor([1.0])),                       # complex for float
    (np.array([1, 2]), np.array([1.0, 2.0])), (np.array([1.0, 2.0]), np.array([1, 2])),
    ([1, 2], np.array([1.0, 2.0])),                                       # a list of ints for float values
])
def test_the_dtype_kind_of_a_tensor_or_an_array_must_be_the_asked_one(got, expected):
    assert check.same(got, expected) is False
    if not isinstance(got, list):
        assert check.difference(got, expected).startswith(f"dtype {str(got.dtype).removeprefix('torch.')}, expected ")


def test_float_answers_may_come_at_any_float_width():
    assert check.same(torch.ones(2, dtype=torch.float16), torch.ones(2))
    assert check.same(torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float64))
    assert check.same(np.ones(2, dtype=np.float32), np.ones(2))
    assert check.same([1.0, 2.0], np.array([1.0, 2.0]))


# The default tolerance, by hand: rtol 1e-6. An answer off by 1e-5 relative is wrong; one off by 1e-7 is not.
# (A default loosened 100x, to 1e-4, would let the first through: these catch it at every entry point.)
@pytest.mark.parametrize("expected", [3.0, 7.25e9, -2.5e-3])
def test_an_answer_off_by_1e_5_relative_fails_the_default_check(expected, capsys):
    off, close = expected * (1 + 1e-5), expected * (1 + 1e-7)
    assert check.same(off, expected) is False and check.same(close, expected) is True
    assert check.same(torch.tensor([off]), torch.tensor([expected], dtype=torch.float64)) is False
    assert check.same(np.array([off]), np.array([expected])) is False
    assert check.same({"x": [off]}, {"x": [expected]}) is False
    ref = lambda x: x  # noqa: E731
    assert check.exercise(lambda x: x * (1 + 1e-5), ref, cases=[(expected,)], name="mine") is ref
    assert capsys.readouterr().out.startswith("[FAIL] mine(")
    ex = check.Exercise("ident", ref, cases=[(expected,)])
    assert ex.check(lambda x: x * (1 + 1e-5)) is ref
    assert capsys.readouterr().out.startswith("[FAIL] ident(")
    assert ex.check(lambda x: x * (1 + 1e-7)) is not ref
    assert capsys.readouterr().out.startswith("[PASS]")
