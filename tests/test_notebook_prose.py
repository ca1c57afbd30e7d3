"""Numbers in a notebook's prose agree with its run (README, "Writing a lab": the rule for numbers in prose).

A measured value is never written in markdown: the cell that measures it prints it, with its verdict. So every
ratio ("1.3x") and percentage in a notebook's markdown must be one of:
  - printed by a compared cell of the same notebook (an analytic figure, the same on every machine);
  - part of a derivation written out in the sentence ("3/9 = 33%");
  - a published figure, its source named in the same sentence (authors and year, a title, a link, a spec sheet);
  - a value the notebook's code sets (a parameter the learner can see, e.g. `share=0.6` shown as 60%);
  - listed in STATED below, with the reason it is a constant of the text and not a measurement.
"""
import json
import re
from pathlib import Path

import nbformat
import pytest

from .notebook_outputs import compared

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# a ratio or a percentage, not the right side of a derivation written in the sentence
FIGURE = re.compile(r"(?<!= )(?<![\w.=])(\d+(?:[.,]\d+)*)\s?(x|%)(?!\w)")
CITED = re.compile(r"et al\.|\b(19|20)\d\d\b|\]\(https?://|https?://|\bspec(ification|s)?\b|datasheet|\bpaper\b"
                   r"|\"Hardware Challenges|\"Trillion-Parameter|documentation|\bdocs\b", re.I)
SENTENCES = re.compile(r"\n\s*\n|(?<=[.!?])\s+(?=[A-Z*(`])")

# (notebook, figure as written) -> why it is a constant of the text rather than a measured value
STATED: dict[tuple[str, str], str] = {
}


def _text(cells) -> str:
    out = []
    for c in cells:
        for o in c.get("outputs", []):
            data = o.get("data", {})
            out.append("".join(o.get("text", "")) + "".join(data.get("text/plain", ""))
                       + "".join(data.get("text/markdown", "")) + "".join(data.get("text/html", "")))
    return "\n".join(out)


def _has(text: str, number: str, unit: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(number)}\s?{re.escape(unit)}", text) is not None


def unsupported(path: Path) -> list[str]:
    """The figures of `path`'s markdown that nothing in the rule supports, as 'cell N: figure | sentence'."""
    nb = nbformat.read(path, as_version=4)
    printed = _text([c for c in nb.cells if c.cell_type == "code" and compared(c)])
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in SENTENCES.split(cell.source):
            for m in FIGURE.finditer(sentence):
                number, unit = m.groups()
                if (_has(printed, number, unit) or _has(code, number, unit) or CITED.search(sentence)
                        or (path.name, m.group(0)) in STATED):
                    continue
                found.append(f"cell {i + 1}: {m.group(0)} | {' '.join(sentence.split())[:160]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_figure_in_the_prose_is_printed_derived_cited_or_stated(path):
    found = unsupported(path)
    assert not found, (f"{path.name}: figures in the prose that no compared output prints, no source is named for "
                       f"and STATED does not list (print them from the run, or cite them):\n  " + "\n  ".join(found))


def test_the_rule_catches_a_measured_figure_in_the_prose(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(f'{131 / 100}x')",
                                          outputs=[nbformat.v4.new_output("stream", text="1.31x\n")]),
                nbformat.v4.new_code_cell("print('2.0x')", outputs=[nbformat.v4.new_output("stream", text="2.0x\n")]),
                nbformat.v4.new_markdown_cell("Overlap gains 1.31x here. The analytic bound is 2.0x. "
                                              "Dao et al. 2022 report 7.6x. So 3/9 = 33% of the time.")]
    path = tmp_path / "99_probe.ipynb"
    path.write_text(json.dumps(nb))
    assert [f.split(" | ")[0] for f in unsupported(path)] == ["cell 3: 1.31x"]
