"""Notebook 00's exercise, defined once: the check cell and tests/tinylm/test_exercises.py both use it."""

from __future__ import annotations

from ..course import Exercise
from .config import TinyLMConfig, param_counts, random_config

COUNT_PARAMS = Exercise(
    "count_params", param_counts,
    cases=[(TinyLMConfig(),), (TinyLMConfig(tie_embeddings=False),),
           (TinyLMConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=11008,
                         tie_embeddings=False),)],
    random_case=lambda rng: (random_config(rng),))

EXERCISES = [COUNT_PARAMS]
