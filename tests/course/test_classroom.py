import json
from pathlib import Path

import re

import nbformat
import pytest

from labkit.course import classroom

NOTEBOOKS = sorted(classroom.NOTEBOOKS.glob("*.ipynb"))


def test_solution_becomes_a_stub_at_the_markers_indentation():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\nprint(1)\n"
    out, removed = classroom.strip_solutions(src)
    assert out == f"def f(x):\n    {classroom.STUB}\nprint(1)\n"
    assert removed == ["    y = x + 1", "    return y"]
    assert classroom.strip_solutions("a = 1\n") == ("a = 1\n", [])


@pytest.mark.parametrize("src, message", [
    ("### BEGIN SOLUTION\nx = 1\n", "BEGIN SOLUTION without"),
    ("x = 1\n### END SOLUTION\n", "line 2: ### END SOLUTION without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "line 2: ### BEGIN SOLUTION inside"),
])
def test_unbalanced_markers_are_refused(src, message):
    with pytest.raises(ValueError, match=message):
        classroom.strip_solutions(src, "nb.ipynb, cell 3")


def test_student_notebook_clears_outputs_and_leaves_the_original_alone():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nsecret = 42\n### END SOLUTION")
    cell.outputs = [nbformat.v4.new_output("stream", text="42\n")]
    cell.execution_count = 1
    nb.cells = [cell, nbformat.v4.new_markdown_cell("text")]
    student = classroom.student_notebook(nb)
    assert student["cells"][0]["source"] == classroom.STUB + "\n"
    assert student["cells"][0]["outputs"] == [] and student["cells"][0]["execution_count"] is None
    assert nb.cells[0].outputs and "secret" in nb.cells[0].source


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    classroom.main(["student", str(out)])
    return out


def test_every_notebook_has_an_exercise_and_no_solution_leaks(student_dir):
    assert NOTEBOOKS
    for src in NOTEBOOKS:
        instructor = json.loads(src.read_text())
        student_text = (student_dir / src.name).read_text()
        solution_lines, other_lines = set(), set()
        for cell in instructor["cells"]:  # split each cell by regex, independently of strip_solutions
            code = "".join(cell["source"])
            inside = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", code, re.S)
            outside = re.sub(r"### BEGIN SOLUTION\n.*?### END SOLUTION", "", code, flags=re.S)
            solution_lines |= {line.strip() for part in inside for line in part.splitlines() if line.strip()}
            other_lines |= {line.strip() for line in outside.splitlines()}
        assert solution_lines, f"{src.name} has no exercise"
        student_sources = "\n".join("".join(c["source"]) for c in json.loads(student_text)["cells"])
        leaked = [line for line in solution_lines - other_lines if line in student_sources]
        assert not leaked, f"{src.name} leaks solution lines {leaked}"
        assert "BEGIN SOLUTION" not in student_text and '"outputs": []' in student_text


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_student_notebook_runs_top_to_bottom(student_dir, name):
    nb = nbformat.read(student_dir / name, as_version=4)
    classroom.execute(nb)
    verdicts = [o.get("text", "") for c in nb.cells if c.cell_type == "code" and "check.exercise" in c.source
                for o in c.outputs if o.get("output_type") == "stream"]
    assert verdicts and all("not implemented yet" in v for v in verdicts), verdicts


def test_markers_outside_code_cells_are_refused():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nanswer\n### END SOLUTION")]
    with pytest.raises(ValueError, match="x.ipynb, cell 0: solution markers belong in code cells only"):
        classroom.student_notebook(nb, "x.ipynb")


def test_broken_notebook_file_is_named(tmp_path):
    (tmp_path / "01_bad.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="01_bad.ipynb is not a readable notebook"):
        classroom.write_student_notebooks(tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()


def test_cli_refuses_to_overwrite_the_instructor_notebooks():
    with pytest.raises(SystemExit):
        classroom.main(["student", str(classroom.NOTEBOOKS)])


def test_missing_notebooks_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        classroom.write_student_notebooks(tmp_path / "out", tmp_path)
