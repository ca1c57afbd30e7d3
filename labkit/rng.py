"""SplitMix64, the course's one random number generator for data and exercise cases (notebook 00's corpus,
every check cell's random cases): integer arithmetic only, so a seed gives the same stream everywhere."""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


class Rng:
    """SplitMix64 (Steele, Lea & Flood, 2014): 64-bit integer arithmetic only, so its stream is fixed by
    the seed on every platform and Python version."""

    def __init__(self, seed: int):
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.state = seed & _MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n). The modulo bias is below n / 2**64: negligible for our n."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        return self.next_u64() % n

    def choice(self, seq):
        return seq[self.below(len(seq))]
