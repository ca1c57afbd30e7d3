"""Labs as the grader sees them: check cells found by their code, stable exercise ids, the lab of a notebook."""
import ast
import json

import pytest

from labkit.course import classroom, labs

from . import minicourse as mc

NOTEBOOKS = sorted(labs.NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture
def course(tmp_path, monkeypatch):
    package, notebooks = mc.make(tmp_path / "course")
    monkeypatch.syspath_prepend(str(package))
    return notebooks


def _lab(tmp_path, cells, name="05_x"):
    path = tmp_path / f"{name}.ipynb"
    path.write_text(json.dumps(mc.notebook(cells)))
    return labs.read_lab(path)


def test_exercise_objects_get_ids_from_where_they_are_defined(course):
    lab = labs.read_lab(course / "00_mini.ipynb")
    assert lab.name == "00_mini" and lab.exercises == [mc.SQUARE, mc.ADD]
    assert [c.fallback for cell in lab.cells for c in cell.checks] == [
        "square = exercises.SQUARE.reference", "add = exercises.ADD.reference"]
    assert lab.modules == [(mc.SQUARE, "mini_exercises", "SQUARE"), (mc.ADD, "mini_exercises", "ADD")]
    assert json.loads(labs.dumps_exercises(lab)) == [list(m) for m in lab.modules]


def test_a_plain_reference_is_named_after_the_function_or_the_name_argument(course):
    assert labs.read_lab(course / "01_other.ipynb").exercises == [mc.HALVE]
    lab = labs.read_lab(course / "01_other.ipynb")
    assert lab.cells[0].checks[0].fallback == "halve = ref.halve"


@pytest.mark.parametrize("imports, call", [
    ("from labkit.course import check\nfrom labkit.tinylm import exercises",
     "f = check.exercise(f, exercises.COUNT_PARAMS)"),
    ("import labkit.course.check as c\nimport labkit.tinylm.exercises as ex", "f = c.exercise(f, ex.COUNT_PARAMS)"),
    ("from labkit.course.check import exercise\nfrom labkit.tinylm.exercises import COUNT_PARAMS as P",
     "f = exercise(f, P)"),
    ("from labkit import tinylm as lm", "f = lm.exercises.COUNT_PARAMS.check(f)"),
])
def test_every_way_of_importing_the_check_and_the_exercise(tmp_path, imports, call):
    lab = _lab(tmp_path, [("code", imports), ("code", "def f(cfg):\n    return {}"), ("code", call)])
    assert lab.exercises == ["tinylm.COUNT_PARAMS"]
    assert lab.cells[0].checks[0].fallback.startswith("f = ") and lab.cells[0].checks[0].module == \
        "labkit.tinylm.exercises"


def test_cells_that_are_not_checks(tmp_path):
    lab = _lab(tmp_path, [("code", "from labkit.course import check\nimport math"),
                          ("code", "x = math.sqrt(2)\nprint(check)"), ("markdown", "check.exercise(f, g)"),
                          ("code", "%timeit x = 1"), ("code", "def broken(:")])
    assert lab.cells == () and lab.exercises == []


def test_an_exercise_checked_twice_is_refused(tmp_path):
    call = "f = check.exercise(f, exercises.COUNT_PARAMS)"
    with pytest.raises(ValueError, match="05_x.ipynb: an exercise is checked twice"):
        _lab(tmp_path, [("code", "from labkit.course import check\nfrom labkit.tinylm import exercises"),
                        ("code", call), ("code", call)])


def test_cell_code_ignores_comments_and_spacing_but_not_code():
    assert labs.cell_code("x = f(1,2)  # hi\n\n") == labs.cell_code("x = f(1, 2)")
    assert labs.cell_code("x = f(1, 2)") != labs.cell_code("x = f(2, 1)")
    assert labs.cell_code("!ls\n%time x = 1") == ast.dump(ast.parse(
        "get_ipython().system('ls')\nget_ipython().run_line_magic('time', 'x = 1')"))
    assert labs.cell_code("def f(:") is None
    assert labs.source_of({"source": ["a\n", "b"]}) == "a\nb" and labs.source_of({"source": "c"}) == "c"


def test_the_lab_of_a_notebook(course):
    mini = labs.course_labs(course)
    handout = mc.handout(course, "01_other")
    assert labs.identify(handout, "anything.ipynb", mini) == ("01_other", "its metadata")
    plain = mc.notebook(mc.MINI)
    assert labs.identify(plain, "bob_00_mini.ipynb", mini) == ("00_mini", "its file name")
    assert labs.identify(plain, "bob.ipynb", mini) == ("00_mini", "its check cells")
    assert labs.identify(mc.notebook([("code", "1")]), "bob.ipynb", mini)[0] is None
    stamped_elsewhere = {**handout, "metadata": {"labkit": {"lab": "99_unknown"}}}  # the cells still tell
    assert labs.identify(stamped_elsewhere, "x.ipynb", mini) == ("01_other", "its check cells")


def test_every_course_notebook_has_exercises_and_its_student_version_keeps_the_check_cells():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        lab = labs.read_lab(path)
        assert lab.exercises, f"{path.name} has no check cell the grader recognises"
        student = classroom.student_notebook(classroom.read_notebook(path))
        codes = {labs.cell_code(labs.source_of(c)) for c in student["cells"] if c["cell_type"] == "code"}
        assert all(cell.code in codes for cell in lab.cells), path.name


def test_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="path must be"):
        labs.read_lab(1)
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        labs.course_labs(tmp_path)
    (tmp_path / "00_bad.ipynb").write_text("{")
    with pytest.raises(ValueError, match="00_bad.ipynb is not a readable notebook"):
        labs.read_lab(tmp_path / "00_bad.ipynb")
