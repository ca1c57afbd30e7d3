"""TinyLM batch-1 greedy decoding speed, with and without the KV cache, measured in one run.

    python benchmarks/decode_speed.py

Goal: at least 200 tokens/s with the cache on 2 cores, and at least 3x the speed of decoding
without it at a 256-token context. Prints tokens/s and the ratio; records nothing by itself: copy the
output into benchmarks/RESULTS.md.
"""

import torch

from labkit.course import timing
from labkit.tinylm import corpus, load_pretrained


def tokens_per_s(model, prompt: list[int], n: int, use_cache: bool, repeats: int = 5) -> float:
    """Median tokens/s of `repeats` generations of n tokens (no stop token: exactly n each time)."""
    return n / timing.measure(lambda: model.generate(prompt, n, use_cache=use_cache), repeats, warmup=0).median


def main() -> None:
    model, tok = load_pretrained()
    ctx = model.cfg.max_seq_len
    long_prompt = list(corpus.corpus("test", 192))
    short_prompt = tok.encode("The old sailor")
    model.generate(short_prompt, 8)  # warm-up
    cached_short = tokens_per_s(model, short_prompt, ctx - len(short_prompt), True)
    cached = tokens_per_s(model, long_prompt, ctx - len(long_prompt), True)
    uncached = tokens_per_s(model, long_prompt, ctx - len(long_prompt), False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"cached, prompt {len(short_prompt)} -> {ctx} tokens:   {cached_short:7.0f} tokens/s")
    print(f"cached, prompt {len(long_prompt)} -> {ctx} tokens:  {cached:7.0f} tokens/s")
    print(f"uncached, prompt {len(long_prompt)} -> {ctx} tokens:{uncached:7.0f} tokens/s")
    print(f"speed-up of the KV cache at a {ctx}-token context: {cached / uncached:.1f}x")


if __name__ == "__main__":
    main()
