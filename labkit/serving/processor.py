"""From a request to what the engine runs (notebook 06, section 6; notebook 07 adds images): a Processor turns a
chat request's `messages` or a completion's `prompt` into a Prompt, the token ids (image placeholders included)
and the image inputs of a multimodal model. The service runs it off the asyncio event loop, on its processor
thread (labkit.serving.service), because a vision-language model's processor decodes images and may run the
vision encoder.

    Processor            chat(messages) -> Prompt        completion(prompt) -> Prompt
    TextProcessor        TinyLM's plain-text chat template (below); refuses image parts
    labkit.day0          VLMProcessor: image_url parts -> image tokens + encoder features (lab 07)

Messages follow OpenAI's schema: {"role", "content"} where content is a string or a list of parts
{"type": "text", "text": ...} and {"type": "image_url", "image_url": {"url": ..., "detail": ...}}.
message_parts() checks that shape once for every processor. Bad input raises TypeError (wrong type) or
ValueError (wrong value) naming the field as OpenAI's `param` does: "messages[0].content[1].image_url.url must
be ..., got ..."; the HTTP API answers it with a 400 naming that param.

Chat template (TinyLM). TinyLM was trained on one-line documents ("12+7=19", "copy abc -> abc", plain
sentences) and never on role-tagged dialogue, so the template is plain text: the messages' contents in order,
one per line, with no role markers, and the reply continues the last line.

    [{"role": "user", "content": "copy hello -> "}]  ->  prompt "copy hello -> "  ->  reply "hello"
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._checks import check_int, check_type, fail, is_int
from ..tinylm import ByteTokenizer

CHAT_ROLES = ("system", "developer", "user", "assistant")
PART_TYPES = ("text", "image_url")


@dataclass(frozen=True)
class Prompt:
    """What one request runs: `token_ids` (image placeholder tokens included: usage.prompt_tokens counts them),
    `mm` the multimodal inputs the engine places at those tokens (labkit.serving.mm.MultiModalInput, one per
    image; () for text), and `num_image_tokens` how many of the ids are image tokens."""
    token_ids: list[int]
    mm: tuple = ()
    num_image_tokens: int = 0

    def __post_init__(self):
        check_type("token_ids", self.token_ids, list, "a list of token ids (int)")
        if not all(is_int(t) and t >= 0 for t in self.token_ids):
            fail("token_ids", self.token_ids, "a list of token ids (ints >= 0)", TypeError)
        check_type("mm", self.mm, tuple, "a tuple of multimodal inputs (() for text)")
        check_int("num_image_tokens", self.num_image_tokens, 0, len(self.token_ids))


@runtime_checkable
class Processor(Protocol):
    """Turns a request into a Prompt; raises TypeError / ValueError naming the bad field (module docstring)."""

    def chat(self, messages) -> Prompt: ...

    def completion(self, prompt) -> Prompt: ...


@dataclass(frozen=True)
class Part:
    """One content part of a checked message: kind "text" (value: the text) or "image_url" (value: the URL);
    `param` is its field name for errors, e.g. "messages[0].content[1].image_url.url"."""
    kind: str
    value: str
    param: str


def _part(value, name: str) -> Part:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        fail(name, value, 'a content part: {"type": "text", "text": ...} or {"type": "image_url", ...}', TypeError)
    kind = value["type"]
    if kind not in PART_TYPES:
        fail(f"{name}.type", kind, f"one of {PART_TYPES}")
    if kind == "text":
        if not isinstance(value.get("text"), str):
            fail(f"{name}.text", value.get("text"), "a string", TypeError)
        return Part("text", value["text"], f"{name}.text")
    image = value.get("image_url")
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        fail(f"{name}.image_url", image, 'an object {"url": "data:image/png;base64,..."}', TypeError)
    return Part("image_url", image["url"], f"{name}.image_url.url")


def message_parts(messages) -> list[tuple[str, list[Part]]]:
    """Check `messages` against OpenAI's schema; each message's (role, content parts), a string content being
    one text part. Other message fields (name, ...) are ignored."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        fail("messages", messages, "a non-empty list of message objects", TypeError)
    out = []
    for i, m in enumerate(messages):
        if m.get("role") not in CHAT_ROLES:
            fail("messages", m, f"messages whose role is one of {CHAT_ROLES}")
        content, name = m.get("content"), f"messages[{i}].content"
        if isinstance(content, str):
            out.append((m["role"], [Part("text", content, name)]))
        elif isinstance(content, list):
            out.append((m["role"], [_part(p, f"{name}[{j}]") for j, p in enumerate(content)]))
        else:
            fail(name, content, 'a string or a list of content parts ({"type": "text" | "image_url", ...})',
                 TypeError)
    return out


def prompt_text(name: str, value) -> str:
    """A completion's prompt: a non-empty string (or a list of one string)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if not isinstance(value, str):
        fail(name, value, "a string (or a list of one string; token-id and batched prompts are not supported)",
             TypeError)
    if not value:
        fail(name, value, "a non-empty string")
    return value


def chat_prompt(messages) -> str:
    """TinyLM's chat template (module docstring): the text contents in order, one per line, no role markers.
    An image part is refused (ValueError naming it): TinyLM takes no images."""
    lines = []
    for role, parts in message_parts(messages):
        for p in parts:
            if p.kind != "text":
                fail(p.param.removesuffix(".image_url.url") + ".type", p.kind,
                     '"text": this model takes no images (an image_url part was sent to a text-only model)')
        lines.append("".join(p.value for p in parts))
    return prompt_text("messages", "\n".join(lines))


class TextProcessor:
    """The Processor of a text-only model (TinyLM): chat_prompt / prompt_text, then `tokenizer.encode`
    (ByteTokenizer by default)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer or ByteTokenizer()
        if not callable(getattr(self.tokenizer, "encode", None)):
            fail("tokenizer", self.tokenizer, "a tokenizer with encode(text) -> token ids", TypeError)

    def _encode(self, name: str, text: str) -> Prompt:
        try:
            return Prompt(list(self.tokenizer.encode(text)))
        except (TypeError, ValueError) as e:  # a lone surrogate, ...
            fail(name, text, f"text the tokenizer takes ({e})", type(e))

    def chat(self, messages) -> Prompt:
        return self._encode("messages", chat_prompt(messages))

    def completion(self, prompt) -> Prompt:
        return self._encode("prompt", prompt_text("prompt", prompt))

    def __repr__(self) -> str:
        return f"TextProcessor({type(self.tokenizer).__name__})"


class ProcessorThread:
    """The one thread a Service runs its Processor on (module docstring): run() awaits a Prompt from it."""

    def __init__(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="labkit-processor")

    async def run(self, processor: Processor, kind: str, payload) -> Prompt:
        """processor.chat(payload) (`kind` "chat") or processor.completion(payload) ("completion") on the
        thread; its refusals raise here."""
        if kind not in ("chat", "completion"):
            fail("kind", kind, '"chat" or "completion"')
        call = processor.chat if kind == "chat" else processor.completion
        prompt = await asyncio.get_running_loop().run_in_executor(self._pool, call, payload)
        if not isinstance(prompt, Prompt):
            raise RuntimeError(f"{type(processor).__name__}.{kind} returned {type(prompt).__name__}, not a Prompt")
        return prompt

    def close(self) -> None:
        """Stop the thread (work not started yet is dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
