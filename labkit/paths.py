"""Where the course's files are: the repository root, data/ (checkpoints, spec sheets) and notebooks/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
NOTEBOOKS = ROOT / "notebooks"
TINYLM_CHECKPOINT = DATA / "tinylm"          # tinylm.safetensors (weights) + tinylm.json (config, SHA-256)
HARDWARE_JSON = DATA / "hardware.json"       # spec-sheet devices and links, each with its source
