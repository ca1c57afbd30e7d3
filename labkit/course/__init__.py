"""The course machinery every notebook uses: exercise checks, student versions, the environment check
and set-up, timing, the rule for a measured direction (evidence), tables and fact-check verdicts. Bottom layer:
imports only labkit's own helpers."""

from . import check, display, env, evidence, timing  # classroom: python -m labkit.course.classroom (not imported here)
from .check import Exercise
from .display import FactCheck, table
from .timing import Timing, interleave, measure

__all__ = ["check", "display", "env", "evidence", "timing", "Exercise", "FactCheck", "table", "Timing", "interleave",
           "measure"]
