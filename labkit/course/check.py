"""Exercise checks: compare a learner's function with the reference and print one verdict line.

Each lab defines its exercises once, in its package's `exercises.py`, as `Exercise` objects (the
reference, fixed cases, a random-case generator, the tolerance); the check cell after every exercise and
a test that proves each reference passes its own check both use them:

    count_params = check.exercise(count_params, tinylm_exercises.COUNT_PARAMS)

prints one of

    [PASS] count_params matches the reference on 1 fixed and 20 random cases.
    [FAIL] count_params(TinyLMConfig(...)) returned 11, not the answer for this case.
    [TODO] count_params: not implemented yet; the notebook goes on with the reference implementation.

and returns the function the rest of the notebook should use: the learner's when it passes, the
reference otherwise, so a learner who skips an exercise can still run everything after it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._checks import check_number, check_positive_int
from ..rng import Rng


def _short(x: Any, limit: int = 160) -> str:
    """A short description of a value for a verdict line: tensors and arrays by shape and dtype (and their
    values when there are at most 8), everything else by repr, cut at `limit` characters."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        kind = "tensor" if isinstance(x, torch.Tensor) else "array"
        dtype = str(x.dtype).removeprefix("torch.")
        small = (int(np.prod(x.shape)) if x.ndim else 1) <= 8
        values = f" {_rounded(x.tolist())}" if small else ""
        return f"{kind}(shape {list(x.shape)}, {dtype}){values}"
    s = repr(x)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _rounded(v):
    """Floats at 4 significant digits, inside nested lists (a verdict line stays short and readable)."""
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return float(f"{v:.4g}") if isinstance(v, float) else v


def _kind(x) -> str:
    """numpy's dtype kind of a tensor or an array: "b" bool, "i"/"u" integers, "f" floats, "c" complex."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return "f"
        if x.is_complex():
            return "c"
        return "b" if x.dtype == torch.bool else "u" if x.dtype == torch.uint8 else "i"
    return x.dtype.kind


def _same_dtype(got, expected) -> bool:
    """Integer and bool answers must come in the asked dtype (int8 codes are not int32 codes); float and
    complex answers in the asked kind, at any width (float64 for float32 is fine, int64 for float32 is not)."""
    if _kind(expected) in "biu":
        return got.dtype == expected.dtype
    return _kind(got) == _kind(expected)


def _is_bool(x) -> bool:
    return isinstance(x, (bool, np.bool_))


RTOL, ATOL = 1e-6, 1e-9  # the default tolerance: an answer off by 1e-5 relative fails


def same(got: Any, expected: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Equality for answers: exact for ints, strings and bools (a bool is not a number: True is not 1, 1 is
    not True); close for floats, tensors and arrays (same shape; the same dtype when the expected one is an
    integer or bool type, the same kind, float or complex, otherwise: an int tensor is no answer for a float
    one); recursive for dicts, lists and tuples."""
    if isinstance(expected, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == expected.shape and _same_dtype(got, expected)
                and torch.allclose(got.double(), expected.double(), rtol=rtol, atol=atol))
    if isinstance(expected, np.ndarray):
        if not isinstance(got, np.ndarray):
            got = np.asarray(got)
        return (got.shape == expected.shape and _same_dtype(got, expected)
                and bool(np.allclose(got, expected, rtol=rtol, atol=atol)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and set(got) == set(expected)
                and all(same(got[k], expected[k], rtol, atol) for k in expected))
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(same(g, e, rtol, atol) for g, e in zip(got, expected)))
    if _is_bool(expected) or _is_bool(got):
        return _is_bool(got) and _is_bool(expected) and bool(got) == bool(expected)
    if isinstance(expected, str):
        return got == expected
    if isinstance(expected, int) and isinstance(got, int):
        return got == expected
    if isinstance(expected, (int, float)) and not isinstance(got, str):
        try:
            return math.isclose(float(got), float(expected), rel_tol=rtol, abs_tol=atol)
        except (TypeError, ValueError):
            return False
    return got == expected


def _numpy(x) -> np.ndarray:
    """A tensor or array-like as a numpy array (bfloat16, which numpy lacks, as float32)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    return np.asarray(x)


def _first_difference(got, expected) -> str:
    """Shape, dtype or the first differing element of two tensors / arrays, in words."""
    g, e = _numpy(got), _numpy(expected)
    if g.shape != e.shape:
        return f"{_short(got)}, expected shape {list(e.shape)}"
    if not _same_dtype(got if isinstance(got, torch.Tensor) else g, expected):
        return f"dtype {str(got.dtype).removeprefix('torch.')}, expected {str(expected.dtype).removeprefix('torch.')}"
    close = np.isclose(g.astype(np.float64), e.astype(np.float64), rtol=RTOL, atol=ATOL) if g.size else np.ones(0, bool)
    if close.all():
        return f"{_short(got)}, expected {_short(expected)} (within tolerance element by element)"
    where = tuple(int(i) for i in np.argwhere(~close)[0])
    fmt = (lambda v: f"{int(v)} (0x{int(v) & 0xFF:02x})") if e.dtype == np.uint8 else repr  # bytes: show hex too
    err = np.abs(g.astype(np.float64) - e.astype(np.float64)).max()
    return (f"a {list(e.shape)} {str(expected.dtype).removeprefix('torch.')} result whose first difference is at "
            f"index {where}: {fmt(g[where].item())}, expected {fmt(e[where].item())} (largest difference {err:.3g}, "
            f"{int((~close).sum())} of {close.size} elements differ)")


def _article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def difference(got: Any, expected: Any) -> str:
    """Where `got` first differs from `expected`, in words (for the [FAIL] line). A single number or string is
    never shown: it would be the exercise's answer for that case; a tensor's first differing element is."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if set(got) != set(expected):
            return f"keys {sorted(map(str, got))}, expected keys {sorted(map(str, expected))}"
        for k in expected:
            if not same(got[k], expected[k]) or (isinstance(got[k], float) and isinstance(expected[k], int)
                                                 and not isinstance(expected[k], bool)):
                return f"[{k!r}] = {difference(got[k], expected[k])}"
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(expected):
        for i, (g, e) in enumerate(zip(got, expected)):
            if not same(g, e):
                return f"as value {i + 1} of {len(expected)}: {difference(g, e)}"
    if isinstance(expected, (torch.Tensor, np.ndarray)) and isinstance(got, (torch.Tensor, np.ndarray)):
        return _first_difference(got, expected)
    if type(got) is not type(expected) and not (isinstance(got, (int, float)) and isinstance(expected, float)
                                                 and not isinstance(got, bool)):  # 32768.0 for an int is named
        return f"{_short(got)} ({type(got).__name__}), expected {_article(type(expected).__name__)}"
    if isinstance(expected, (bool, int, float, str, np.generic)) or expected is None:
        return f"{_short(got)}, not the answer for this case"
    return f"{_short(got)}, expected {_short(expected)}"


@dataclass(frozen=True)
class Exercise:
    """One exercise, defined once: its name, the reference implementation, fixed cases (tuples of
    arguments), a generator of random cases (rng -> tuple), and the tolerance of the comparison."""
    name: str
    reference: Callable
    cases: Sequence[tuple] = ()
    random_case: Callable[[Rng], tuple] | None = None
    n_random: int = 20
    rtol: float = RTOL
    atol: float = ATOL
    compare: Callable[[Any, Any], bool] | None = field(default=None, repr=False)

    def check(self, fn: Callable, seed: int = 0) -> Callable:
        """check.exercise(fn, self): print the verdict, return the function the notebook goes on with."""
        return exercise(fn, self, seed=seed)


def exercise(fn: Callable, reference: Callable | Exercise, cases: Sequence[tuple] = (),
             random_case: Callable[[Rng], tuple] | None = None, n_random: int = 20, seed: int = 0,
             compare: Callable[[Any, Any], bool] | None = None, name: str | None = None,
             rtol: float = RTOL, atol: float = ATOL) -> Callable:
    """Run `fn` and `reference` on every fixed case (a tuple of arguments) and on `n_random` cases made by
    `random_case(rng)`; print one verdict line; return `fn` if it matched everywhere, else `reference`.
    `reference` may be an Exercise, which then supplies the cases, the generator and the tolerance.
    Answers are compared with `compare`, or by `same` within rtol / atol."""
    if isinstance(reference, Exercise):
        ex = reference
        reference, cases, random_case, n_random = ex.reference, ex.cases, ex.random_case, ex.n_random
        compare, rtol, atol = ex.compare, ex.rtol, ex.atol
        if not name and getattr(fn, "__name__", "<lambda>") == "<lambda>":
            name = ex.name  # a lambda has no name of its own: use the exercise's
    if not callable(fn) or not callable(reference):
        raise TypeError("fn and reference must be callables")
    check_positive_int("n_random", n_random, allow_zero=True)
    check_number("rtol", rtol, low=0.0)
    check_number("atol", atol, low=0.0)
    if not cases and (random_case is None or n_random == 0):
        raise ValueError("give at least one fixed case, or a random_case generator and n_random >= 1")
    if compare is None:
        compare = lambda got, expected: same(got, expected, rtol, atol)  # noqa: E731
    name = name or getattr(fn, "__name__", "your function")
    if fn is reference:  # the check cell was re-run after it had handed out the reference
        print(f"[TODO] {name} is the reference: run your exercise cell above first, then this check.")
        return reference
    rng = Rng(seed)
    all_cases = [tuple(c) for c in cases] + [tuple(random_case(rng)) for _ in range(n_random if random_case else 0)]
    for args in all_cases:
        call = f"{name}({', '.join(_short(a, 300) for a in args)})"
        try:
            got = fn(*copy.deepcopy(args))  # copies: a function that changes its input spoils nothing
        except NotImplementedError:
            print(f"[TODO] {name}: not implemented yet; the notebook goes on with the reference implementation.")
            return reference
        except Exception as e:  # a learner's bug: report it, do not stop the notebook
            print(f"[FAIL] {call} raised {type(e).__name__}: {e}; the notebook goes on with the reference.")
            return reference
        expected = reference(*copy.deepcopy(args))
        if not compare(got, expected):
            print(f"[FAIL] {call} returned {difference(got, expected)}. The notebook goes on with the reference.")
            return reference
    n_fixed = len(cases)
    print(f"[PASS] {name} matches the reference on {n_fixed} fixed and {len(all_cases) - n_fixed} random cases.")
    return fn
