"""tests/notebook_outputs.py against nbval itself: a planted notebook whose stored outputs differ from a fresh run
in ways nbval must see and ways it must forgive; `pytest --nbval` and the module must fail the same cells."""
import os
import re
import subprocess
import sys

import nbformat
import pytest

from labkit.course import classroom
from tests.notebook_outputs import VERDICT, compared, difference

OUT = nbformat.v4.new_output
STREAM = lambda text, name="stdout": OUT("stream", name=name, text=text)  # noqa: E731
# (code, stored outputs, whether nbval fails the cell)
PLANTED = [
    ('print("a")\nprint("b")', [STREAM("a\n"), STREAM("b\n")], False),          # streams coalesced
    ("print(1.2345678)", [STREAM("1.2345679\n")], True),                        # one digit off
    ("print(hex(id(object())))", [STREAM("0x7f00deadbeef\n")], False),         # sanitized address
    ('import sys\nprint("w", file=sys.stderr)\nprint(1)', [STREAM("1\n")], True),  # an extra stderr
    ("# NBVAL_IGNORE_OUTPUT\nprint(3)", [STREAM("4\n")], False),               # ignored
    ('display({"image/png": "AAAA", "text/plain": "<img>"}, raw=True)',        # images are not compared
     [OUT("display_data", data={"image/png": "BBBB", "text/plain": "<img>"})], False),
    ('print("x\\r", end="")\nprint("y")', [STREAM("y\n")], False),              # \r applied
    ("1 + 1", [OUT("execute_result", data={"text/plain": "3"}, execution_count=1)], True),
    ("print(2)", [STREAM("2\n"), STREAM("2\n", "stderr")], True),               # a missing stderr
    ('print("[PASS] f matches")\nprint(5)', [STREAM("[TODO] f: not yet\n5\n")], True),  # verdicts compared
    ("x = 1", [], False),
]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("planted")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for n, (code, outputs, _) in enumerate(PLANTED, 1):
        nb.cells.append(nbformat.v4.new_code_cell(code, outputs=outputs, execution_count=n))
    nbformat.write(nb, folder / "planted.ipynb")
    return folder / "planted.ipynb"


def test_the_module_fails_the_cells_nbval_fails(planted):
    nbval = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(planted.parent),
         "-c", os.devnull, "--nbval", "--nbval-current-env", "--nbval-sanitize-with",
         str(classroom.NOTEBOOKS / "nbval_sanitize.cfg"), str(planted), "-q", "-rf"],
        capture_output=True, text=True, timeout=240, cwd=planted.parent)
    by_nbval = {int(n) for n in re.findall(r"planted\.ipynb::Cell (\d+)", nbval.stdout)}
    assert nbval.returncode == 1 and by_nbval, nbval.stdout[-3000:]
    stored = nbformat.read(planted, as_version=4)
    fresh = classroom.execute(nbformat.read(planted, as_version=4), cwd=planted.parent)
    by_module = {n for n, (a, b) in enumerate(zip(stored.cells, fresh.cells))
                 if compared(a) and difference(a.outputs, b.outputs)}
    assert by_module == by_nbval == {n for n, (_, _, fails) in enumerate(PLANTED) if fails}


def test_verdict_lines_can_be_dropped():
    stored, fresh = [STREAM("[PASS] f matches\n5\n")], [STREAM("[TODO] f: not yet\n5\n")]
    assert difference(stored, fresh) and difference(stored, fresh, VERDICT) is None
    assert difference(stored, [STREAM("[TODO] f: not yet\n6\n")], VERDICT)


def test_cells_a_run_all_cannot_honour_are_refused():
    for marker in ("NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION"):
        with pytest.raises(ValueError, match="only NBVAL_IGNORE_OUTPUT and NBVAL_CHECK_OUTPUT"):
            compared(nbformat.v4.new_code_cell(f"# {marker}\n1 / 0", execution_count=1))
    assert not compared(nbformat.v4.new_code_cell("1", execution_count=None))  # never run: nothing stored


def test_a_missing_or_extra_field_is_shown():
    why = difference([STREAM("1\n")], [STREAM("a warning\n", "stderr"), STREAM("1\n")])
    assert why == "output fields differ: stderr only in this run: 'a warning\\n'", why


def test_a_stored_carriage_return_is_refused():
    cell = nbformat.v4.new_code_cell("print('x\\r', end='')", execution_count=1, outputs=[STREAM("x\ry\n")])
    with pytest.raises(ValueError, match="carriage return or a backspace"):
        compared(cell)
