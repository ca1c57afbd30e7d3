"""labkit.rng.Rng against an independent SplitMix64."""
import numpy as np
import pytest

from labkit.rng import Rng


def splitmix64_numpy(seed: int, n: int) -> list[int]:
    """Independent SplitMix64 with numpy's wrapping uint64 arithmetic."""
    out, state = [], np.uint64(seed)
    with np.errstate(over="ignore"):
        for _ in range(n):
            state = state + np.uint64(0x9E3779B97F4A7C15)
            z = state
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            out.append(int(z ^ (z >> np.uint64(31))))
    return out




@pytest.mark.parametrize("seed", [0, 1, 1234567, 2**64 - 1])
def test_rng_matches_independent_splitmix64(seed):
    rng = Rng(seed)
    assert [rng.next_u64() for _ in range(50)] == splitmix64_numpy(seed, 50)


def test_below_and_choice_stay_in_range_and_refuse_bad_input():
    rng = Rng(3)
    assert all(0 <= rng.below(7) < 7 for _ in range(200))
    assert {rng.choice("ab") for _ in range(50)} == {"a", "b"}
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        Rng(0).below(0)
    with pytest.raises(TypeError, match="seed must be an int"):
        Rng(1.5)
