"""The course machinery every notebook uses: exercise checks, student versions, the environment check
and set-up, timing, tables and fact-check verdicts. Bottom layer: imports only labkit's own helpers."""

from . import check, classroom, display, env, timing
from .check import Exercise
from .display import FactCheck, table, verdict
from .timing import Timing, interleave, measure

__all__ = ["check", "classroom", "display", "env", "timing", "Exercise", "FactCheck", "table", "verdict", "Timing", "interleave",
           "measure"]
