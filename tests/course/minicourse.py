"""A two-lab course small enough to grade in seconds, for the grader's tests (tests/course/test_gradebook.py,
test_submission.py, test_labs.py): lab 00_mini checks two Exercise objects (mini_exercises.SQUARE, .ADD),
lab 01_other one plain reference function (id "01_other.halve")."""
import json
import re
from pathlib import Path

import nbformat

from labkit.course import classroom

EXERCISES = '''
from labkit.course import Exercise


def square(x):
    return x * x


def add(a, b):
    return a + b


def halve(x):
    return x / 2


SQUARE = Exercise("square", square, cases=[(3,), (-2,)], random_case=lambda rng: (rng.below(100),))
ADD = Exercise("add", add, cases=[(1, 2)], random_case=lambda rng: (rng.below(9), rng.below(9)))
'''

MINI = [
    ("code", "from labkit.course import check\nimport mini_exercises as exercises"),
    ("markdown", "## Exercise 1: square"),
    ("code", "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"),
    ("code", "square = check.exercise(square, exercises.SQUARE)"),
    ("markdown", "## Exercise 2: add"),
    ("code", "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"),
    ("code", "add = check.exercise(add, exercises.ADD)"),
    ("code", "print(square(4) + add(1, 1))"),
]
OTHER = [
    ("code", "from labkit.course import check\nimport mini_exercises as ref"),
    ("code", "def halve(x):\n    ### BEGIN SOLUTION\n    return x / 2\n    ### END SOLUTION"),
    ("code", "halve = check.exercise(halve, ref.halve, cases=[(4,), (3,)])"),
]
SQUARE, ADD, HALVE = "mini_exercises.SQUARE", "mini_exercises.ADD", "01_other.halve"


def notebook(cells) -> dict:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src)
                for kind, src in cells]
    return json.loads(nbformat.writes(nb))


def make(root: Path) -> tuple[Path, Path]:
    """Write the course under root: (the exercises' folder, for PYTHONPATH; the instructor notebooks)."""
    package, notebooks = root / "package", root / "notebooks"
    package.mkdir(parents=True)
    notebooks.mkdir()
    (package / "mini_exercises.py").write_text(EXERCISES)
    for name, cells in (("00_mini", MINI), ("01_other", OTHER)):
        (notebooks / f"{name}.ipynb").write_text(json.dumps(notebook(cells)))
    return package, notebooks


def handout(notebooks: Path, lab: str) -> dict:
    """The student version of a lab, as `make student` writes it."""
    nb = classroom.student_notebook(classroom.read_notebook(notebooks / f"{lab}.ipynb"))
    return classroom.stamped(nb, lab)


def with_answer(nb: dict, function: str, body: str) -> dict:
    """The notebook with the stub of `function` replaced by `body` (lines indented under the def)."""
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and re.search(rf"^def {function}\(", src, re.M):
            lines = "".join(f"    {line}\n" for line in body.splitlines())
            cell["source"] = src.replace(f"    {classroom.STUB}\n", lines).replace(f"    {classroom.STUB}", lines)
    return nb


def replace_cell(nb: dict, old: str, new: str) -> dict:
    """The notebook with the code cell whose source starts with `old` replaced by `new`."""
    nb = json.loads(json.dumps(nb))
    hits = [c for c in nb["cells"] if "".join(c["source"]).startswith(old)]
    assert len(hits) == 1, old
    hits[0]["source"] = new
    return nb


def insert_cell(nb: dict, index: int, source: str, kind: str = "code") -> dict:
    nb = json.loads(json.dumps(nb))
    made = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
    nb["cells"].insert(index, json.loads(json.dumps(made)))
    return nb


def solved(notebooks: Path) -> dict:
    """A perfect submission of lab 00_mini."""
    nb = with_answer(handout(notebooks, "00_mini"), "square", "return x * x")
    return with_answer(nb, "add", "return a + b")


def save(nb: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1))
    return path
