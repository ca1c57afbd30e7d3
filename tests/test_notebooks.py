"""Static checks of the stored notebooks; nbval (make test) re-executes them and compares outputs."""
import json
import re

import pytest

from labkit.course import classroom

NOTEBOOKS = sorted(classroom.NOTEBOOKS.glob("*.ipynb"))
IGNORE = re.compile(r"^\s*#+\s*NBVAL_(IGNORE_OUTPUT|SKIP)\s*$", re.M)  # nbval needs the marker alone


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_notebooks_follow_the_course_map():
    assert NOTEBOOKS, "no notebooks"
    for p in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", p.name), p.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_at_least_60_percent_of_output_cells_are_compared(path):
    with_output = [c for c in code_cells(path) if c["outputs"]]
    compared = [c for c in with_output if not IGNORE.search("".join(c["source"]))]
    assert with_output and len(compared) / len(with_output) >= 0.6, \
        f"{path.name}: only {len(compared)} of {len(with_output)} output cells are compared by nbval"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_outputs_come_from_one_top_to_bottom_run(path):
    counts = [c["execution_count"] for c in code_cells(path) if "".join(c["source"]).strip()]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: re-run it top to bottom in a fresh kernel"
    errors = [o for c in code_cells(path) for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_first_cell_sets_up_and_exercises_are_checked(path):
    cells = code_cells(path)
    assert "env.setup(" in "".join(cells[0]["source"])
    for i, c in enumerate(cells):
        if classroom.BEGIN in "".join(c["source"]):
            assert "check.exercise(" in "".join(cells[i + 1]["source"]), f"{path.name}: exercise without a check"
