"""Grade a class: every student's notebooks, one after another, into a CSV, a report per student and a summary.

    python -m labkit.course.classroom grade SUBMISSIONS [--out grades/gradebook.csv] [--lab 00_setup]

SUBMISSIONS holds one folder per student (its name is the student's), or one notebook per student named
after them ("alice.ipynb", "alice_00_setup.ipynb"). Each notebook's lab is found by labkit.course.labs
(metadata stamp, file name, check cells); labkit.course.submission runs and grades it. Written:

    gradebook.csv               one row per student: student, status, passed, total, one column per exercise
                                (PASS, FAIL: why, TODO, ERROR: why, TAMPERED: why, MISSING: why)
    gradebook_reports/NAME.txt  what was graded, each verdict in full, the cells that raised
    gradebook_summary.txt       per exercise, how many students got each status (also printed)

A file that is not a notebook, a corrupted notebook, a notebook of another lab and two notebooks for one
lab are reported in the student's status; every other student is still graded.
"""

from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._checks import check_type
from . import labs as course_labs
from .labs import Lab
from .submission import STATUSES, Result, Verdict, grade_notebook


@dataclass
class Student:
    """One student: their notebooks by lab ({lab: [(path, notebook dict)]}), the problems found with the
    submission, and the graded results by lab."""
    name: str
    notebooks: dict[str, list[tuple[Path, dict]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    results: dict[str, Result] = field(default_factory=dict)


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def student_of_file(path: Path, labs: dict[str, Lab]) -> str:
    """The student a notebook directly in SUBMISSIONS belongs to: its name without lab names
    ("alice_00_setup.ipynb" -> "alice")."""
    stem = path.name.removesuffix(".new.ipynb").removesuffix(path.suffix)
    for lab in sorted(labs, key=len, reverse=True):
        stem = stem.replace(lab, "")
    return stem.strip(" _-.") or path.stem


def _read(path: Path, root: Path, labs: dict[str, Lab], only: str | None, student: Student) -> None:
    rel = path.relative_to(root).as_posix()
    if path.suffix != ".ipynb":
        student.problems.append(f"{rel} is not a notebook (.ipynb)")
        return
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
        import nbformat

        nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        student.problems.append(f"{rel} is not a notebook (not JSON: {e})")
        return
    except Exception as e:  # nbformat's validation errors, a JSON value that is not a notebook
        student.problems.append(f"{rel} is not a valid notebook ({type(e).__name__}: {str(e).splitlines()[0]})")
        return
    lab, how = course_labs.identify(nb, path.name, labs)
    if lab is None:
        student.problems.append(f"{rel} is not a notebook of this course ({how})")
    elif only and lab != only:
        student.problems.append(f"{rel} is lab {lab} (by {how}), not {only}")
    else:
        student.notebooks.setdefault(lab, []).append((path, nb))


def find_submissions(root: Path, labs: dict[str, Lab], only: str | None = None) -> list[Student]:
    """The students in folder `root`, with their notebooks (of lab `only` when given) and problems."""
    root = Path(check_type("root", root, (str, Path)))
    if not root.is_dir():
        raise FileNotFoundError(f"no submissions folder {root}")
    if only is not None and only not in labs:
        raise ValueError(f"lab must be one of {sorted(labs)}, got {only!r}")
    students: dict[str, Student] = {}
    for entry in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        if entry.is_dir():
            student = students.setdefault(entry.name, Student(entry.name))
            files = sorted(p for p in entry.rglob("*") if p.is_file() and _visible(p, entry))
            if not any(p.suffix == ".ipynb" for p in files):
                found = f" (found {', '.join(p.relative_to(root).as_posix() for p in files)})" if files else ""
                student.problems.append(f"no notebook in {entry.name}/{found}")
            for path in files:
                if path.suffix == ".ipynb":
                    _read(path, root, labs, only, student)
        elif entry.is_file():
            name = student_of_file(entry, labs)
            _read(entry, root, labs, only, students.setdefault(name, Student(name)))
    if not students:
        raise ValueError(f"no submissions in {root}: put one folder per student in it, or one notebook per "
                         "student named after them")
    return list(students.values())


def grade_class(students: list[Student], labs: dict[str, Lab], columns: list[str], cell_timeout: float = 300,
                timeout: float = 1800, log=print) -> None:
    """Grade every student's notebook of every lab in `columns`, one after another (fills .results)."""
    for student in students:
        for name in columns:
            found = student.notebooks.get(name, [])
            if len(found) > 1:
                where = ", ".join(p.name for p, _ in found)
                student.problems.append(f"two notebooks for lab {name} ({where}): keep one and grade again")
                continue
            if found:
                result = grade_notebook(found[0][1], labs[name], cell_timeout=cell_timeout, timeout=timeout)
                student.results[name] = result
                passed = sum(v.status == "PASS" for v in result.verdicts.values())
                log(f"{student.name}: {name} {passed}/{len(result.verdicts)} PASS ({result.seconds:.1f} s)")


def verdicts_of(student: Student, labs: dict[str, Lab], columns: list[str]) -> dict[str, Verdict]:
    """Every exercise of the graded labs, for one student."""
    out = {}
    for name in columns:
        result, found = student.results.get(name), student.notebooks.get(name, [])
        for ex in labs[name].exercises:
            if result:
                out[ex] = result.verdicts[ex]
            elif len(found) > 1:
                out[ex] = Verdict("ERROR", f"two notebooks for lab {name}")
            else:
                out[ex] = Verdict("MISSING", f"no notebook for lab {name}")
    return out


def status_of(student: Student) -> str:
    """'ok', or what went wrong with the submission (a file that is not a notebook, a timeout, ...)."""
    problems = student.problems + [p for r in student.results.values() for p in r.problems]
    return "; ".join(problems) or "ok"


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "_"


def report(student: Student, verdicts: dict[str, Verdict]) -> str:
    """The per-student text report."""
    passed = sum(v.status == "PASS" for v in verdicts.values())
    lines = [f"{student.name}: {passed} of {len(verdicts)} exercises pass", f"status: {status_of(student)}"]
    for name, result in student.results.items():
        lines.append(f"lab {name}: graded in {result.seconds:.1f} s")
        lines += [f"  note: {note}" for note in result.notes]
    lines += [f"  {ex:<32} {verdict}" for ex, verdict in verdicts.items()]
    return "\n".join(lines) + "\n"


def summary(table: dict[str, dict[str, Verdict]], seconds: float) -> str:
    """Per exercise, how many students got each status; the time per student."""
    exercises = list(next(iter(table.values()), {}))
    width = max([len(e) for e in exercises] + [8])
    n = len(table)
    lines = [f"{n} student{'s' if n != 1 else ''} graded in {seconds:.1f} s ({seconds / max(n, 1):.1f} s per student)",
             f"{'exercise':<{width}} " + " ".join(f"{s:>8}" for s in STATUSES)]
    for ex in exercises:
        counts = [sum(v[ex].status == s for v in table.values()) for s in STATUSES]
        lines.append(f"{ex:<{width}} " + " ".join(f"{c:>8}" for c in counts))
    return "\n".join(lines) + "\n"


def grade(submissions: Path, out: Path, notebooks: Path | None = None, lab: str | None = None,
          cell_timeout: float = 300, timeout: float = 1800, log=print) -> dict[str, dict[str, Verdict]]:
    """Grade folder `submissions` against the labs in `notebooks` (the course's by default); write the CSV at
    `out`, the reports and the summary beside it; return {student: {exercise id: Verdict}}."""
    out = Path(check_type("out", out, (str, Path)))
    labs = course_labs.course_labs(*([notebooks] if notebooks else []))
    students = find_submissions(Path(submissions), labs, lab)
    columns = [lab] if lab else sorted({name for s in students for name in s.notebooks})
    start = time.monotonic()
    grade_class(students, labs, columns, cell_timeout, timeout, log)
    seconds = time.monotonic() - start
    table = {s.name: verdicts_of(s, labs, columns) for s in students}
    exercises = [ex for name in columns for ex in labs[name].exercises]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "status", "passed", "total", *exercises])
        for s in students:
            v = table[s.name]
            writer.writerow([s.name, status_of(s), sum(x.status == "PASS" for x in v.values()), len(v),
                             *(str(v[ex]) for ex in exercises)])
    reports = out.parent / f"{out.stem}_reports"
    reports.mkdir(exist_ok=True)
    for s in students:
        (reports / f"{_safe(s.name)}.txt").write_text(report(s, table[s.name]), encoding="utf-8")
    text = summary(table, seconds)
    (out.parent / f"{out.stem}_summary.txt").write_text(text, encoding="utf-8")
    log(text.rstrip())
    return table
