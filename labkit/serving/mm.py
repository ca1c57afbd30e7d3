"""Images in the engine (notebook 07, section 6): a request's image features ride with its Sequence and are fed
to the language model in place of the image's placeholder tokens (vLLM's PlaceholderRange + mm_hash).

    prompt   b"<img><img><img><img>colour="     one image = tokens_per_image placeholder ids (image_token_id)
    mm       MultiModalInput(offset=0, length=4, hash="sha256...", embeds [4, d_model])

Each step, `step_embeds` gives the model the rows of the packed tokens whose position lies in an image range,
with that position's feature vector (`StepInput.embeds`; TinyLM.forward(embeds=...) writes them over the token
embeddings). A prefill chunk that splits an image gets only the rows of its chunk; a recomputed (preempted)
request gets its features again; prefix-cache hits are not fed (their K/V are stored). The image hash goes to
the block manager, which puts it in the hash of every block the image overlaps (labkit.kv_cache.prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .._checks import check_int, check_positive_int, check_type, fail


@dataclass(frozen=True, eq=False)
class MultiModalInput:
    """One image of a prompt: its placeholder tokens are positions offset .. offset + length - 1, `hash` names
    its content (labkit.day0.multimodal.image_hash), `embeds` float [length, d_model] are its features (the
    vision encoder's output after the projector), one row per placeholder token."""
    offset: int
    length: int
    hash: str
    embeds: torch.Tensor

    def __post_init__(self):
        check_int("offset", self.offset, 0)
        check_positive_int("length", self.length, "tokens")
        if not isinstance(self.hash, str) or not self.hash:
            fail("hash", self.hash, "a non-empty str (the image's content hash)", TypeError)
        check_type("embeds", self.embeds, torch.Tensor, "a torch.Tensor [length, d_model]")
        if not self.embeds.is_floating_point():
            fail("embeds", f"dtype {self.embeds.dtype}", "a floating-point tensor (image features)", TypeError)
        if self.embeds.dim() != 2 or self.embeds.shape[0] != self.length:
            fail("embeds", f"shape {tuple(self.embeds.shape)}", f"[{self.length}, d_model]: one row per placeholder")

    @property
    def end(self) -> int:
        """One past the last placeholder position."""
        return self.offset + self.length

    @property
    def span(self) -> tuple[int, int, str]:
        """(offset, length, hash): what the block manager hashes."""
        return (self.offset, self.length, self.hash)


def check_mm(mm, num_prompt_tokens: int, d_model: int | None = None, name: str = "mm"
             ) -> tuple[MultiModalInput, ...]:
    """`mm` (a sequence of MultiModalInput) checked for a prompt of `num_prompt_tokens` tokens and a model of
    width `d_model` (None: any): each range inside the prompt, none overlapping another, embeds [length,
    d_model]. Returned as a tuple sorted by offset. Errors name the input, e.g. "mm[1].embeds"."""
    if isinstance(mm, (str, bytes, torch.Tensor)) or not isinstance(mm, Sequence):
        fail(name, type(mm).__name__, "a sequence of labkit.serving.MultiModalInput", TypeError)
    for i, m in enumerate(mm):
        if not isinstance(m, MultiModalInput):
            fail(f"{name}[{i}]", type(m).__name__, "a labkit.serving.MultiModalInput", TypeError)
        if m.end > num_prompt_tokens:
            fail(f"{name}[{i}]", f"positions [{m.offset}, {m.end})",
                 f"a range inside the prompt's {num_prompt_tokens} tokens")
        if d_model is not None and m.embeds.shape[1] != d_model:
            fail(f"{name}[{i}].embeds", f"shape {tuple(m.embeds.shape)}",
                 f"[{m.length}, {d_model}] (the model's d_model)")
    order = sorted(range(len(mm)), key=lambda i: mm[i].offset)
    for a, b in zip(order, order[1:]):
        if mm[b].offset < mm[a].end:
            fail(f"{name}[{b}]", f"positions [{mm[b].offset}, {mm[b].end})",
                 f"a range that does not overlap {name}[{a}] [{mm[a].offset}, {mm[a].end})")
    return tuple(mm[i] for i in order)


def step_embeds(scheduled) -> tuple[torch.Tensor, torch.Tensor] | None:
    """StepInput.embeds for one step's `scheduled` list (labkit.serving.scheduler.Scheduled, in packing order):
    (rows int64 [n] into the packed tokens, values [n, d_model]) for every packed token whose position lies in
    one of its request's image ranges; None when there is none (a text-only step)."""
    rows, values, base = [], [], 0
    for s in scheduled:
        stop = s.start + s.num_tokens
        for m in s.seq.mm:
            a, b = max(s.start, m.offset), min(stop, m.end)  # the part of the image in this chunk
            if a < b:
                rows.append(torch.arange(a - s.start, b - s.start) + base)
                values.append(m.embeds[a - m.offset:b - m.offset])
        base += s.num_tokens
    if not rows:
        return None
    return torch.cat(rows), torch.cat([v.to(values[0].dtype) for v in values])
