"""Argument checks shared by every public function in labkit: one message format, one rule.

    Format:  "<argument> must be <what was expected>, got <the bad value>"
    Rule:    a value of the wrong type raises TypeError ("5300" where a number of dollars is expected);
             a value of the right type outside its range raises ValueError (-1 pages, 1.5 for a fraction).

bool is never accepted as a number (True is an int in Python, never a page count in this course);
numpy integers and floats are. Every check returns the value converted to a plain int or float, so the
caller can store it. Used by every lab package (and by the config dataclasses' __post_init__).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable


def _show(value: Any, limit: int = 120) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[:limit - 3] + "..."


@dataclass(frozen=True)
class Refusal:
    """A refusal as data (the error's `refusal` attribute): the argument's name, what was expected and the bad
    value as shown. The HTTP service names the request's field from it (labkit.serving.protocol.refusal)."""
    name: str
    expected: str
    got: str

    def message(self, name: str | None = None) -> str:
        """The one message format, optionally under another name (a chat request's "messages")."""
        return f"{name or self.name} must be {self.expected}, got {self.got}"


def fail(name: str, value: Any, expected: str, error: type[Exception] = ValueError) -> None:
    """Raise `error` with the one message format: '<name> must be <expected>, got <value>'; the parts ride
    along as `error.refusal` (a Refusal)."""
    _refuse(Refusal(name, expected, _show(value)), error)


def _refuse(refusal: Refusal, error: type[Exception]) -> None:
    exc = error(refusal.message())
    exc.refusal = refusal
    raise exc


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None,
              unit: str = "") -> int:
    """An int in [low, high] (either bound may be None). TypeError if not an int, ValueError if outside."""
    unit = f" ({unit})" if unit else ""
    where = ("" if low is None and high is None else
             f" >= {low}" if high is None else f" <= {high}" if low is None else f" in [{low}, {high}]")
    if not is_int(value):
        fail(name, value, f"an int{where}{unit}", TypeError)
    if (low is not None and value < low) or (high is not None and value > high):
        fail(name, value, f"an int{where}{unit}")
    return int(value)


def check_positive_int(name: str, value: Any, unit: str = "", allow_zero: bool = False) -> int:
    """An int >= 1 (>= 0 with allow_zero)."""
    unit = f" ({unit})" if unit else ""
    what = f"a {'non-negative' if allow_zero else 'positive'} int{unit}"
    if not is_int(value):
        fail(name, value, what, TypeError)
    if value < (0 if allow_zero else 1):
        fail(name, value, what)
    return int(value)


def _as_float(name: str, value: Any, what: str) -> float:
    """`value` as a float: a TypeError when it is not a number, a ValueError for an int beyond float's range
    (10**400)."""
    if not is_number(value):
        fail(name, value, what, TypeError)
    try:
        return float(value)
    except OverflowError:
        fail(name, value, what)


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, unit: str = "") -> float:
    """A finite real number in the interval given by low/high ('(' with low_open, ')' with high_open)."""
    unit = f" ({unit})" if unit else ""
    if low is None and high is None:
        where = ""
    elif high is None:
        where = f" {'>' if low_open else '>='} {low:g}"
    elif low is None:
        where = f" {'<' if high_open else '<='} {high:g}"
    else:
        where = f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    what = f"a finite number{where}{unit}"
    v = _as_float(name, value, what)
    if not math.isfinite(v) or (low is not None and (v < low or (low_open and v == low))) \
            or (high is not None and (v > high or (high_open and v == high))):
        fail(name, value, what)
    return v


def check_positive(name: str, value: Any, unit: str = "", allow_zero: bool = False) -> float:
    """A finite number > 0 (>= 0 with allow_zero)."""
    unit = f" ({unit})" if unit else ""
    what = f"a {'non-negative' if allow_zero else 'positive'} finite number{unit}"
    v = _as_float(name, value, what)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        fail(name, value, what)
    return v


def check_fraction(name: str, value: Any, allow_zero: bool = False, allow_one: bool = True) -> float:
    """A number in (0, 1] by default; [0, ...] with allow_zero, [..., 1) without allow_one."""
    return check_number(name, value, 0.0, 1.0, low_open=not allow_zero, high_open=not allow_one)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        fail(name, value, "True or False", TypeError)
    return value


def check_choice(name: str, value: Any, options: Iterable[Any]) -> Any:
    """One of `options` (ValueError otherwise: a string that is not an option is the right type)."""
    options = tuple(options)
    try:
        ok = value in options
    except TypeError:  # unhashable against a set-like, or a tensor compared with strings
        ok = False
    if not ok:
        fail(name, value, f"one of {options}")
    return value


def check_type(name: str, value: Any, types: type | tuple[type, ...], what: str | None = None) -> Any:
    """An instance of `types` (TypeError otherwise); `what` names it in the message ("a TinyLM")."""
    if not isinstance(value, types):
        names = what or " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        _refuse(Refusal(name, names, f"{type(value).__name__} {_show(value, 60)}"), TypeError)
    return value
