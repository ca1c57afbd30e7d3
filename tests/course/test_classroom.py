import json
import os
import re
import subprocess

import nbformat
import pytest

from labkit.course import classroom, labs, submission

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
    cell.metadata = {"execution": {"iopub.status.idle": "2026-12-01T10:00:00Z"}, "tags": ["keep"]}
    nb.cells = [cell, nbformat.v4.new_markdown_cell("text")]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    student = classroom.student_notebook(nb)
    assert student["cells"][0]["source"] == classroom.STUB + "\n"
    assert student["cells"][0]["outputs"] == [] and student["cells"][0]["execution_count"] is None
    assert student["cells"][0]["metadata"] == {"tags": ["keep"]} and "widgets" not in student["metadata"]
    assert "execution" in nb.cells[0].metadata and "widgets" in nb.metadata
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


# The grader's path is the same for every lab (a kernel per notebook, the check cells found by read_lab), so it
# runs on the smallest lab here; the browser test runs every student notebook top to bottom and checks that
# each of its check cells printed [TODO] (tests/browser), and test_labs finds every lab's check cells.
@pytest.mark.parametrize("name", ["00_setup.ipynb"])
def test_student_notebook_runs_top_to_bottom_and_grades_all_todo(student_dir, name):
    """The handed-out notebook runs in the grader's kernel (every cell, no time-out) and every exercise's
    check reports "not implemented yet"."""
    nb = json.loads((student_dir / name).read_text())
    lab = labs.read_lab(classroom.NOTEBOOKS / name)
    result = submission.grade_notebook(nb, lab, cell_timeout=600)
    assert lab.exercises and not result.problems and not result.notes, result
    assert {ex: v.status for ex, v in result.verdicts.items()} == {ex: "TODO" for ex in lab.exercises}


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


def _course(tmp_path, text="print(1)"):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
                                          f"{text}")]
    nbformat.write(nb, notebooks / "00_x.ipynb")
    return notebooks


def _edit(path):
    nb = json.loads(path.read_text())
    nb["cells"][0]["source"] = "def f():\n    return 1  # my answer\n"
    path.write_text(json.dumps(nb, indent=2))
    return path.read_bytes()


def test_student_notebooks_carry_no_trace_of_the_instructors_run(student_dir):
    for src in NOTEBOOKS:
        nb = json.loads((student_dir / src.name).read_text())
        assert "widgets" not in nb["metadata"], src.name
        for i, cell in enumerate(nb["cells"]):
            left = set(cell.get("metadata", {})) & set(classroom.RUN_METADATA)
            assert not left and not cell.get("outputs") and cell.get("execution_count") is None, (src.name, i)


def test_student_notebooks_carry_their_lab_and_version(student_dir):
    for src in NOTEBOOKS:
        nb = json.loads((student_dir / src.name).read_text())
        assert nb["metadata"]["labkit"] == {"lab": src.stem, "version": classroom.version(nb)}


def test_writing_again_never_touches_an_edited_notebook(tmp_path, capsys):
    notebooks, out = _course(tmp_path), tmp_path / "student"
    classroom.main(["student", str(out), "--notebooks", str(notebooks)])
    assert capsys.readouterr().out == f"{out / '00_x.ipynb'}: created\n"
    mine = _edit(out / "00_x.ipynb")
    classroom.main(["student", str(out), "--notebooks", str(notebooks)])
    assert (out / "00_x.ipynb").read_bytes() == mine and not (out / "00_x.new.ipynb").exists()
    assert "kept: your work, from the current version" in capsys.readouterr().out
    _course(tmp_path, "print(2)")  # the lab changes: the new version goes beside the learner's
    classroom.main(["student", str(out), "--notebooks", str(notebooks)])
    assert (out / "00_x.ipynb").read_bytes() == mine
    assert "print(2)" in (out / "00_x.new.ipynb").read_text()
    assert "the newer version of this lab is 00_x.new.ipynb" in capsys.readouterr().out
    theirs = _edit(out / "00_x.new.ipynb")  # the learner started on the new version: both are kept
    _course(tmp_path, "print(3)")
    done = dict(classroom.write_student_notebooks(out, notebooks))
    assert (out / "00_x.ipynb").read_bytes() == mine and (out / "00_x.new.ipynb").read_bytes() == theirs
    assert "has your edits too" in done[out / "00_x.ipynb"]


def test_an_untouched_notebook_is_updated_and_a_resaved_one_counts_as_untouched(tmp_path):
    notebooks, out = _course(tmp_path), tmp_path / "student"
    classroom.write_student_notebooks(out, notebooks)
    nb = nbformat.read(out / "00_x.ipynb", as_version=4)  # as JupyterLab re-saves it: other layout, same content
    nbformat.write(nb, out / "00_x.ipynb")
    assert dict(classroom.write_student_notebooks(out, notebooks))[out / "00_x.ipynb"] == "up to date"
    _course(tmp_path, "print(2)")
    done = dict(classroom.write_student_notebooks(out, notebooks))
    assert done[out / "00_x.ipynb"] == "updated (you had not changed it)"
    assert "print(2)" in (out / "00_x.ipynb").read_text() and not (out / "00_x.new.ipynb").exists()


@pytest.mark.parametrize("content", ["{broken", json.dumps({"cells": [], "metadata": {}})])
def test_an_unreadable_or_unstamped_notebook_is_the_learners(tmp_path, content):
    notebooks, out = _course(tmp_path), tmp_path / "student"
    out.mkdir()
    (out / "00_x.ipynb").write_text(content)
    classroom.write_student_notebooks(out, notebooks)
    assert (out / "00_x.ipynb").read_text() == content and (out / "00_x.new.ipynb").exists()


def test_make_clean_never_deletes_a_learners_work():
    recipe = subprocess.run(["make", "-n", "clean"], cwd=classroom.NOTEBOOKS.parent, capture_output=True,
                            text=True, check=True).stdout
    assert "rm" in recipe and "student" not in recipe and "submissions" not in recipe, recipe


def test_execute_fills_outputs_and_stops_its_kernel():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\nprint(os.getpid())")]
    classroom.execute(nb)
    # one printed line may arrive as several stream outputs (the kernel flushes when it likes): join them
    pid = int("".join(o["text"] for o in nb.cells[0].outputs if o["output_type"] == "stream"))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="nb must be"):
        classroom.student_notebook("00_setup.ipynb")
    with pytest.raises(ValueError, match="nb must be a notebook dict with 'cells'"):
        classroom.student_notebook({"metadata": {}})
    with pytest.raises(TypeError, match="out_dir must be"):
        classroom.write_student_notebooks(1)
