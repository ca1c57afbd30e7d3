"""The repository keeps its promises: layout, pins, the two commands."""
import re
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def pyproject_dependencies() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: read what pip installed from pyproject.toml
        from importlib.metadata import requires
        return [r for r in requires("labkit") if "extra ==" not in r]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def pyproject_pins(python_version: str) -> dict[str, str]:
    deps = pyproject_dependencies()
    pins = {}
    for line in deps:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python_version}):
            pins[req.name] = str(req.specifier)
    return pins


def environment_yml() -> tuple[str, dict[str, str]]:
    text = (ROOT / "environment.yml").read_text()
    python = re.search(r"^\s*- python=(\d+\.\d+)\s*$", text, re.M).group(1)
    pins = dict(re.findall(r"^\s+- ([A-Za-z0-9_.-]+)(==[^\s#]+)\s*$", text, re.M))
    return python, pins


def test_environment_yml_agrees_with_pyproject():
    python, pins = environment_yml()
    assert pins == pyproject_pins(python)


def test_every_dependency_is_pinned_exactly():
    for version in ("3.10", "3.11", "3.12", "3.13"):
        pins = pyproject_pins(version)
        assert pins["torch"] == "==2.13.0"
        assert all(spec.startswith("==") for spec in pins.values()), pins
        assert {"jupyterlab", "torch", "numpy", "matplotlib", "nbval", "ipywidgets", "safetensors", "tqdm",
                "pytest", "hypothesis"} <= set(pins)


def test_layout():
    for name in ("notebooks", "labkit", "data", "tests", "benchmarks", "environment.yml", "pyproject.toml",
                 "README.md", "Makefile", "CHANGELOG.md", ".ci/run", "benchmarks/RESULTS.md", "data/README.md"):
        assert (ROOT / name).exists(), name


def test_tests_mirror_labkit():
    """labkit/<package>/<module>.py is tested in tests/<package>/test_<module>.py, at every depth."""
    missing = []
    for module in (ROOT / "labkit").rglob("*.py"):
        if module.name in ("__init__.py", "__main__.py"):
            continue
        rel = module.relative_to(ROOT / "labkit")
        if not (ROOT / "tests" / rel.parent / f"test_{rel.name}").exists():
            missing.append(f"labkit/{rel} (tests/{rel.parent / ('test_' + rel.name)})")
    assert not missing, "no tests for " + ", ".join(sorted(missing))


def test_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci/run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_the_peers_extra_is_pinned_and_kept_out_of_the_default_install():
    """`make peers` (llama.cpp, compiled from source) is opt-in: its pins are exact, none is a default
    dependency, and neither `make test` nor `make lab` installs it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    peers = [Requirement(r) for r in project["optional-dependencies"]["peers"]]
    assert all(str(r.specifier).startswith("==") for r in peers), peers
    assert "llama-cpp-python" in {r.name for r in peers}
    assert not {r.name for r in peers} & {Requirement(r).name for r in project["dependencies"]}
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'^peers: .*\n(\t.*\\\n)*\t.*pip install .*"\.\[peers\]"', makefile, re.M)
    assert "[peers]" not in makefile.split("\npeers:")[0]  # lab, test and the venv do not install it
