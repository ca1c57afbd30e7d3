"""A request as the engine tracks it (notebook 06, section 2): its tokens, its sampling parameters, where it is
in its life and when each of its tokens appeared. One Sequence per request; the Sequence owns this state, the
BlockManager owns its blocks, the Scheduler owns the queues it waits in.

    WAITING --scheduled--> RUNNING --last token--> FINISHED ("stop" / "length")
       ^                    |   |
       +---preempted: recompute  +--preempted: swap--> SWAPPED --swapped in--> RUNNING
    any state --abort--> FINISHED ("abort");  refused at admission --> FINISHED ("refused")
    in a step whose forward raised --> FINISHED ("error", error = why): its KV blocks hold no known state

A request with images (lab 07) carries them as `mm` (labkit.serving.mm.MultiModalInput: placeholder ranges of
the prompt with their features): they stay with the Sequence through preemption, so a recompute feeds them again.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence as Seq

import torch

from .._checks import check_int, check_number, check_type, fail, is_int
from ..tinylm import TinyLMConfig
from .mm import MultiModalInput, check_mm
from .sampling import SamplingParams


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


FINISH_REASONS = ("stop", "length", "abort", "refused", "error")


class Sequence:
    """One request: `prompt` token ids, `params`, `arrival` (seconds on the engine's clock), `priority` (a lower
    value runs first), `mm` its images (sorted by offset). The output grows one token per decode step;
    `token_times[i]` is when output token i appeared (engine clock, seconds)."""

    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams, arrival: float = 0.0,
                 priority: int = 0, mm: Seq[MultiModalInput] = ()):
        if not isinstance(request_id, str) or not request_id:
            fail("request_id", request_id, "a non-empty str", TypeError)
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple)) \
                or not all(is_int(t) and t >= 0 for t in prompt):
            fail("prompt", str(prompt)[:60], "a list of token ids (non-negative ints); encode text first", TypeError)
        if not prompt:
            fail("prompt", [], "at least one token")
        check_type("params", params, SamplingParams, "a labkit.serving.SamplingParams")
        self.request_id = request_id
        self.prompt = [int(t) for t in prompt]
        self.params = params
        self.arrival = check_number("arrival", arrival, low=0.0)
        self.priority = check_int("priority", priority)
        self.mm = check_mm(mm, len(self.prompt))
        self.output: list[int] = []
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.token_times: list[float] = []
        self.first_scheduled: float | None = None
        self.num_preemptions = 0
        self.swapped_tokens = 0  # computed tokens copied to host memory by the last swap-out
        self.generator: torch.Generator | None = None  # set by the engine for sampled (non-greedy) requests

    @property
    def tokens(self) -> list[int]:
        """Prompt then output: what the KV cache holds (or must recompute) for this request."""
        return self.prompt + self.output

    @property
    def mm_spans(self) -> tuple[tuple[int, int, str], ...]:
        """(offset, length, image hash) of each image: what the block manager puts in the block hashes."""
        return tuple(m.span for m in self.mm)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def max_total_tokens(self) -> int:
        """Prompt + max_tokens: the most token states this request can ever hold."""
        return len(self.prompt) + self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def finish_time(self) -> float | None:
        return self.token_times[-1] if self.finished and self.token_times else None

    def finish(self, reason: str, error: str | None = None) -> None:
        if reason not in FINISH_REASONS:
            fail("reason", reason, f"one of {FINISH_REASONS}")
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt {len(self.prompt)}, "
                f"output {len(self.output)}/{self.params.max_tokens})")


def check_request(seq: Sequence, cfg: TinyLMConfig) -> None:
    """Can `cfg`'s model serve `seq`? Token ids in its vocabulary, the prompt and max_tokens within its context,
    image features of its width (d_model). Errors name the field."""
    bad = [t for t in seq.prompt if t >= cfg.vocab_size]
    if bad:
        fail("prompt", bad[0], f"token ids in [0, {cfg.vocab_size}) (the model's vocabulary)")
    if seq.num_prompt_tokens >= cfg.max_seq_len:
        fail("prompt", f"{seq.num_prompt_tokens} tokens", f"at most {cfg.max_seq_len - 1} tokens (the model's "
             f"context is {cfg.max_seq_len}, and one token must be left to generate)")
    if seq.max_total_tokens > cfg.max_seq_len:
        fail("max_tokens", seq.params.max_tokens, f"<= {cfg.max_seq_len - seq.num_prompt_tokens}: the prompt "
             f"has {seq.num_prompt_tokens} tokens and the model's context is {cfg.max_seq_len}")
    check_mm(seq.mm, seq.num_prompt_tokens, cfg.d_model)
