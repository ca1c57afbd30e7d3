"""Notebook 00's exercise, defined once: the check cell and tests/tinylm/test_exercises.py both use it.

    COUNT_PARAMS   parameters by layer type, {"embedding", "attention", "mlp", "norm", "total"}, as ints:
                   a count of 32768.0, a missing or extra key, fails. The notebook gives the module listing
                   (`print(model)`) and the attention code, not the terms: the learner decides which config
                   field sets each shape, whether the listed lm_head counts again, and what a norm holds

Each fixed case tells wrong answers from the right one (the comment beside it says which); the random
configs cover the rest.
"""

from __future__ import annotations

from typing import Any

from .._checks import is_int
from ..course import Exercise
from .config import TinyLMConfig, param_counts, random_config


def same_counts(got: Any, expected: dict[str, int]) -> bool:
    """COUNT_PARAMS' comparison: a dict with exactly the expected keys, each value an int (not a float, not
    a bool) equal to the expected count."""
    return (isinstance(got, dict) and set(got) == set(expected)
            and all(is_int(got[k]) and got[k] == v for k, v in expected.items()))


COUNT_PARAMS = Exercise(
    "count_params", param_counts,
    # TinyLM's own config: 2 KV heads of 4 (wk, wv narrower than wq), 4 layers of norms, and a tied output
    # layer, so the listing's lm_head is the embedding again (counting it twice fails here)
    cases=[(TinyLMConfig(),),
           (TinyLMConfig(tie_embeddings=False),),  # the output layer counted on top of the embedding
           # Llama-2-7B: 32 KV heads (wk, wv as wide as wq: d_model // 2 read off TinyLM's listing fails),
           # untied, a 32,000-token vocabulary; 6,738,415,616 in all
           (TinyLMConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=11008,
                         tie_embeddings=False),)],
    random_case=lambda rng: (random_config(rng),), compare=same_counts)

EXERCISES = [COUNT_PARAMS]
