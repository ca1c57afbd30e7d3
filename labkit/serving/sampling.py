"""Sampling: how a request's next token is drawn from the model's logits (notebook 06, section 1).

SamplingParams is the per-request contract the engine, the scheduler and the HTTP API share (its fields are
OpenAI's and vLLM's names). `probabilities` turns logits into the distribution a request samples from,
`sample` draws one token, `sample_batch` draws one token for every row of a batch (what the engine calls once
per step), `make_generator` seeds a request's own generator.

The chain, in this order (each step renormalises what is left; computed on the CPU in float64):
    1. temperature  z = (logits - max) / T      (T = 0: greedy, a one-hot at the argmax, lowest index on ties)
    2. top-k        keep the tokens whose z is >= the k-th largest z: every token TIED with the k-th is kept,
                    so more than k tokens can survive (HF's and vLLM's `z < kth` mask does the same); k >= V is off
    3. top-p        keep token j iff the tokens strictly more likely than j hold less than p: that is the smallest
                    prefix of the tokens sorted by probability whose cumulative probability reaches p, INCLUDING
                    the token that crosses p, plus every token tied with it (HF and vLLM split such a tie by
                    sort position; here the answer depends on the values only, never on token order)
    4. min-p        drop tokens with probability < min_p x the most likely token's (the most likely always stays)

Where the orders come from (they are not all the same, and the order matters: top-p then min-p keeps a
different set than min-p then top-p, because top-p measures mass after whatever ran before it):
  - Hugging Face transformers, GenerationMixin._get_logits_processor (src/transformers/generation/utils.py):
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, then typical/epsilon/eta.
    This module follows that order.
  - vLLM V0 (vllm/model_executor/layers/sampler.py): temperature, _apply_top_k_top_p, then _apply_min_p: the
    same order. vLLM V1 (vllm/v1/sample/sampler.py, Sampler.sample): temperature, then the argmax-invariant
    logits processors (min-p by default), then top-k/top-p: min-p BEFORE top-k/top-p.
  - llama.cpp, common_params_sampling.samplers (common/common.h): penalties, DRY, top-n-sigma, top-k,
    typical-p, top-p, min-p, XTC, and temperature LAST. Temperature after the filters changes what top-p and
    min-p see: with T > 1 applied first (HF, vLLM) the distribution is flatter, so top-p keeps more tokens.

A draw uses only its own row's logits and its own generator, so a request samples the same tokens alone or in
any batch (notebook 06, section 5 relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_int, check_number, check_positive_int, check_type, fail, is_int


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler and when it stops.

    max_tokens   new tokens at most (finish_reason "length" when reached)
    temperature  0 = greedy; else logits / temperature (OpenAI allows [0, 2])
    top_k        keep the k largest logits; 0 = off
    top_p        keep the smallest set of most likely tokens whose probability reaches p; 1 = off
    min_p        drop tokens below min_p x the top token's probability; 0 = off
    seed         seeds the request's own generator (None: the engine derives one from its seed and the request)
    stop_token_ids  finish (reason "stop") right after producing one of these; the token is kept in the output
    """
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        check_positive_int("max_tokens", self.max_tokens, "tokens")
        check_number("temperature", self.temperature, low=0.0, high=2.0, unit="0 = greedy")
        check_int("top_k", self.top_k, 0, unit="0 = off")
        check_number("top_p", self.top_p, low=0.0, high=1.0)
        if self.top_p == 0:
            fail("top_p", self.top_p, "a number in (0, 1] (1 keeps every token)")
        check_number("min_p", self.min_p, low=0.0, high=1.0, unit="0 = off")
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2**64 - 1)  # torch's seed range
        ids = self.stop_token_ids
        if (isinstance(ids, (str, bytes)) or not isinstance(ids, (tuple, list))
                or not all(is_int(t) and t >= 0 for t in ids)):
            fail("stop_token_ids", ids, "a tuple of token ids (non-negative ints)", TypeError)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _logits(logits, dims: tuple[int, ...], what: str) -> torch.Tensor:
    """`logits` checked (a float tensor with `dims` dimensions, a non-empty vocabulary, no NaN or +inf, no row
    all -inf) and returned as a float64 CPU copy."""
    check_type("logits", logits, torch.Tensor, what)
    if not logits.is_floating_point():
        raise TypeError(f"logits must be {what}, got dtype {logits.dtype}")
    if logits.dim() not in dims or logits.shape[-1] == 0:
        raise ValueError(f"logits must be {what} with at least one token, got shape {tuple(logits.shape)}")
    z = logits.detach().to("cpu", torch.float64)
    bad = torch.isnan(z) | (z == float("inf"))
    if bad.any():
        fail("logits", z[bad][0].item(), "finite numbers or -inf (a token that may not be drawn), not NaN or +inf")
    dead = (z == float("-inf")).all(-1)
    if dead.any():
        row = z if z.dim() == 1 else z[dead.nonzero()[0, 0]]
        fail("logits", row.tolist()[:8], "finite in at least one entry (every token is -inf: nothing can be drawn)")
    return z


def _filtered(z: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The chain of the module docstring on checked float64 logits z [..., V]: probabilities [..., V]."""
    if params.greedy:
        return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).double()  # argmax: first index on ties
    z = (z - z.max(-1, keepdim=True).values) / params.temperature  # <= 0: exp never overflows; -inf stays -inf
    if 0 < params.top_k < z.shape[-1]:
        kth = torch.topk(z, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        z = z.masked_fill(z < kth, float("-inf"))  # ties with the k-th survive
    p = torch.softmax(z, -1)
    if params.top_p < 1:
        s = torch.sort(p, -1, descending=True).values  # [..., V]
        before = torch.nn.functional.pad(torch.cumsum(s, -1)[..., :-1], (1, 0))  # mass sorted before each token
        last = (before < params.top_p).sum(-1, keepdim=True) - 1  # [..., 1]: the token that crosses p (kept)
        p = torch.where(p >= s.gather(-1, last), p, 0.0)  # and every token tied with it
        p = p / p.sum(-1, keepdim=True)
    if params.min_p > 0:
        p = torch.where(p >= params.min_p * p.max(-1, keepdim=True).values, p, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: float64 probabilities [V] (or [B, V], the same params for every
    row) after temperature, top-k, top-p and min-p in the module docstring's order; a one-hot at the argmax
    (lowest index among ties) when params.greedy.

    logits: [V] or [B, V], any float dtype and device (the result is on the CPU). -inf marks a token that may not
    be drawn (probability 0); NaN, +inf and a row of only -inf are refused. Notebook 06, section 1."""
    z = _logits(logits, (1, 2), "a float tensor [vocab] or [batch, vocab]")
    check_type("params", params, SamplingParams, "a SamplingParams")
    return _filtered(z, params)


def _draw(z: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from checked float64 logits z [V]: one multinomial draw with the request's own generator."""
    return int(torch.multinomial(_filtered(z, params), 1, generator=generator))


def _check_generator(name: str, generator, params: SamplingParams) -> None:
    if not params.greedy:
        check_type(name, generator, torch.Generator,
                   "a torch.Generator (make_generator(seed)): the request samples at temperature "
                   f"{params.temperature:g}")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One token id from logits [V] under `params`: the argmax when greedy (generator unused, may be None), else
    one draw from probabilities(logits, params) with `generator` (a CPU generator, see make_generator), which
    it advances. Notebook 06, section 1."""
    z = _logits(logits, (1,), "a 1-D float tensor [vocab]")
    check_type("params", params, SamplingParams, "a SamplingParams")
    _check_generator("generator", generator, params)
    return int(z.argmax()) if params.greedy else _draw(z, params, generator)


def sample_batch(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list[int]:
    """One token id per row of logits [B, V]: row i under params[i] with generators[i] (None allowed for greedy
    rows). What the engine calls once per step for every running request.

    One argmax over the whole batch serves every greedy row; every sampled row makes its own multinomial draw from
    its own row, so its token never depends on the other rows (alone or batched, a request samples the same
    tokens). Everything is checked before any generator is advanced. Notebook 06, sections 1 and 5."""
    z = _logits(logits, (2,), "a 2-D float tensor [batch, vocab]")
    rows = z.shape[0]
    for name, items in (("params", params), ("generators", generators)):
        check_type(name, items, (list, tuple), f"a list with one entry per row of logits ({rows})")
        if len(items) != rows:
            raise ValueError(f"{name} must be a list with one entry per row of logits ({rows}), "
                             f"got a list of {len(items)}")
    for i, (p, g) in enumerate(zip(params, generators)):
        check_type(f"params[{i}]", p, SamplingParams, "a SamplingParams")
        _check_generator(f"generators[{i}]", g, p)
    tops = z.argmax(-1).tolist() if any(p.greedy for p in params) else []  # one argmax for all greedy rows
    return [tops[i] if p.greedy else _draw(z[i], p, g) for i, (p, g) in enumerate(zip(params, generators))]


def make_generator(seed: int) -> torch.Generator:
    """A CPU torch.Generator seeded with `seed` (an int in [0, 2**64), torch's seed range; SamplingParams.seed
    has the same range). Notebook 06, section 1."""
    return torch.Generator(device="cpu").manual_seed(check_int("seed", seed, 0, 2**64 - 1))
