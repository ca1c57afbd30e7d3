"""Text generation with TinyLM: greedy or seeded sampling, with or without a KV cache (notebook 00; the
uncached loop is notebook 05's baseline). Lab 06 grows this into a serving engine."""

from __future__ import annotations

import torch

from .._checks import check_bool, check_int, check_number, check_positive_int, check_type, fail, is_int
from .cache import KVCache
from .config import check_tinylm


def sample_top_k(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator) -> int:
    """One token id from logits [vocab]: argmax when temperature is 0, else a draw from
    softmax(logits / temperature) (restricted to the top_k largest logits when top_k is given) with `gen`.

    -inf marks a token that may not be drawn (probability 0); NaN or +inf logits are refused. The logits are
    shifted by their maximum before dividing by the temperature, so a tiny temperature cannot overflow: its
    limit is greedy (a draw among the tied maxima)."""
    check_type("logits", logits, torch.Tensor, "a 1-D float tensor [vocab]")
    if logits.dim() != 1 or not logits.is_floating_point() or not logits.numel():
        fail("logits", f"a {logits.dtype} tensor of shape {tuple(logits.shape)}",
             "a non-empty 1-D float tensor [vocab]")
    check_number("temperature", temperature, low=0.0)
    if top_k is not None:
        check_int("top_k", top_k, 1, logits.numel())
    check_type("gen", gen, torch.Generator, "a torch.Generator")
    z = logits.detach().double()
    if torch.isnan(z).any() or (z == float("inf")).any() or (z == float("-inf")).all():
        fail("logits", z.tolist()[:8], "finite numbers or -inf (a token that may not be drawn), not all -inf")
    if temperature == 0:
        return int(z.argmax())
    if top_k is not None:
        kth = torch.topk(z, top_k).values[-1]
        z = z.masked_fill(z < kth, float("-inf"))
    z = (z - z.max()) / temperature  # <= 0 everywhere: exp never overflows; -inf stays -inf (probability 0)
    return int(torch.multinomial(torch.softmax(z, -1).float(), 1, generator=gen))


def check_prompt(prompt, vocab_size: int) -> list[int]:
    """`prompt` (token ids: a list, or a 1-D tensor) as a list of ints, or a TypeError that says to encode
    text first (generate and the decode traces take prompts)."""
    prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple)) or not all(is_int(t) for t in prompt):
        raise TypeError(f"prompt must be a list of token ids (ints in [0, {vocab_size})); encode text with "
                        f"ByteTokenizer first, got {str(prompt)[:60]!r}")
    return list(prompt)


@torch.no_grad()
def generate(model, prompt, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             seed: int = 0, stop_token: int | None = None, use_cache: bool = True) -> list[int]:
    """Continue `prompt` (a list of token ids) by up to `max_new_tokens`; returns the new ids only.

    temperature 0 is greedy; otherwise sample from softmax(logits / temperature), restricted to the
    `top_k` most likely tokens when top_k is given, with a torch.Generator seeded by `seed`.
    Generation stops after `stop_token` if it is produced. `use_cache=False` recomputes the whole
    sequence for every new token (the baseline of notebook 05).
    """
    V, ctx = check_tinylm(model).cfg.vocab_size, model.cfg.max_seq_len
    prompt = check_prompt(prompt, V)
    check_positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
    if not prompt or len(prompt) + max_new_tokens > ctx:
        raise ValueError(f"prompt length {len(prompt)} + max_new_tokens {max_new_tokens} must be in "
                         f"[1, {ctx}] (the model's context)")
    check_number("temperature", temperature, low=0.0)
    if top_k is not None:
        check_int("top_k", top_k, 1, V)
    if stop_token is not None:
        check_int("stop_token", stop_token, 0, V - 1)
    check_int("seed", seed)
    check_bool("use_cache", use_cache)
    device = model.tok_emb.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    cache = KVCache(model.cfg, dtype=model.tok_emb.weight.dtype, device=device) if use_cache else None
    seq, out = list(prompt), []
    logits = model(torch.tensor([seq], device=device), cache)[0, -1]
    for step in range(max_new_tokens):
        nxt = sample_top_k(logits, temperature, top_k, gen)
        out.append(nxt)
        seq.append(nxt)
        if nxt == stop_token or step == max_new_tokens - 1:
            break
        inp = torch.tensor([[nxt]] if use_cache else [seq], device=device)
        logits = model(inp, cache)[0, -1]
    return out
