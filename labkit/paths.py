"""Where the course's files are: the repository root, data/ (model releases, spec sheets) and notebooks/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
NOTEBOOKS = ROOT / "notebooks"
TINYLM_CHECKPOINT = DATA / "tinylm"          # the release folder: Hugging Face Llama layout (labkit.tinylm.checkpoint)
HARDWARE_JSON = DATA / "hardware.json"       # spec-sheet devices and links, each with its source
