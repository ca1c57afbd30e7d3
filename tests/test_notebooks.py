"""Static checks of the stored notebooks; the browser test (make test) re-executes them and compares outputs by
nbval's rules (tests/notebook_outputs.py), as `make test-nbval` and `make test-portable` do."""
import json
import re
import runpy

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


def test_the_workers_order_names_every_notebook():
    """notebooks/conftest.py orders nbval and the browser test longest first: a notebook missing from its table
    would run last, a name left there after a rename would order nothing."""
    seconds = runpy.run_path(str(classroom.NOTEBOOKS / "conftest.py"))["SECONDS"]
    assert set(seconds) == {p.stem for p in NOTEBOOKS}, sorted(set(seconds) ^ {p.stem for p in NOTEBOOKS})
    assert all(isinstance(s, int) and s > 0 for s in seconds.values()), seconds


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


# --- no answer before its check -----------------------------------------------------------------------

def exercise_objects() -> dict[str, object]:
    """Every labkit.<package>.exercises.NAME that is an Exercise, by NAME."""
    import importlib
    import pkgutil

    import labkit
    from labkit.course import Exercise

    found = {}
    for info in pkgutil.iter_modules(labkit.__path__):
        if info.ispkg:
            try:
                module = importlib.import_module(f"labkit.{info.name}.exercises")
            except ModuleNotFoundError:
                continue
            found.update({k: v for k, v in vars(module).items() if isinstance(v, Exercise)})
    return found


def answer_lines(fn) -> set[str]:
    """The statements of a reference implementation, one stripped source line each (docstring, comments and
    short lines such as `return out` left out: they prove nothing)."""
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    node = tree.body[0]
    body = node.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else [node]
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    lines = source.splitlines()
    out = set()
    for stmt in body:
        for line in lines[stmt.lineno - 1:stmt.end_lineno]:
            line = line.split("#")[0].strip()
            if len(line) >= 20:
                out.add(line)
    return out


def leaks(instructor: dict, student: dict, exercises: dict) -> list[str]:
    """Places where a student notebook shows an exercise's reference before that exercise's check cell:
    in a cell's source (the check cell included), or in what a cell above it prints (the instructor
    notebook's stored outputs stand for what the learner will see when running it)."""
    found = []
    cells = list(zip(instructor["cells"], student["cells"]))
    for i, (_, s_cell) in enumerate(cells):
        source = "".join(s_cell["source"])
        names = re.findall(r"check\.exercise\(.*?exercises\.([A-Z_0-9]+)\)", source, re.S)
        for name in names:
            secret = answer_lines(exercises[name].reference)
            for j, (i_cell, s_above) in enumerate(cells[:i + 1]):
                shown = "".join(s_above["source"])
                if j < i and i_cell["cell_type"] == "code":
                    shown += "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                                     for o in i_cell.get("outputs", []))
                hits = sorted(line for line in secret if line in shown)
                if hits:
                    found.append(f"cell {j} shows {len(hits)} line(s) of {name}'s reference before its check "
                                 f"(cell {i}), e.g. {hits[0]!r}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_student_notebook_shows_an_answer_before_its_check(path):
    instructor = json.loads(path.read_text())
    student = classroom.student_notebook(instructor, path.name)
    exercises = exercise_objects()
    checked = re.findall(r"exercises\.([A-Z_0-9]+)\)", "".join("".join(c["source"]) for c in instructor["cells"]))
    assert checked and set(checked) <= set(exercises), f"{path.name}: check cells name unknown exercises"
    assert not leaks(instructor, student, exercises)


def test_the_leak_check_sees_a_shown_reference_and_a_check_cell_that_defines_it():
    from labkit.tinylm import exercises as tiny

    def code(source, outputs=()):
        return {"cell_type": "code", "source": source, "outputs": list(outputs),
                "metadata": {}, "execution_count": None}

    shown = {"output_type": "stream", "name": "stdout", "text": __import__("inspect").getsource(tiny.param_counts)}
    exercise = code("def count_params(cfg):\n    ### BEGIN SOLUTION\n    return {}\n    ### END SOLUTION")
    check_cell = code("count_params = check.exercise(count_params, exercises.COUNT_PARAMS)")
    for cells in ([code("labkit.show(lm.param_counts)", [shown]), exercise, check_cell],
                  [exercise, code("d, hd = cfg.d_model, cfg.head_dim\n" + check_cell["source"])]):
        nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        student = classroom.student_notebook(nb, "x.ipynb")
        assert leaks(nb, student, exercise_objects()), cells
    after = {"cells": [exercise, check_cell, code("labkit.show(lm.param_counts)", [shown])], "metadata": {},
             "nbformat": 4, "nbformat_minor": 5}
    assert not leaks(after, classroom.student_notebook(after, "x.ipynb"), exercise_objects())
