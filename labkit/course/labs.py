"""What grading expects of each lab: its check cells, recognised by their code, and a stable id per exercise.

A lab is an instructor notebook, notebooks/NN_topic.ipynb; its name is the file's stem ("00_setup"). Its
check cells are the code cells that call the course's check,

    count_params = check.exercise(count_params, exercises.COUNT_PARAMS)     # or exercises.COUNT_PARAMS.check(fn)

and each exercise gets a stable id from where its Exercise object is defined: labkit/tinylm/exercises.py's
COUNT_PARAMS is "tinylm.COUNT_PARAMS" (a check against a plain reference function gets "<lab>.<name>").
A student's cell is that check cell when its code is the same (comments, blank lines and spacing aside), so
cells may be added or moved. labkit.course.gradebook (make grade) and labkit.course.submission use this
module; labkit.course.classroom stamps each student notebook with its lab's name.
"""

from __future__ import annotations

import ast
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from .._checks import check_type
from ..paths import NOTEBOOKS
from .check import Exercise

STAMP = "labkit"  # notebook metadata key: {"lab": "00_setup", "version": "..."} (labkit.course.classroom)
CHECK_FUNCTION = "labkit.course.check.exercise"


def source_of(cell: dict) -> str:
    """A cell's source as one string (nbformat stores a string or a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _parse(source: str) -> ast.Module | None:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return None


def read_notebook(path: Path) -> dict:
    """A notebook file as a dict; a clear error naming the file when it is not notebook JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable notebook (JSON): {e}") from None


def cell_code(source: str) -> str | None:
    """The code of a cell, normalised for comparison (an AST dump: comments and spacing do not count);
    None when it is not Python (a syntax error). IPython's %magics and !commands are translated first."""
    tree = _parse(source)
    return None if tree is None else ast.dump(tree)


@dataclass(frozen=True)
class Check:
    """One check call: the exercise's stable id, where its Exercise lives (module, attribute; both None for a
    plain reference function) and the code that binds the notebook's name for the function to the reference
    when the check cell crashed or timed out ("" when the call is not assigned to a name)."""
    exercise: str
    module: str | None
    attr: str | None
    fallback: str


@dataclass(frozen=True)
class CheckCell:
    """A check cell of the instructor notebook: its normalised code and its checks in call order."""
    code: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Lab:
    """A lab: its name and its check cells, in notebook order."""
    name: str
    cells: tuple[CheckCell, ...]

    @property
    def exercises(self) -> list[str]:
        """The stable ids of the lab's exercises, in notebook order."""
        return [c.exercise for cell in self.cells for c in cell.checks]

    @property
    def modules(self) -> list[tuple[str, str, str]]:
        """(id, module, attribute) of every exercise defined as an Exercise object."""
        return [(c.exercise, c.module, c.attr) for cell in self.cells for c in cell.checks if c.module]


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _aliases(trees: list[ast.AST]) -> dict[str, str]:
    """Name bound by an import -> the full dotted name it stands for, over all the notebook's cells."""
    names = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def _expand(node: ast.AST, aliases: dict[str, str]) -> str | None:
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    return aliases.get(head, head) + (f".{rest}" if rest else "")


def _exercise_at(full: str | None) -> tuple[str, str] | None:
    """(module, attribute) when `full` names an Exercise object, else None."""
    if not full or "." not in full:
        return None
    module, attr = full.rsplit(".", 1)
    try:
        obj = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
    return (module, attr) if isinstance(obj, Exercise) else None


def stable_id(module: str, attr: str) -> str:
    """'labkit.tinylm.exercises', 'COUNT_PARAMS' -> 'tinylm.COUNT_PARAMS'."""
    short = module.removeprefix("labkit.").removesuffix(".exercises")
    return f"{short}.{attr}"


def _check_of(call: ast.Call, target: str | None, lab: str, n: int, aliases: dict[str, str]) -> Check | None:
    """The Check a call makes, or None when the call is not a check."""
    func = _expand(call.func, aliases)
    if func and (func == CHECK_FUNCTION or func.endswith(".check.exercise")) and len(call.args) >= 2:
        fn, ref = call.args[0], call.args[1]
    elif isinstance(call.func, ast.Attribute) and call.func.attr == "check" and call.args:
        fn, ref = call.args[0], call.func.value
        if _exercise_at(_expand(ref, aliases)) is None:
            return None
    else:
        return None
    found = _exercise_at(_expand(ref, aliases))
    if found:
        bind = f"{target} = {ast.unparse(ref)}.reference" if target else ""
        return Check(stable_id(*found), found[0], found[1], bind)
    names = [k.value.value for k in call.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)]
    name = str(names[0]) if names else (_dotted(fn) or f"check {n + 1}")
    return Check(f"{lab}.{name}", None, None, f"{target} = {ast.unparse(ref)}" if target else "")


def _checks(tree: ast.Module, lab: str, start: int, aliases: dict[str, str]) -> list[Check]:
    out, targets = [], {}
    for stmt in tree.body:  # `name = check.exercise(...)` at the top level: the name to bind after a crash
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            targets[id(stmt.value)] = stmt.targets[0].id
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found = _check_of(node, targets.get(id(node)), lab, start + len(out), aliases)
            if found:
                out.append(found)
    return out


def read_lab(path: Path) -> Lab:
    """The lab of instructor notebook `path`: its check cells and exercises (the student's version of each
    check cell is the same code, as labkit.course.classroom never changes a cell without solution markers)."""
    path = Path(check_type("path", path, (str, Path)))
    nb = read_notebook(path)
    trees = [_parse(source_of(c)) for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    aliases = _aliases([t for t in trees if t is not None])
    cells, n = [], 0
    for tree in trees:
        if tree is None:
            continue
        checks = _checks(tree, path.stem, n, aliases)
        if checks:
            cells.append(CheckCell(ast.dump(tree), tuple(checks)))
            n += len(checks)
    ids = [c.exercise for cell in cells for c in cell.checks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path.name}: an exercise is checked twice ({ids}); each needs one check cell")
    return Lab(path.stem, tuple(cells))


def course_labs(notebooks: Path = NOTEBOOKS) -> dict[str, Lab]:
    """Every lab of the course: {name: Lab} for notebooks/*.ipynb."""
    notebooks = Path(check_type("notebooks", notebooks, (str, Path)))
    paths = sorted(notebooks.glob("*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {notebooks}")
    return {p.stem: read_lab(p) for p in paths}


def identify(nb: dict, filename: str, labs: dict[str, Lab]) -> tuple[str | None, str]:
    """(the lab a submitted notebook belongs to, how that was decided): the lab stamped in its metadata by
    `make student`, else a lab named in its file name, else the lab whose check cells it holds the most of;
    (None, why) when nothing matches."""
    stamp = nb.get("metadata", {}).get(STAMP, {})
    lab = stamp.get("lab") if isinstance(stamp, dict) else None
    if lab in labs:
        return lab, "its metadata"
    named = [name for name in labs if name in filename]
    if named:
        return max(named, key=len), "its file name"
    codes = {cell_code(source_of(c)) for c in nb.get("cells", []) if c.get("cell_type") == "code"}
    counts = {name: sum(cell.code in codes for cell in lab.cells) for name, lab in labs.items()}
    best = max(counts, key=counts.get, default=None)
    if best is not None and counts[best]:
        return best, "its check cells"
    return None, "no lab stamp, lab name or check cell of this course"


def dumps_exercises(lab: Lab) -> str:
    """The JSON the grading kernel reads to know the lab's Exercise objects (labkit.course.sandbox)."""
    return json.dumps(lab.modules)
