"""How notebooks print results: aligned tables and the fact-check verdicts every lab gives the source
material's claims (notebooks 01-03, and each later lab's fact-check)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Sequence

from .._checks import check_positive_int, check_type, fail, is_number


def fixed(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, in fixed point: 2217.3 -> '2,217', 4.03e-05 -> '0.0000403',
    0.0959 -> '0.0959', 1.0 -> '1' (the 'g' format, without its exponents)."""
    if not is_number(value):
        fail("value", value, "a number", TypeError)
    digits = check_positive_int("digits", digits)
    text = f"{value:.{digits}g}"
    if "e" not in text or not math.isfinite(value):
        return text
    magnitude = math.floor(math.log10(abs(value)))
    return f"{value:,.0f}" if magnitude >= digits - 1 else f"{value:.{digits - 1 - magnitude}f}"


def clip(text: str, width: int) -> str:
    """`text` in at most `width` characters for a table cell (runs of whitespace become one space): cut after
    the last whole word that fits, " ..." marking the cut; a first word longer than that is cut inside it."""
    check_type("text", text, str, "a string")
    if check_positive_int("width", width, "characters") < 5:
        fail("width", width, "at least 5 characters (a letter and ' ...')")
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    short = textwrap.shorten(text, width, placeholder=" ...")
    return short if short != "..." else text[:width - 4] + " ..."  # "...": not even the first word fits


def table(rows: list[dict], digits: int = 3) -> str:
    """Rows of dicts as an aligned text table (floats at `digits` significant digits, in fixed point).

    The columns are the first row's keys, in its order; every row must have exactly those keys (in any
    order). A row with a key missing or one more is refused, naming the row and both sets of keys, rather
    than printed with a blank cell or a column silently dropped: fill the gap explicitly ("" or "-")."""
    if not isinstance(rows, list):
        fail("rows", rows, "a list of dicts", TypeError)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            fail(f"rows[{i}]", row, "a dict", TypeError)
    digits = check_positive_int("digits", digits)
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    for i, row in enumerate(rows[1:], start=1):
        if set(row) != set(cols):
            missing, extra = [c for c in cols if c not in row], [k for k in row if k not in rows[0]]
            fail(f"rows[{i}]", row, f"a dict with the keys of rows[0], {cols} (missing {missing}, extra {extra})")
    fmt = lambda v: fixed(v, digits) if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r[c]) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, width))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in cells]
    return "\n".join(lines)


def verdict(claim: str, arithmetic: Sequence[str], judgement: str, holds_if: str) -> str:
    """Print (and return) one fact-check: the claim, the arithmetic behind the verdict line by line, the
    verdict, and the conditions under which the claim holds."""
    for name, v in (("claim", claim), ("judgement", judgement), ("holds_if", holds_if)):
        if not isinstance(v, str) or not v:
            raise TypeError(f"{name} must be a non-empty str, got {v!r}")
    if isinstance(arithmetic, str) or not all(isinstance(line, str) for line in arithmetic):
        raise TypeError(f"arithmetic must be a list of str lines, got {arithmetic!r}")
    text = (f"CLAIM    {claim}\n" + "".join(f"         {line}\n" for line in arithmetic)
            + f"VERDICT  {judgement}\nHOLDS IF {holds_if}\n")
    print(text)
    return text


@dataclass(frozen=True)
class FactCheck:
    """One claim of the source material checked: the four parts `verdict` prints, and the numbers behind
    them (for the notebook's asserts). Each lab's factcheck module returns these (labs 01-03)."""
    claim: str
    arithmetic: list[str]
    judgement: str
    holds_if: str
    numbers: dict = field(default_factory=dict)

    def show(self) -> None:
        """Print the fact-check in `verdict`'s format."""
        verdict(self.claim, self.arithmetic, self.judgement, self.holds_if)
