"""One notebook graded in its own kernel: no network, time limits per cell and per notebook, verdicts read from
the course's check (records with the grader's nonce), never from printed text."""
import json
import time

import pytest

from labkit.course import classroom, labs, sandbox, submission
from labkit.course.submission import Verdict

from . import minicourse as mc


@pytest.fixture
def course(tmp_path, monkeypatch):
    package, notebooks = mc.make(tmp_path / "course")
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", str(package))
    return notebooks


NETWORK = """
import socket, urllib.request
outside = []
for attempt in (lambda: socket.create_connection(("1.1.1.1", 80), timeout=3),
                lambda: urllib.request.urlopen("http://example.com", timeout=3)):
    try:
        attempt()
        outside.append("reached")
    except OSError as e:  # PermissionError (audit hook), or unreachable (own network namespace)
        outside.append(type(e).__name__)
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
socket.create_connection(server.getsockname(), timeout=5).close()  # the loopback still works
assert "reached" not in outside, outside
print("network off, loopback on")
"""


def test_network_is_off_and_a_slow_notebook_stops_at_its_time_limit(course):
    nb = mc.insert_cell(mc.solved(course), 1, NETWORK)
    nb = mc.insert_cell(nb, 2, "import time\ntime.sleep(120)")
    lab = labs.read_lab(course / "00_mini.ipynb")
    start = time.monotonic()
    result = submission.grade_notebook(nb, lab, cell_timeout=300, timeout=15)
    assert time.monotonic() - start < 45
    assert not any("cell 2 raised" in note for note in result.notes), result.notes  # the network cell passed
    assert any(p.startswith("cell 3 timed out after") for p in result.problems), result.problems
    assert "the notebook's time limit (15 s) ran out before cell 5" in result.problems
    assert {ex: v.status for ex, v in result.verdicts.items()} == {mc.SQUARE: "ERROR", mc.ADD: "ERROR"}
    assert result.verdicts[mc.SQUARE].message.startswith("not graded: the notebook's time limit")


def test_a_notebook_that_kills_its_kernel(course):
    nb = mc.insert_cell(mc.solved(course), 4, "import os\nos._exit(1)")
    result = submission.grade_notebook(nb, labs.read_lab(course / "00_mini.ipynb"), cell_timeout=60)
    assert result.verdicts[mc.SQUARE].status == "PASS"
    assert result.verdicts[mc.ADD] == Verdict("ERROR", "not graded: the kernel died in cell 5")


def test_printed_verdicts_are_not_trusted(course):
    """A cell that prints a PASS line, or shows a record without the grader's nonce, changes nothing."""
    forged = json.dumps({"nonce": "guess", "exercise": mc.SQUARE, "verdict": "PASS", "message": ""})
    nb = mc.with_answer(mc.handout(course, "00_mini"), "square",
                        f"from IPython.display import display\n"
                        f"display({{{sandbox.MIME!r}: {forged}}}, raw=True)\n"
                        "print('[PASS] square matches the reference')\nreturn 0")
    result = submission.grade_notebook(nb, labs.read_lab(course / "00_mini.ipynb"), cell_timeout=60)
    assert result.verdicts[mc.SQUARE].status == "FAIL" and result.verdicts[mc.ADD].status == "TODO"


def test_the_instructor_version_of_a_real_lab_passes_every_exercise():
    """(Its student version grades all TODO: tests/course/test_classroom.py, for every lab.)"""
    path = labs.NOTEBOOKS / "00_setup.ipynb"
    lab = labs.read_lab(path)
    assert lab.exercises == ["tinylm.COUNT_PARAMS"]
    solved = submission.grade_notebook(classroom.read_notebook(path), lab, cell_timeout=300)
    assert {v.status for v in solved.verdicts.values()} == {"PASS"} and not solved.problems, solved


def _check(module=True):
    return labs.Check("m.EX", "m" if module else None, "EX" if module else None, "")


@pytest.mark.parametrize("records, reply, expected", [
    ([{"exercise": "m.EX", "verdict": "PASS", "message": "fine"}], {"status": "ok"}, Verdict("PASS", "fine")),
    ([{"exercise": "m.EX", "verdict": "FAIL", "message": "f(1) returned 2"}], {"status": "error", "ename": "E"},
     Verdict("FAIL", "f(1) returned 2")),
    ([{"exercise": "?", "verdict": "PASS", "message": ""}], {"status": "ok"}, "TAMPERED"),
    ([], {"status": "ok"}, "TAMPERED"),
    ([], {"status": "error", "ename": "NameError", "evalue": "name 'f' is not defined"},
     Verdict("ERROR", "the check cell raised NameError: name 'f' is not defined")),
    ([{"exercise": "m.EX", "verdict": "PASS", "message": ""}], {"status": "error", "ename": submission.TIMEOUT},
     Verdict("ERROR", "timed out after 7 s: the check did not finish")),
    ([{"exercise": "m.EX", "verdict": "BOGUS", "message": "x"}], {"status": "ok"}, Verdict("ERROR", "x")),
])
def test_verdict_of_a_check_cell(records, reply, expected):
    got = submission._verdict(_check(), 0, records, reply, 7)
    assert got == expected if isinstance(expected, Verdict) else got.status == expected


def test_plain_reference_checks_are_matched_in_call_order():
    records = [{"exercise": None, "verdict": "PASS", "message": "a"}, {"exercise": None, "verdict": "TODO",
                                                                        "message": "b"}]
    assert submission._verdict(_check(False), 1, records, {"status": "ok"}, 7) == Verdict("TODO", "b")


def test_arguments_are_checked(course):
    lab = labs.read_lab(course / "00_mini.ipynb")
    with pytest.raises(TypeError, match="nb must be"):
        submission.grade_notebook("nb.ipynb", lab)
    with pytest.raises(TypeError, match="lab must be"):
        submission.grade_notebook({}, "00_mini")
    with pytest.raises(ValueError, match="cell_timeout must be"):
        submission.grade_notebook({}, lab, cell_timeout=0)


def test_isolation_is_a_command_prefix():
    prefix = submission.isolation()
    assert prefix == () or (prefix[0].endswith("unshare") and "--net" in prefix)
    assert str(Verdict("PASS")) == "PASS" and str(Verdict("FAIL", "why")) == "FAIL: why"
