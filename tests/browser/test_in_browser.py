"""Every student notebook in JupyterLab in a real browser (headless Chromium): all cells run without an error,
every widget renders, moving one control of each interactive widget changes its output, and every output that
nbval compares equals the instructor notebook's stored one (tests/notebook_outputs.py: `make test` runs each
notebook once, here, and nbval only when there is no browser). Screenshots go to the test's temporary folder
(printed on failure). `make test-browser` runs this; without Chromium or playwright it is skipped, or fails when
LABKIT_BROWSER_REQUIRED=1 (make test-browser, CI)."""
import copy
import json
import os
import runpy
import signal
import time

import nbformat
import pytest

from labkit.course import classroom, labs

from tests.notebook_outputs import student_run_differences

from . import lab as browser_lab
from .notebook import expected_interactive, run_notebook

# longest first, by nbval's figures (notebooks/conftest.py): `make test-browser` runs them on one worker per core
SECONDS = runpy.run_path(str(classroom.NOTEBOOKS / "conftest.py"))["SECONDS"]
NOTEBOOKS = sorted(classroom.NOTEBOOKS.glob("*.ipynb"), key=lambda p: (-SECONDS.get(p.stem, 0), p.name))
BUDGET_S = float(os.environ.get("LABKIT_BROWSER_BUDGET_S", 2700))  # one worker's share of the module, a hard cap
NOTEBOOK_S = float(os.environ.get("LABKIT_BROWSER_NOTEBOOK_S", 600))  # one notebook, a slow machine's worst

SELFTEST = [
    "import ipywidgets as w",
    "w.interactive(lambda n: print('n =', n), n=w.IntSlider(value=3, min=0, max=10))",
    "def pick(k):\n    if k != 'a':\n        raise ValueError('bad choice')\n    print(k)\n\n\n"
    "w.interactive(pick, k=w.Dropdown(options=['a', 'b']))",
    "w.interactive(lambda on: print('always the same'), on=w.Checkbox(value=False))",
    "print('seven', 7)",
    "1 / 0",
    "print('never run')",
]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    why = browser_lab.missing()
    if why:
        (pytest.fail if os.environ.get("LABKIT_BROWSER_REQUIRED") == "1" else pytest.skip)(
            f"browser test not run: {why}")
    root = tmp_path_factory.mktemp("browser")
    classroom.write_student_notebooks(root / "student")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in SELFTEST]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "student" / "selftest.ipynb")
    (root / "screenshots").mkdir()
    # a SIGTERM (CI's timeout, a kill) unwinds like Ctrl-C, so the server, its kernels and Chromium are stopped
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    with browser_lab.jupyter_lab(root / "student", root / "home") as lab, browser_lab.chromium() as browser:
        yield {"lab": lab, "browser": browser, "shots": root / "screenshots", "deadline": time.monotonic() + BUDGET_S}
    signal.signal(signal.SIGTERM, previous)


def _run(session, name, timeout_s=NOTEBOOK_S, change_s=None):
    left = session["deadline"] - time.monotonic()
    assert left > 30, f"the browser test ran past its {BUDGET_S:g} s budget"
    shot = session["shots"] / f"{name.removesuffix('.ipynb')}.png"
    print(f"screenshot of {name}: {shot}")  # shown when the test fails
    return run_notebook(session["browser"], session["lab"], name, shot, min(timeout_s, left), change_s), shot


def test_the_kernels_share_the_cores_among_the_workers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert browser_lab.kernel_threads() == {"OMP_NUM_THREADS": "2"}
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert browser_lab.kernel_threads() == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert browser_lab.kernel_threads() == {}
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert browser_lab.kernel_threads() == {}  # the caller's own setting wins


def test_the_browser_test_sees_errors_and_unresponsive_widgets(session):
    found, shot = _run(session, "selftest.ipynb", change_s=5)
    assert found.cells == 7 and found.unrun == [7], found
    assert found.interactive == 3 and found.widgets >= 3, found
    assert any("ZeroDivisionError" in e for e in found.errors), found.errors
    assert any("bad choice" in e for e in found.errors), found.errors
    assert len(found.unchanged) == 1 and found.unchanged[0].startswith("widget 3: checkbox clicked"), found
    assert shot.stat().st_size > 0
    # the comparison with stored outputs, on what JupyterLab saved: none against a copy, a planted digit seen
    stored = session["shots"].parent / "stored.ipynb"
    stored.write_text(json.dumps(found.saved))
    assert student_run_differences(stored, found.saved) == (6, [])
    planted = copy.deepcopy(found.saved)
    cell = next(c for c in planted["cells"] if "seven" in "".join(c["source"]))
    assert "".join(cell["outputs"][0]["text"]) == "seven 7\n", cell
    cell["outputs"][0]["text"] = "seven 8\n"
    stored.write_text(json.dumps(planted))
    compared, differences = student_run_differences(stored, found.saved)
    assert compared == 6 and len(differences) == 1 and differences[0].startswith("cell 5 ("), differences
    assert "'stdout' differs: line 1:\nstored:   'seven 8'\nthis run: 'seven 7'" in differences[0], differences


@pytest.mark.timeout(NOTEBOOK_S + 120)  # pytest-timeout's 300 s would end the run before NOTEBOOK_S does
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_notebook_in_the_browser(session, path):
    found, shot = _run(session, path.name)
    where = f"{path.name} ({found.seconds:.0f} s; screenshot {shot})"
    assert found.cells and not found.unrun, f"{where}: cells not run {found.unrun}: an earlier cell stopped Run All"
    assert not found.errors, f"{where}: {found.errors}"
    expected = expected_interactive(json.loads(path.read_text()))
    assert found.interactive == expected, f"{where}: {found.interactive} interactive widgets, expected {expected}"
    assert not found.unchanged, f"{where}: {found.unchanged}"
    # the handed-out notebook's checks all say "not written yet" (the grader's kind of check, on every lab)
    exercises = labs.read_lab(path).exercises
    assert [v.split()[0] for v in found.verdicts] == ["[TODO]"] * len(exercises) and exercises, \
        f"{where}: verdicts {found.verdicts}, expected [TODO] for each of {list(exercises)}"
    # nbval's comparison, on the student run: every stored output but the solutions' (tests/course/test_solutions.py)
    compared, differences = student_run_differences(path, found.saved)
    assert compared and not differences, \
        f"{where}: {len(differences)} of {compared} compared cells differ from the stored outputs:\n" + \
        "\n".join(differences)
    assert shot.stat().st_size > 0
