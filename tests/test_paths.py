"""labkit.paths points at the repository's own folders and files."""
from labkit import paths


def test_paths_exist():
    assert (paths.ROOT / "pyproject.toml").is_file()
    assert paths.NOTEBOOKS.is_dir() and any(paths.NOTEBOOKS.glob("00_*.ipynb"))
    assert paths.HARDWARE_JSON.is_file()
    assert (paths.TINYLM_CHECKPOINT / "config.json").is_file()
    assert (paths.TINYLM_CHECKPOINT / "model.safetensors").is_file()
    assert paths.DATA == paths.ROOT / "data"
