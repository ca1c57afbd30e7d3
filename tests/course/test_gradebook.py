"""A class graded end to end on the mini course (tests/course/minicourse.py): the CSV holds what each student
did, crashes and timeouts are errors, tampering is reported, bad submissions are named and the rest graded."""
import csv
import hashlib

import pytest

from labkit.course import classroom, gradebook

from . import minicourse as mc

CELL_TIMEOUT = 10  # the loop student's check cell waits this long; the other cells take well under a second

WRONG_ADD = "return a - b"


def build_class(notebooks, root):
    """SUBMISSIONS: a folder per student (and one file-named student); {student: expected verdicts}."""
    given = mc.handout(notebooks, "00_mini")
    ok = mc.solved(notebooks)

    def answers(square, add="return a + b"):
        return mc.with_answer(mc.with_answer(given, "square", square), "add", add)

    mc.save(ok, root / "perfect" / "00_mini.ipynb")
    mc.save(given, root / "empty" / "00_mini.ipynb")
    mc.save(answers("return x + x"),
            root / "wrong" / "lab.ipynb")
    raises = mc.with_answer(given, "square", "raise ValueError('no idea')")
    raises = mc.replace_cell(raises, "def add", "raise RuntimeError('oops')\n\ndef add(a, b):\n    return a + b")
    mc.save(raises, root / "raises" / "00_mini.ipynb")
    mc.save(answers("while True:\n    pass"), root / "loops" / "00_mini.ipynb")
    tampered = mc.replace_cell(answers("return 0"), "square = check",
                               'print("[PASS] square matches the reference on 2 fixed and 20 random cases.")')
    mc.save(tampered, root / "tampered" / "00_mini.ipynb")
    patched = mc.insert_cell(answers("return 0"), 1,
                             "check.exercise = lambda fn, ex, *a, **k: (print('[PASS] fine'), fn)[1]")
    mc.save(patched, root / "patched" / "00_mini.ipynb")
    swapped = mc.insert_cell(answers("return 0"), 1,
                             "from labkit.course import Exercise\n"
                             "exercises.SQUARE = Exercise('square', lambda x: 0, cases=[(1,)])")
    mc.save(swapped, root / "swapped" / "00_mini.ipynb")
    moved = ok["cells"]
    moved = [moved[0], moved[4], moved[5], moved[6], moved[1], moved[2], moved[3], moved[7]]
    moved = mc.insert_cell(mc.insert_cell({**ok, "cells": moved}, 1, "my notes", "markdown"), 3, "x = 41 + 1")
    mc.save(moved, root / "moved" / "00_mini.ipynb")
    mc.save(ok, root / "zoe_00_mini.ipynb")
    (root / "yann.txt").write_text("I could not do it")
    mc.save(ok, root / "twice" / "00_mini.ipynb")
    mc.save(ok, root / "twice" / "00_mini.new.ipynb")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "00_mini.ipynb").write_text('{"cells": [')
    mc.save(mc.with_answer(mc.handout(notebooks, "01_other"), "halve", "return x / 2"),
            root / "other" / "00_mini.ipynb")
    (root / "nothing").mkdir()
    (root / "nothing" / "notes.md").write_text("hello")
    return {
        "perfect": ("PASS", "PASS"), "empty": ("TODO", "TODO"), "wrong": ("FAIL", "PASS"),
        "raises": ("FAIL", "ERROR"), "loops": ("ERROR", "PASS"), "tampered": ("TAMPERED", "PASS"),
        "patched": ("TAMPERED", "TAMPERED"), "swapped": ("TAMPERED", "PASS"), "moved": ("PASS", "PASS"),
        "zoe": ("PASS", "PASS"), "yann": ("MISSING", "MISSING"), "twice": ("ERROR", "ERROR"),
        "corrupt": ("MISSING", "MISSING"), "other": ("MISSING", "MISSING"), "nothing": ("MISSING", "MISSING"),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    package, notebooks = mc.make(root / "course")
    submissions = root / "submissions"
    expected = build_class(notebooks, submissions)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in submissions.rglob("*") if p.is_file()}
    out = root / "grades" / "gradebook.csv"
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(package))
        mp.setenv("PYTHONPATH", str(package))
        classroom.main(["grade", str(submissions), "--out", str(out), "--notebooks", str(notebooks),
                        "--lab", "00_mini", "--cell-timeout", str(CELL_TIMEOUT)])
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in submissions.rglob("*") if p.is_file()}
    with out.open() as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    return {"rows": rows, "expected": expected, "out": out, "before": before, "after": after}


def test_every_student_gets_the_verdicts_of_what_they_did(graded):
    rows = graded["rows"]
    assert set(rows) == set(graded["expected"])
    got = {name: (row[mc.SQUARE].split(":")[0], row[mc.ADD].split(":")[0]) for name, row in rows.items()}
    assert got == graded["expected"]
    assert list(next(iter(rows.values()))) == ["student", "status", "passed", "total", mc.SQUARE, mc.ADD]
    assert {name: int(row["passed"]) for name, row in rows.items()} == \
        {name: v.count("PASS") for name, v in graded["expected"].items()}


def test_messages_say_what_happened(graded):
    rows = graded["rows"]
    assert "square(3) returned 6, not the answer for this case" in rows["wrong"][mc.SQUARE]
    assert "raised ValueError: no idea" in rows["raises"][mc.SQUARE]
    assert "NameError" in rows["raises"][mc.ADD]
    assert "timed out after" in rows["loops"][mc.SQUARE] and "timed out" in rows["loops"]["status"]
    assert "edited or removed" in rows["tampered"][mc.SQUARE]
    assert "never reached the course's check" in rows["patched"][mc.SQUARE]
    assert "not the course's" in rows["swapped"][mc.SQUARE]
    assert rows["perfect"]["status"] == rows["moved"]["status"] == "ok"


@pytest.mark.parametrize("student, problem", [
    ("yann", "yann.txt is not a notebook"),
    ("twice", "two notebooks for lab 00_mini (00_mini.ipynb, 00_mini.new.ipynb)"),
    ("corrupt", "corrupt/00_mini.ipynb is not a notebook (not JSON"),
    ("other", "other/00_mini.ipynb is lab 01_other (by its metadata), not 00_mini"),
    ("nothing", "no notebook in nothing/ (found nothing/notes.md)"),
])
def test_bad_submissions_are_named_in_the_status(graded, student, problem):
    assert problem in graded["rows"][student]["status"]


def test_submissions_are_never_modified(graded):
    assert graded["before"] == graded["after"]


def test_reports_and_summary(graded):
    out = graded["out"]
    report = (out.parent / "gradebook_reports" / "raises.txt").read_text()
    assert report.startswith("raises: 0 of 2 exercises pass") and "cell 6 raised RuntimeError: oops" in report
    assert sorted(p.stem for p in (out.parent / "gradebook_reports").iterdir()) == sorted(graded["expected"])
    summary = (out.parent / "gradebook_summary.txt").read_text().splitlines()
    assert summary[0].startswith("15 students graded in")
    counts = {line.split()[0]: [int(n) for n in line.split()[1:]] for line in summary[2:]}
    # PASS FAIL TODO ERROR TAMPERED MISSING, counted from the expected table independently
    for col, ex in ((0, mc.SQUARE), (1, mc.ADD)):
        statuses = [v[col] for v in graded["expected"].values()]
        assert counts[ex] == [statuses.count(s) for s in ("PASS", "FAIL", "TODO", "ERROR", "TAMPERED", "MISSING")]


def test_without_a_lab_every_submitted_lab_gets_columns(tmp_path, monkeypatch):
    package, notebooks = mc.make(tmp_path / "course")
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", str(package))
    sub = tmp_path / "sub"
    mc.save(mc.with_answer(mc.handout(notebooks, "01_other"), "halve", "return x // 2"), sub / "ann" / "h.ipynb")
    (sub / "bea").mkdir()
    table = gradebook.grade(sub, tmp_path / "g.csv", notebooks, cell_timeout=CELL_TIMEOUT, log=lambda *a: None)
    assert {k: str(v).split(":")[0] for k, v in table["ann"].items()} == {mc.HALVE: "FAIL"}
    assert str(table["bea"][mc.HALVE]) == "MISSING: no notebook for lab 01_other"
    assert "halve(3) returned 1, not the answer for this case" in str(table["ann"][mc.HALVE])


def test_missing_and_empty_submission_folders(tmp_path, capsys):
    _, notebooks = mc.make(tmp_path / "course")
    with pytest.raises(SystemExit) as e:
        classroom.main(["grade", str(tmp_path / "nowhere"), "--notebooks", str(notebooks)])
    assert e.value.code == 2 and "no submissions folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        classroom.main(["grade", str(tmp_path / "empty"), "--notebooks", str(notebooks)])
    assert "no submissions in" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lab must be one of"):
        gradebook.find_submissions(tmp_path / "empty", {}, "00_nope")


def test_file_named_students():
    labs = {"00_setup": None, "01_memory_wall": None}
    from pathlib import Path
    assert gradebook.student_of_file(Path("alice_00_setup.ipynb"), labs) == "alice"
    assert gradebook.student_of_file(Path("bob.ipynb"), labs) == "bob"
    assert gradebook.student_of_file(Path("00_setup.ipynb"), labs) == "00_setup"
