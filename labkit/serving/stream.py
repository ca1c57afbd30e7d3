"""What an HTTP handler reads: a request's output as an asyncio stream of text chunks (notebook 06, section 6).
labkit.serving.service fills the streams from its engine thread; labkit.serving.api turns them into OpenAI's
responses and server-sent events."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable


class ServiceUnavailable(RuntimeError):
    """The service is not ready (still loading, failed to load, or stopped); `state` says which."""

    def __init__(self, state: str, message: str):
        super().__init__(message)
        self.state = state


@dataclass
class Chunk:
    """What one read of a RequestStream returns: `text` (new), `num_tokens` (new output tokens behind it),
    `finish_reason` ("stop" / "length" when the request ended) and `error` (a message when it failed)."""
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @staticmethod
    def merge(chunks: list["Chunk"]) -> "Chunk":
        """Chunks in a row as one: texts and token counts add up; the first finish reason and error."""
        return Chunk("".join(c.text for c in chunks), sum(c.num_tokens for c in chunks),
                     next((c.finish_reason for c in chunks if c.finish_reason), None),
                     next((c.error for c in chunks if c.error), None))


class RequestStream:
    """One request's output as an async iterator of Chunks (made by Service.submit; read it on `loop`, the one
    that submitted it). `abort()` when the reader goes away: `on_abort` tells the service, whose engine drops
    the request and frees its blocks."""

    def __init__(self, request_id: str, num_prompt_tokens: int, loop, on_abort: Callable[[], None]):
        self.request_id, self.num_prompt_tokens = request_id, num_prompt_tokens
        self.num_output_tokens, self.finish_reason, self.done = 0, None, False
        self.loop, self._queue, self._on_abort = loop, asyncio.Queue(), on_abort
        self.admitted = loop.create_future()  # set by the service: None (queued) or the refusal

    def put(self, chunk: Chunk) -> None:
        """Hand the reader a chunk (on `loop`: the service calls it through call_soon_threadsafe)."""
        self._queue.put_nowait(chunk)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Chunk:
        if self.done:
            raise StopAsyncIteration
        items = [await self._queue.get()]
        while not self._queue.empty():  # whatever queued up meanwhile goes out as one chunk
            items.append(self._queue.get_nowait())
        chunk = Chunk.merge(items)
        self.num_output_tokens += chunk.num_tokens
        self.finish_reason = chunk.finish_reason
        self.done = bool(chunk.finish_reason or chunk.error)
        return chunk

    async def collect(self) -> Chunk:
        """Read to the end: all the text, every token, the finish reason (or the error)."""
        return Chunk.merge([c async for c in self])

    def abort(self) -> None:
        """Drop the request (no-op once it finished)."""
        if not self.done:
            self.done = True
            self._on_abort()
