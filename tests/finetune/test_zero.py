"""ZeRO stage 1 on 2 real gloo ranks: the same parameters as one process on the whole global batch, the same as
torch's ZeroRedundancyOptimizer, half of Adam's states per rank; the multi-process test is capped in time."""
import pytest
import torch

from labkit.finetune import zero
from labkit.parallel import Pool
from labkit.tinylm import TinyLM, TinyLMConfig


@pytest.mark.timeout(90)
def test_zero1_matches_one_process_and_zero_redundancy_optimizer():
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32))
    with Pool(2, timeout=30) as pool:
        r = zero.compare_zero(pool, model, steps=3, batch=4, seq=16, lr=1e-2)
    assert r["moved"] > 1e-3  # training moved the parameters: agreement is not trivial
    assert r["ours_vs_single"] < 1e-5 and r["library_vs_single"] < 1e-5 and r["ranks_agree"]
    # Adam's m and v (4 bytes each per parameter) and one 4-byte step counter per parameter tensor
    n, tensors = r["params"], len(list(model.parameters()))
    assert r["single_bytes"] == 8 * n + 4 * tensors
    assert r["ours_bytes"] == [4 * (n + n % 2) + 4] * 2  # one flat shard per rank: one counter
    assert sum(r["library_bytes"]) == 8 * n + 4 * tensors  # the library shards whole tensors
