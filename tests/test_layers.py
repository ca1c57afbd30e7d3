"""labkit's imports only go down the course (ast, no import needed): no cycles, no upward imports, no module
importing its own package's face, and other packages reached through their faces only."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "labkit"
# Lower rank = lower layer. Bottom: helpers (jit above _checks, which it uses), then the course machinery, the
# model, the presets; then the labs in course order. day0 (the capstone), cluster (lab 08) and finetune (lab 09)
# may import any earlier lab, through its face.
RANK = {"__init__": 0, "_checks": 0, "paths": 0, "rng": 0, "jit": 1, "course": 1, "tinylm": 2, "specs": 3,
        "memory_wall": 10, "unified_memory": 20, "quant": 30, "parallel": 40, "kv_cache": 50, "serving": 60,
        "day0": 70, "cluster": 80, "finetune": 90}
HELPERS = {"__init__", "_checks", "paths", "rng", "jit"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(absolute module imported, line, the module named in the import statement) for every import in the
    file, lazy ones included. `from ..course import timing` imports labkit.course.timing, through the face
    labkit.course: the third field says which module the statement names."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, a.name) for a in node.names if a.name.startswith("labkit")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("labkit"):
                continue
            folder = root.parent / Path(*target.split("."))
            for a in node.names:  # `from package import x`: x may be a module of that package
                sub = folder / a.name
                is_module = folder.is_dir() and (sub.with_suffix(".py").exists() or sub.is_dir())
                named = f"{target}.{a.name}" if sub.is_dir() else target  # `from .. import specs`: the face
                out.append((f"{target}.{a.name}" if is_module else target, node.lineno, named))
    return out


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with one file's imports (empty when nothing is)."""
    me = module_name(path, root)
    mine = top(me)
    if mine not in RANK:
        return [f"labkit/{mine} has no layer in tests/test_layers.py: add it to RANK"]
    out = []
    for target, line, named in imports(path, root):
        theirs = top(target)
        where = f"{path.relative_to(root.parent)}:{line} imports {target}"
        if theirs == mine:
            if mine not in HELPERS and path.name != "__init__.py" and named == f"labkit.{mine}" and target == named:
                out.append(f"{where}: a module never imports its own package's face")
        elif theirs not in RANK:
            out.append(f"{where}: unknown package")
        elif RANK[theirs] >= RANK[mine]:
            out.append(f"{where}: an upward import")
        elif theirs not in HELPERS and named != f"labkit.{theirs}":
            out.append(f"{where}: import another package through its face, labkit.{theirs}")
    return out


def find_cycle(files: list[Path], root: Path = ROOT) -> list[str] | None:
    graph = {module_name(p, root): {t for t, _, _ in imports(p, root)} for p in files}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m] & graph.keys()):
            if state.get(t) == 1:
                return stack + [m, t]
            if t not in state and (found := visit(t, stack + [m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [])):
            return found
    return None


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_imports_only_go_down(path):
    assert not problems(path)


def test_no_import_cycles():
    cycle = find_cycle(FILES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_cycle_an_upward_import_and_a_face_import(tmp_path):
    """The rules above can fail: a fake labkit with each fault is caught."""
    fake = tmp_path / "labkit"
    (fake / "tinylm").mkdir(parents=True)
    (fake / "quant").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "tinylm" / "__init__.py").write_text("from .a import x\n")
    (fake / "tinylm" / "a.py").write_text("from .b import y\nfrom ..quant import z\n")
    (fake / "tinylm" / "b.py").write_text("from .a import x\nfrom . import a\nfrom labkit.tinylm import q\n")
    (fake / "quant" / "__init__.py").write_text("")
    (fake / "quant" / "c.py").write_text("def f():\n    from ..tinylm.a import x\n")
    (fake / "quant" / "d.py").write_text("from ..tinylm import a\n")  # a module, reached through the face
    (fake / "day0").mkdir()
    (fake / "day0" / "__init__.py").write_text("")
    (fake / "day0" / "e.py").write_text("from ..quant import d\nfrom ..quant.c import f\n")  # any lab, by its face
    assert any("upward import" in p for p in problems(fake / "tinylm" / "a.py", fake))
    assert any("its own package's face" in p for p in problems(fake / "tinylm" / "b.py", fake))
    assert any("through its face" in p for p in problems(fake / "quant" / "c.py", fake))
    assert problems(fake / "quant" / "d.py", fake) == []
    assert [p.split(": ", 1)[1] for p in problems(fake / "day0" / "e.py", fake)] == \
        ["import another package through its face, labkit.quant"]
    assert find_cycle(sorted(fake.rglob("*.py")), fake) is not None
    (fake / "tinylm" / "b.py").write_text("y = 1\n")
    assert find_cycle(sorted(fake.rglob("*.py")), fake) is None
