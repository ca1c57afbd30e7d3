"""Student notebooks from the instructor notebooks (nbgrader's solution markers), written without ever
overwriting a learner's work; and the classroom command.

    python -m labkit.course.classroom student OUT_DIR [--notebooks notebooks]      (make student, make lab)
    python -m labkit.course.classroom grade SUBMISSIONS [--out grades/gradebook.csv] [--lab LAB]  (make grade)

In every code cell, the lines between `### BEGIN SOLUTION` and `### END SOLUTION` (markers included)
become one stub at the marker's indentation:

    def count_params(cfg):                  def count_params(cfg):
        ### BEGIN SOLUTION          ->          raise NotImplementedError("exercise: write this part")
        d = cfg.d_model
        ...
        ### END SOLUTION

and every output is cleared. The check cell after an exercise then reports "not implemented yet" and
the notebook goes on with the reference implementation (labkit.course.check). Each student notebook is
stamped in its metadata with its lab and version ({"labkit": {"lab": "00_setup", "version": "..."}}): the
grader knows the lab from it, and writing again knows whether the learner changed the file (see
write_student_notebooks). Grading is labkit.course.gradebook's.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
from pathlib import Path

from .._checks import check_type, fail
from ..paths import NOTEBOOKS
from .labs import STAMP, read_notebook, source_of

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("exercise: write this part")'

RUN_METADATA = ("execution", "ExecuteTime")  # per-cell timings: nbclient's, and the ExecuteTime extension's


def strip_solutions(source: str, where: str = "cell") -> tuple[str, list[str]]:
    """(source with each solution replaced by a stub, the removed solution lines)."""
    out, removed, indent = [], [], None
    for n, line in enumerate(source.splitlines(keepends=True), 1):
        tag = line.strip()
        if tag == BEGIN:
            if indent is not None:
                raise ValueError(f"{where}, line {n}: {BEGIN} inside another solution")
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}{STUB}\n")
        elif tag == END:
            if indent is None:
                raise ValueError(f"{where}, line {n}: {END} without {BEGIN}")
            indent = None
        elif indent is not None:
            removed.append(line.rstrip("\n"))
        else:
            out.append(line)
    if indent is not None:
        raise ValueError(f"{where}: {BEGIN} without {END}")
    return "".join(out), removed


def student_notebook(nb: dict, name: str = "notebook") -> dict:
    """A copy of notebook `nb` (nbformat 4 JSON as a dict) with solutions stubbed and outputs cleared, and
    without what the instructor's run left in the metadata (cell timings, the widgets' saved state)."""
    check_type("nb", nb, dict)
    if "cells" not in nb:
        fail("nb", sorted(nb), "a notebook dict with 'cells'")
    nb = copy.deepcopy(nb)
    nb.get("metadata", {}).pop("widgets", None)
    for i, cell in enumerate(nb["cells"]):
        for key in RUN_METADATA:
            cell.get("metadata", {}).pop(key, None)
        source = source_of(cell)
        if cell.get("cell_type") != "code":
            if BEGIN in source or END in source:
                raise ValueError(f"{name}, cell {i}: solution markers belong in code cells only")
            continue
        cell["source"], _ = strip_solutions(source, f"{name}, cell {i}")
        cell["outputs"], cell["execution_count"] = [], None
    return nb


def execute(nb, cwd: Path = NOTEBOOKS, timeout: int = 300):
    """Run a notebook (an nbformat NotebookNode) top to bottom in a fresh kernel of *this* Python, as nbval's
    --nbval-current-env does; fills in its outputs and returns it. Raises on the first failing cell. The
    kernel is shut down afterwards. (benchmarks/notebook_time.py and tests/course/test_solutions.py use it; grading
    is labkit.course.submission.)"""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    try:
        NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        if km.has_kernel:  # the client leaves a kernel it was handed running
            km.shutdown_kernel(now=True)
    return nb


def version(nb: dict) -> str:
    """A fingerprint of a notebook's content, its lab stamp left out (cell ids and the split of sources
    into lines do not count, so JupyterLab re-saving an untouched notebook keeps it)."""
    nb = copy.deepcopy(nb)
    nb.get("metadata", {}).pop(STAMP, None)
    for cell in nb.get("cells", []):
        cell.pop("id", None)
        cell["source"] = source_of(cell)
    return hashlib.sha256(json.dumps(nb, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def stamped(nb: dict, lab: str) -> dict:
    """Notebook `nb` with its lab and version in metadata["labkit"]."""
    nb = copy.deepcopy(nb)
    nb.setdefault("metadata", {})[STAMP] = {"lab": lab, "version": version(nb)}
    return nb


def _state(path: Path) -> tuple[str, str | None]:
    """('missing' | 'untouched' | 'edited', the version it was made from)."""
    if not path.exists():
        return "missing", None
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        made_from = nb["metadata"][STAMP]["version"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "edited", None  # unreadable or unstamped: the learner's, never touched
    return ("untouched" if version(nb) == made_from else "edited"), made_from


def _write_one(dst: Path, nb: dict) -> str:
    """Write student notebook `nb` at `dst` unless that would lose a learner's work; what was done, in words."""
    state, made_from = _state(dst)
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    new = nb["metadata"][STAMP]["version"]
    if state == "missing" or (state == "untouched" and made_from != new):
        dst.write_text(text, encoding="utf-8")
        return "created" if state == "missing" else "updated (you had not changed it)"
    if made_from == new:
        return "up to date" if state == "untouched" else "kept: your work, from the current version"
    beside = dst.with_suffix(".new.ipynb")
    beside_state, beside_from = _state(beside)
    if beside_state == "edited":
        return (f"kept: your work; a newer version exists, but {beside.name} has your edits too: rename it, "
                "then run this again to get the newest")
    if beside_state == "missing" or beside_from != new:
        beside.write_text(text, encoding="utf-8")
    return f"kept: your work; the newer version of this lab is {beside.name}, beside it"


def write_student_notebooks(out_dir: Path, notebooks: Path = NOTEBOOKS) -> list[tuple[Path, str]]:
    """Write a student version of every notebooks/*.ipynb into `out_dir`, never overwriting a notebook the
    learner changed: a missing one is created, an untouched older one updated, an edited one kept, with the
    newer version written beside it as NAME.new.ipynb. Returns (path, what was done) for every lab."""
    notebooks = Path(check_type("notebooks", notebooks, (str, Path)))
    out_dir = Path(check_type("out_dir", out_dir, (str, Path)))
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {notebooks}")
    converted = {p: stamped(student_notebook(read_notebook(p), p.name), p.stem) for p in sources}  # all or nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    return [(out_dir / src.name, _write_one(out_dir / src.name, nb)) for src, nb in converted.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.course.classroom")
    sub = parser.add_subparsers(dest="command", required=True)
    student = sub.add_parser("student", help="write the student notebooks that are missing (solutions stubbed, "
                                             "outputs cleared); a learner's edited notebook is never overwritten")
    student.add_argument("out_dir", type=Path)
    student.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="instructor notebooks folder")
    grade = sub.add_parser("grade", help="run and grade every student's notebooks into a CSV, reports, a summary")
    grade.add_argument("submissions", type=Path, help="one folder per student, or one notebook per student")
    grade.add_argument("--out", type=Path, default=Path("grades/gradebook.csv"), help="the CSV to write")
    grade.add_argument("--lab", help="grade this lab only (e.g. 00_setup); default: every lab submitted")
    grade.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="instructor notebooks folder")
    grade.add_argument("--cell-timeout", type=float, default=300, help="seconds per cell (default 300)")
    grade.add_argument("--timeout", type=float, default=1800, help="seconds per notebook (default 1800)")
    args = parser.parse_args(argv)
    if args.command == "grade":
        from .gradebook import grade as grade_class

        try:
            grade_class(args.submissions, args.out, args.notebooks, args.lab, args.cell_timeout, args.timeout)
        except (FileNotFoundError, ValueError) as e:
            parser.exit(2, f"grade: {e}\n")
        print(f"wrote {args.out}")
        return
    if args.out_dir.resolve() == args.notebooks.resolve():
        parser.error("out_dir must differ from the instructor notebooks folder")
    for path, done in write_student_notebooks(args.out_dir, args.notebooks):
        print(f"{path}: {done}")


if __name__ == "__main__":
    main()
