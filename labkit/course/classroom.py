"""Student notebooks from the instructor notebooks (nbgrader's solution markers).

    python -m labkit.course.classroom student OUT_DIR [--notebooks notebooks]

In every code cell, the lines between `### BEGIN SOLUTION` and `### END SOLUTION` (markers included)
become one stub at the marker's indentation:

    def count_params(cfg):                  def count_params(cfg):
        ### BEGIN SOLUTION          ->          raise NotImplementedError("exercise: write this part")
        d = cfg.d_model
        ...
        ### END SOLUTION

and every output is cleared. The check cell after an exercise then reports "not implemented yet" and
the notebook goes on with the reference implementation (labkit.course.check).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from ..paths import NOTEBOOKS

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("exercise: write this part")'


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
    """A copy of notebook `nb` (nbformat 4 JSON as a dict) with solutions stubbed and outputs cleared."""
    if not isinstance(nb, dict) or "cells" not in nb:
        raise ValueError(f"nb must be a notebook dict with 'cells', got {type(nb).__name__}")
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell.get("cell_type") != "code":
            if BEGIN in source or END in source:
                raise ValueError(f"{name}, cell {i}: solution markers belong in code cells only")
            continue
        cell["source"], _ = strip_solutions(source, f"{name}, cell {i}")
        cell["outputs"], cell["execution_count"] = [], None
    return nb


def read_notebook(path: Path) -> dict:
    """A notebook file as a dict; a clear error naming the file when it is not notebook JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable notebook (JSON): {e}") from None


def execute(nb, cwd: Path = NOTEBOOKS, timeout: int = 300):
    """Run a notebook (an nbformat NotebookNode) top to bottom in a fresh kernel of *this* Python, as nbval's
    --nbval-current-env does; fills in its outputs and returns it. Raises on the first failing cell."""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def write_student_notebooks(out_dir: Path, notebooks: Path = NOTEBOOKS) -> list[Path]:
    """Write a student version of every notebooks/*.ipynb into `out_dir`; returns the paths written."""
    notebooks, out_dir = Path(notebooks), Path(out_dir)
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {notebooks}")
    converted = {p: student_notebook(read_notebook(p), p.name) for p in sources}  # all or nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src, nb in converted.items():
        dst = out_dir / src.name
        dst.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        written.append(dst)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.course.classroom")
    sub = parser.add_subparsers(dest="command", required=True)
    student = sub.add_parser("student", help="write student notebooks (solutions stubbed, outputs cleared)")
    student.add_argument("out_dir", type=Path)
    student.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="instructor notebooks folder")
    args = parser.parse_args(argv)
    if args.out_dir.resolve() == args.notebooks.resolve():
        parser.error("out_dir must differ from the instructor notebooks folder")
    for path in write_student_notebooks(args.out_dir, args.notebooks):
        print(path)


if __name__ == "__main__":
    main()
