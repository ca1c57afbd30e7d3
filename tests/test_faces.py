"""Each package's face (its __init__.py) exports what the notebooks, the other packages, the benchmarks and the
README use through it, and nothing else (ast and json, nothing imported to scan). Tests import from the modules."""
import ast
import importlib
import json
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FACES = sorted(p.parent.name for p in (ROOT / "labkit").glob("*/__init__.py"))


def notebook_sources() -> list[tuple[str, str]]:
    """(name, code) for every notebook's code cells; IPython's magics and shell lines blanked."""
    out = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out.append((path.name, re.sub(r"^\s*[%!].*$", "", code, flags=re.M)))
    return out


def python_sources() -> list[tuple[str, str, str | None]]:
    """(name, code, the labkit package it belongs to or None) for notebooks, labkit and benchmarks."""
    out = [(name, code, None) for name, code in notebook_sources()]
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        rel = path.relative_to(ROOT / "labkit")
        out.append((str(path.relative_to(ROOT)), path.read_text(), rel.parts[0] if len(rel.parts) > 1 else None))
    out += [(str(p.relative_to(ROOT)), p.read_text(), None) for p in sorted((ROOT / "benchmarks").glob("*.py"))]
    return out


def uses(code: str, package: str | None) -> dict[str, set[str]]:
    """{face: names used through it} in one file: `from labkit.f import x`, `from ..f import x` (in labkit),
    and `f.x` / `labkit.f.x` / `alias.x` where the name is bound to the face."""
    found: dict[str, set[str]] = {}
    bound: dict[str, str] = {}  # local name -> face, or "labkit" for the top package
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] != "labkit":
                    continue
                if a.asname:
                    if len(parts) == 2:
                        bound[a.asname] = parts[1]
                    elif len(parts) > 2:
                        found.setdefault(parts[1], set()).add(parts[2])
                else:
                    bound["labkit"] = "labkit"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                base = ["labkit", package][:3 - node.level]
                parts = base + (node.module.split(".") if node.module else [])
            else:
                parts = (node.module or "").split(".")
            if parts[0] != "labkit":
                continue
            if len(parts) == 1:
                for a in node.names:
                    bound[a.asname or a.name] = a.name
            elif len(parts) == 2 and parts[1] != package:
                found.setdefault(parts[1], set()).update(a.name for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if bound[node.value.id] != "labkit" and bound[node.value.id] != package:
                found.setdefault(bound[node.value.id], set()).add(node.attr)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and isinstance(node.value.value, ast.Name) and bound.get(node.value.value.id) == "labkit"):
            found.setdefault(node.value.attr, set()).add(node.attr)
    return found


def prose() -> str:
    """The README and the notebooks' text cells: `labkit.face.name` there names a name to find in the face."""
    cells = [c for p in sorted((ROOT / "notebooks").glob("*.ipynb")) for c in json.loads(p.read_text())["cells"]]
    return "\n".join([(ROOT / "README.md").read_text()] + ["".join(c["source"]) for c in cells
                                                         if c["cell_type"] == "markdown"])


def used_through_faces() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {face: set() for face in FACES}
    for _, code, package in python_sources():
        for face, names in uses(code, package).items():
            used.setdefault(face, set()).update(names)
    for face, name in re.findall(r"\blabkit\.(\w+)\.(\w+)", prose()):
        used.setdefault(face, set()).add(name)
    return used


USED = used_through_faces()


@pytest.mark.parametrize("face", FACES)
def test_a_face_exports_only_what_is_used_through_it(face):
    module = importlib.import_module(f"labkit.{face}")
    unused = sorted(set(module.__all__) - USED[face])
    assert not unused, f"labkit.{face} exports {unused}, which nothing uses through it: drop them from its face"


@pytest.mark.parametrize("face", FACES)
def test_a_face_binds_what_it_lists(face):
    """Every public name the face binds (modules aside: importing one binds it) is in __all__, and back."""
    module = importlib.import_module(f"labkit.{face}")
    public = {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    listed = {n for n in module.__all__ if not isinstance(getattr(module, n), types.ModuleType)}
    assert public == listed
    assert len(module.__all__) == len(set(module.__all__))


def test_the_scan_sees_each_way_through_a_face():
    code = ("import labkit\nimport labkit.quant as q\nfrom labkit import parallel as par\n"
            "from labkit.serving import Engine\nfrom ..tinylm import generate\nfrom .. import specs\n"
            "from .arena import Arena\nfrom labkit.day0.arena import plan_arena\n"
            "labkit.kv_cache.BlockManager\nq.quantize\npar.plan\nspecs.model\n")
    assert uses(code, "day0") == {"quant": {"quantize"}, "parallel": {"plan"}, "serving": {"Engine"},
                                  "tinylm": {"generate"}, "specs": {"model"}, "kv_cache": {"BlockManager"}}
