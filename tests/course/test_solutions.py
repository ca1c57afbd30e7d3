"""Every instructor solution passes its check and prints what the instructor notebook stores ("[PASS] ..."),
compared by nbval's rules (tests/notebook_outputs.py). The browser test runs the student notebooks, whose
exercises are stubs, against the same stored outputs; the solutions run here instead, in one kernel: for each lab,
a clean namespace (%reset), every top-level import of its notebook, then its solution and check cells in notebook
order (8 s, not the labs' 10 minutes). What this leaves out, later cells computing with the instructor's solution
instead of the reference, is checked where the whole instructor notebooks run: nbval in `make test-portable` (CI)
and `make test-nbval`."""
import ast

import nbformat
import pytest

from labkit.course import classroom, labs
from tests.notebook_outputs import VERDICT, compared, difference

NOTEBOOKS = sorted(classroom.NOTEBOOKS.glob("*.ipynb"))


def _imports(source: str) -> list[str]:
    """A cell's top-level import statements, as code (IPython's %magics translated first, as labkit.course.labs
    reads a cell)."""
    tree = labs._parse(source)
    return [] if tree is None else [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def solution_run(paths) -> tuple[nbformat.NotebookNode, list[tuple[str, int]]]:
    """A notebook of each lab's imports, solution cells and check cells, and (lab, instructor cell index) for each
    of its cells (-1: the imports)."""
    nb, where = nbformat.v4.new_notebook(), []
    for path in paths:
        stored = nbformat.read(path, as_version=4)
        checks = {cell.code for cell in labs.read_lab(path).cells}
        code = [(i, c) for i, c in enumerate(stored.cells) if c.cell_type == "code"]
        imports = [s for _, c in code for s in _imports(c.source)]
        nb.cells.append(nbformat.v4.new_code_cell("\n".join(["%reset -f", *imports])))
        where.append((path.stem, -1))
        for i, cell in code:
            if classroom.BEGIN in cell.source or labs.cell_code(cell.source) in checks:
                nb.cells.append(nbformat.v4.new_code_cell(cell.source))
                where.append((path.stem, i))
    return nb, where


def execute(nb, where):
    """Run the notebook; an error names the lab and the instructor cell (numbered from 1) it came from."""
    from nbclient.exceptions import CellExecutionError

    try:
        classroom.execute(nb)
    except CellExecutionError as e:
        failed = next(n for n, cell in enumerate(nb.cells) if any(o.output_type == "error" for o in cell.outputs))
        lab, i = where[failed]
        at = "its imports" if i < 0 else f"cell {i + 1}"
        raise AssertionError(f"{lab}.ipynb, {at}: {e.ename}: {e.evalue} (only the notebook's top-level imports ran "
                             f"before its solution and check cells)") from None


@pytest.fixture(scope="module")
def ran():
    nb, where = solution_run(NOTEBOOKS)
    execute(nb, where)
    return {key: cell for key, cell in zip(where, nb.cells)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_solution_passes_its_check_as_stored(ran, path):
    stored = nbformat.read(path, as_version=4)
    cells = {i: cell for (lab, i), cell in ran.items() if lab == path.stem and i >= 0}
    n_checks = sum(len(c.checks) for c in labs.read_lab(path).cells)
    assert len(cells) >= 2 * n_checks > 0, f"{path.name}: {len(cells)} cells run for {n_checks} checks"
    for i, cell in cells.items():
        assert compared(stored.cells[i]), f"{path.name} cell {i + 1}: a solution or check cell nbval does not compare"
        why = difference(stored.cells[i].outputs, cell.outputs)
        assert why is None, f"{path.name} cell {i + 1}: {why}"
    verdicts = [line for i in cells for o in stored.cells[i].outputs if o.output_type == "stream"
                for line in o.text.splitlines() if VERDICT.match(line)]
    assert len(verdicts) == n_checks and all(v.startswith("[PASS] ") for v in verdicts), verdicts


def test_a_wrong_solution_is_caught(tmp_path):
    """The same run with one solution changed: its check cell prints [FAIL] where [PASS] is stored."""
    path = classroom.NOTEBOOKS / "09_finetune.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "def lora_qkv_forward" in c.source)
    cell.source = cell.source.replace("(alpha / A.shape[0])", "alpha")
    assert "* alpha\n" in cell.source
    nbformat.write(nb, tmp_path / path.name)
    run, where = solution_run([tmp_path / path.name])
    execute(run, where)
    found = {i: difference(nb.cells[i].outputs, c.outputs) for (_, i), c in zip(where, run.cells) if i >= 0}
    wrong = {i: why for i, why in found.items() if why}
    assert len(wrong) == 1 and "[FAIL] lora_qkv_forward" in next(iter(wrong.values())), found


def test_a_solution_that_needs_more_than_the_imports_is_named(tmp_path):
    nb = nbformat.read(classroom.NOTEBOOKS / "05_kv_cache.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "def new_blocks" in c.source)
    cell.source = cell.source.replace("    ### END SOLUTION", "    ### END SOLUTION\n\n\nnew_blocks(SIZE, 0, 0, 16)")
    nbformat.write(nb, tmp_path / "05_kv_cache.ipynb")
    with pytest.raises(AssertionError, match=rf"05_kv_cache.ipynb, cell {nb.cells.index(cell) + 1}: NameError: "
                                             r"name 'SIZE' is not defined \(only the notebook's top-level imports"):
        execute(*solution_run([tmp_path / "05_kv_cache.ipynb"]))
