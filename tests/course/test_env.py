import labkit
from labkit.course import env


def test_environment_table_marks_each_package():
    rows = env.check_environment()
    names = {r["package"] for r in rows}
    assert {"python", "torch", "numpy", "jupyterlab", "nbval", "safetensors"} <= names
    table = env.environment_table(rows)
    assert all(r["package"] in table for r in rows)
    fake = [{"package": "torch", "required": "==9.9", "installed": "2.13.0", "ok": False},
            {"package": "tqdm", "required": "==1", "installed": None, "ok": False}]
    text = env.environment_table(fake)
    assert "[FAIL] torch" in text and "missing" in text


def test_this_environment_is_the_pinned_one():
    bad = [r for r in env.check_environment() if not r["ok"]]
    assert not bad, f"run `make test` from a clean clone; these differ from pyproject.toml: {bad}"


def test_machine_info():
    info = env.machine_info()
    assert info["cpu_cores"] >= 1 and info["torch_threads"] >= 1
    assert info["memory_bytes"] is None or info["memory_bytes"] > 2**28


def test_setup_checks_version(capsys):
    env.setup(min_version="0.1.0", seed=0, threads=None)
    assert capsys.readouterr().out.strip() == f"labkit {labkit.__version__} ready; seed 0"
    import pytest
    with pytest.raises(RuntimeError, match="needs labkit >= 99.0.0"):
        env.setup(min_version="99.0.0")
    with pytest.raises(ValueError, match="min_version must be a version string"):
        env.setup(min_version="latest")
    with pytest.raises(ValueError, match="seed must be an int in \\[0, 4294967295\\], got -1"):
        env.setup(seed=-1)


def test_show_prints_the_reference_source(capsys):
    labkit.show(env.total_memory_bytes)
    out = capsys.readouterr().out
    assert out.startswith("def total_memory_bytes() -> int | None:") and "SC_PHYS_PAGES" in out


def test_setup_sets_one_torch_thread_by_default():
    import pytest
    import torch
    before = torch.get_num_threads()
    try:
        env.setup()
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        env.setup(threads=None)
        assert torch.get_num_threads() == before
        with pytest.raises(ValueError, match=r"threads must be an int in \[1, \d+\] \(torch threads: .*got 0"):
            env.setup(threads=0)
        with pytest.raises(ValueError, match="threads must be an int in .*got 100000"):
            env.setup(threads=100_000)
        with pytest.raises(TypeError, match="threads must be an int in .*got 1.5"):
            env.setup(threads=1.5)
        assert torch.get_num_threads() == before  # a refused call changes nothing
    finally:
        torch.set_num_threads(before)
