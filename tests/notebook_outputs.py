"""nbval's comparison (`pytest --nbval`, nbval 0.11) for outputs that another runner produced: a student notebook
as JupyterLab saved it after Run All (tests/browser), the instructor's solutions run on their own
(tests/course/test_solutions.py). Each notebook is then run once in `make test`, and its stored outputs are still
checked the way nbval checks them:

    stored cell outputs ──┐  streams coalesced (\\r, \\b applied), keyed by stream name or MIME type,
    fresh cell outputs  ──┴─ metadata, tracebacks, widget ids and images left out, notebooks/nbval_sanitize.cfg
                             applied  ->  same keys, same number of values per key, equal values, or a difference

A cell marked NBVAL_IGNORE_OUTPUT (comment or tag) is not compared, and a reference cell that was never run
neither; NBVAL_SKIP and NBVAL_RAISES_EXCEPTION are refused (a Run All cannot skip a cell or expect an error).
Where JupyterLab and nbval see a cell's outputs differently, the comparison is at least as strict as nbval's:
JupyterLab applies clear_output and display updates, as nbclient did when it stored the outputs, where nbval
keeps every output sent (it would fail such a cell); a compared cell whose stored text holds a carriage return
or a backspace is refused, since JupyterLab and nbval apply them differently. tests/test_notebook_outputs.py
checks this module against nbval itself on a planted notebook.
"""
from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from pathlib import Path

import nbformat
from nbval.plugin import (coalesce_streams, find_comment_markers, find_metadata_tags, get_sanitize_patterns,
                          transform_streams_for_comparison)

from labkit.course import labs
from labkit.course.classroom import BEGIN
from labkit.paths import NOTEBOOKS

# nbval's IPyNbFile.skip_compare without --nbdime (images are compared only with nbdime)
SKIP = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
        "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
SANITIZE = get_sanitize_patterns((NOTEBOOKS / "nbval_sanitize.cfg").read_text())
VERDICT = re.compile(r"^\[(PASS|FAIL|TODO)\] .*\n?", re.MULTILINE)  # labkit.course.check's one line


def compared(cell) -> bool:
    """Whether `pytest --nbval` compares this code cell's outputs (a NotebookNode from nbformat.read)."""
    options = dict(find_metadata_tags(cell.metadata))
    options.update(find_comment_markers(cell.source))
    refused = {"skip", "check_exception"} & set(options)
    if refused:
        raise ValueError(f"a cell marked for nbval's {sorted(refused)}: a Run All in the browser runs every cell "
                         f"and expects no error; only NBVAL_IGNORE_OUTPUT and NBVAL_CHECK_OUTPUT are supported:\n"
                         f"{cell.source[:200]}")
    if not (options.get("check", True) and cell.execution_count is not None):
        return False
    if any("\r" in o.get("text", "") or "\b" in o.get("text", "") for o in cell.outputs):
        raise ValueError(f"a compared cell whose stored output holds a carriage return or a backspace (a progress "
                         f"bar?): JupyterLab and nbval apply them differently; print without them or mark the "
                         f"cell NBVAL_IGNORE_OUTPUT:\n{cell.source[:200]}")
    return True


def _sanitize(value):
    if not isinstance(value, str):
        return value
    for regex, replace in SANITIZE:
        value = re.sub(regex, replace, value)
    return value


def _keyed(outputs: list, drop: re.Pattern | None) -> dict[str, list]:
    """nbval's view of one cell's outputs: each stream name or MIME type -> its sanitized values, in order."""
    outputs = coalesce_streams([nbformat.from_dict(copy.deepcopy(dict(o))) for o in outputs])
    keyed = defaultdict(list)
    for out in transform_streams_for_comparison(outputs):
        for key, value in out.items():
            if key in SKIP:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP:
                        keyed[mime].append(_sanitize(data))
            else:
                keyed[key].append(_sanitize(drop.sub("", value) if drop and isinstance(value, str) else value))
    return dict(keyed)


def difference(stored: list, fresh: list, drop: re.Pattern | None = None) -> str | None:
    """How a cell's fresh outputs differ from its stored ones under nbval's rules, or None when they agree.
    `drop` removes matching text from both sides' streams first (the check cells' verdict lines)."""
    want, got = _keyed(stored, drop), _keyed(fresh, drop)
    if set(want) != set(got):
        extra = [f"{key} only {side}: {str(values[key][0])[:300]!r}" for side, values, other in
                 (("stored", want, got), ("in this run", got, want)) for key in sorted(set(values) - set(other))]
        return "output fields differ: " + "; ".join(extra)
    for key, values in want.items():
        if len(values) != len(got[key]):
            return f"{len(values)} stored '{key}' outputs, {len(got[key])} in this run"
        for a, b in zip(values, got[key]):
            if a != b:
                return f"'{key}' differs: " + _first_difference(a, b)
    return None


def _first_difference(a, b) -> str:
    """The first line where two values differ (the whole values when they are not text)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return f"stored {a!r}, this run {b!r}"
    lines = list(zip(a.splitlines(), b.splitlines())) + [(a, b)]
    n, (x, y) = next((n, pair) for n, pair in enumerate(lines, 1) if pair[0] != pair[1])
    where = f"line {n}" if n < len(lines) else "the line count"
    return f"{where}:\nstored:   {x[:300]!r}\nthis run: {y[:300]!r}"


def student_run_differences(instructor: Path, saved: dict) -> tuple[int, list[str]]:
    """(cells compared, differences) between the instructor notebook's stored outputs and a run of its student
    version (`saved`, the notebook JSON JupyterLab wrote after Run All), under nbval's rules; cells are numbered
    from 1 among all the notebook's cells. The solution cells are left out (their stubs run here;
    tests/course/test_solutions.py runs the solutions and their checks), and the check cells' verdict lines are
    dropped on both sides ([TODO] here, [PASS] stored)."""
    stored = nbformat.read(instructor, as_version=4)
    run = nbformat.reads(json.dumps(saved), as_version=4)
    if len(run.cells) != len(stored.cells):
        return 0, [f"{len(run.cells)} cells in this run, {len(stored.cells)} in {instructor.name}"]
    checks = {cell.code for cell in labs.read_lab(instructor).cells}
    n, found = 0, []
    for i, (want, got) in enumerate(zip(stored.cells, run.cells)):
        if want.cell_type != "code" or BEGIN in want.source or not compared(want):
            continue
        if got.source != want.source:
            found.append(f"cell {i + 1}: its source differs from {instructor.name}'s")
            continue
        n += 1
        why = difference(want.outputs, got.outputs, VERDICT if labs.cell_code(want.source) in checks else None)
        if why:
            found.append(f"cell {i + 1} ({want.source.splitlines()[0][:60]!r}...): {why}")
    return n, found
