"""Small TinyLMs for the tests of labkit.tinylm (not a test module)."""
import torch

from labkit import tinylm as lm


def small_model(seed=0, **overrides) -> lm.TinyLM:
    torch.manual_seed(seed)
    cfg = lm.TinyLMConfig(**{"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 96,
                             "max_seq_len": 64, **overrides})
    m = lm.TinyLM(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so that attention is far from uniform
        for p in m.parameters():
            p.mul_(8 if p.dim() == 2 else 1)
    return m
