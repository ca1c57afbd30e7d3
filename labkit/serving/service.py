"""The service: one Engine driven by one background thread, with per-request text streams for asyncio (notebook
06, section 6; the HTTP API in api.py sits on it, `python -m labkit.serving` starts both).

    asyncio (HTTP handlers)                       processor thread (the only caller of the Processor)
    await service.process(kind, payload)       --> processor.chat / .completion -> Prompt (or the refusal)
                                                  engine thread (the only caller of the Engine)
    await service.submit(prompt, params, stop) --> AddRequest --> engine.add_request (refusals come back)
    async for chunk in stream  <-- call_soon_threadsafe <-- engine.step() -> tokens -> TextDecoder -> text
    stream.abort()  (client gone)               --> AbortRequest --> engine.abort (its blocks are freed)

The Processor (processor.py) runs on its own thread: a vision-language model's decodes images and runs the
vision encoder (lab 07), which on the loop would stall every client and on the engine thread every stream.
The Engine is not thread-safe, so only the engine thread touches it: requests and aborts come in through a
thread-safe queue, and when the engine has nothing to do the thread blocks on that queue (no busy loop).
Output goes back per request through an asyncio.Queue fed with loop.call_soon_threadsafe. A stream chunk carries
every token that queued up for its request since the consumer last looked: under load several tokens go out
together in one chunk, which keeps the event rate (and the event loop's work) bounded by how fast the
consumer reads, not by tokens/s. `stream_interval` N (SGLang's --stream-interval) holds a request's tokens until
N of them are there (or it finishes): N times fewer events for the server and the client to handle, at the
price of text arriving in steps of N tokens.

States: "loading" until the loader returned an engine and `engine.warmup()` (a one-token forward on every rank)
succeeded, then "ready"; a loader or warmup that raises leaves "failed" with `error` set, and so does an
engine step that raises (a TP rank that died): its requests end with an error chunk. stop() -> "stopped".
Text stop strings are matched here (detokenize.TextDecoder): the request is aborted in the engine at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from .._checks import check_number, check_positive_int, check_type, fail
from ..tinylm import ByteTokenizer
from .detokenize import TextDecoder
from .processor import Processor, ProcessorThread, Prompt, TextProcessor
from .stream import Chunk, RequestStream, ServiceUnavailable
from .sampling import SamplingParams

log = logging.getLogger("labkit.serving")

COUNTERS = ("admitted", "prompt_tokens", "generation_tokens", "finished_stop", "finished_length", "finished_abort",
            "finished_error")


@dataclass(frozen=True)
class AddRequest:
    """Admit a request (the engine thread answers on stream.admitted: None, or the refusal)."""
    stream: RequestStream
    decoder: TextDecoder
    token_ids: list[int]
    params: SamplingParams
    mm: tuple = ()  # images (labkit.serving.mm.MultiModalInput), lab 07


@dataclass(frozen=True)
class AbortRequest:
    """The reader went away: the request leaves the engine (its blocks are freed)."""
    request_id: str


@dataclass(frozen=True)
class Stop:
    """End the engine thread (running requests end with an error chunk)."""


Command = AddRequest | AbortRequest | Stop
"""What goes through the command queue to the engine thread (the only caller of the Engine)."""


def _run_all(callbacks: list) -> None:
    for callback in callbacks:
        callback()


class Service:
    """One Engine served to many asyncio clients. `load()` builds the Engine, or returns (engine, processor) or
    (engine, processor, tokenizer) when the model brings its own; it runs on the engine thread, so a slow load
    does not block the HTTP server. `tokenizer` needs encode(text) -> ids and decode_bytes(ids) -> bytes
    (ByteTokenizer by default); `processor` makes the Prompts (TextProcessor(tokenizer) by default);
    `close(engine)`, if given, runs on the engine thread when it stops (a TP engine's rank processes).
    start() begins loading, stop() ends the threads."""

    def __init__(self, load: Callable[[], object], tokenizer=None, close: Callable[[object], None] | None = None,
                 stream_interval: int = 1, processor: Processor | None = None):
        self.stream_interval = check_positive_int("stream_interval", stream_interval, "tokens")
        if not callable(load):
            fail("load", load, "a callable that returns an Engine (or an (engine, processor) pair)", TypeError)
        if close is not None and not callable(close):
            fail("close", close, "a callable close(engine), or None", TypeError)
        self._load, self._close, self.tokenizer = load, close, tokenizer or ByteTokenizer()
        self.processor = TextProcessor(self.tokenizer) if processor is None else \
            check_type("processor", processor, Processor, "a Processor (chat(messages), completion(prompt)) or None")
        self._processing = ProcessorThread()
        self.state, self.error, self._engine = "loading", None, None
        self._commands: queue.Queue[Command] = queue.Queue()
        self._tracks: dict[str, tuple[RequestStream, TextDecoder]] = {}  # engine thread only
        self._held: dict[str, list[Chunk]] = {}  # engine thread only: chunks waiting for stream_interval tokens
        self._counts = Counter(dict.fromkeys(COUNTERS, 0))
        self._stats: dict = {}
        self._outbox: list = []  # (stream, callback for its loop), handed out by _publish
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._lock = threading.Lock()  # guards state changes against queueing a request (submit)
        self._thread = threading.Thread(target=self._run, name="labkit-engine", daemon=True)

    # --- any thread ----------------------------------------------------------------------------------------

    def start(self) -> "Service":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running."""
        return self._thread.is_alive()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until loading ended (either way); True when ready."""
        self._ready.wait(check_number("timeout", timeout, low=0.0, unit="seconds"))
        return self.state == "ready"

    def stop(self, timeout: float = 30.0) -> None:
        """End the engine thread; requests still running end with an error chunk ("service stopped")."""
        check_number("timeout", timeout, low=0.0, unit="seconds")
        self._commands.put(Stop())
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._processing.close()
        if self.state != "failed":
            self.state = "stopped"

    def stats(self) -> dict:
        """The engine's stats() as of its last step, plus this service's totals: admitted (requests),
        prompt_tokens, generation_tokens (delivered) and finished_<reason> counts (stop, length, abort, error)."""
        return dict(self._stats)

    def _unavailable(self) -> ServiceUnavailable:
        why = f": {self.error}" if self.error else ""
        return ServiceUnavailable(self.state, f"the model is not ready (state {self.state!r}{why})")

    async def process(self, kind: str, payload) -> Prompt:
        """The Prompt of a "chat" (messages) or "completion" (prompt) request, made on the processor thread."""
        if self.state != "ready":
            raise self._unavailable()
        return await self._processing.run(self.processor, kind, payload)

    async def submit(self, prompt, params: SamplingParams, stop: tuple[str, ...] = ()) -> RequestStream:
        """Admit a request (`prompt`: a Prompt from process(), text, or token ids; image tokens count in the
        stream's num_prompt_tokens) and return its stream. The Engine's refusals (an empty prompt, max_tokens
        beyond the context, a request larger than the KV pool) raise here, before any output;
        ServiceUnavailable while not ready."""
        check_type("params", params, SamplingParams, "a labkit.serving.SamplingParams")
        mm = prompt.mm if isinstance(prompt, Prompt) else ()
        try:
            ids = prompt.token_ids if isinstance(prompt, Prompt) else \
                self.tokenizer.encode(prompt) if isinstance(prompt, (str, bytes)) else list(prompt)
        except (TypeError, ValueError) as e:
            fail("prompt", prompt, f"text or token ids the tokenizer takes ({e})", type(e))
        decoder = TextDecoder(self.tokenizer, tuple(stop))
        rid = f"req-{next(self._ids)}"
        stream = RequestStream(rid, len(ids), asyncio.get_running_loop(),
                               on_abort=lambda: self._commands.put(AbortRequest(rid)))
        with self._lock:
            if self.state != "ready":
                raise self._unavailable()
            self._commands.put(AddRequest(stream, decoder, ids, params, tuple(mm)))
        try:
            error = await stream.admitted
        except asyncio.CancelledError:  # the client left before admission
            stream.abort()
            raise
        if error is not None:
            raise error
        return stream

    # --- the engine thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._engine = self._load()
            if isinstance(self._engine, tuple):  # (engine, processor[, tokenizer]): the model's own
                self._engine, self.processor, *tokenizer = self._engine
                self.tokenizer = tokenizer[0] if tokenizer else self.tokenizer
                check_type("processor", self.processor, Processor, "a Processor")
            self._engine.warmup()
        except BaseException as e:  # a failed load is a state, not a crash of the thread
            self._set_state("failed", f"loading the model failed: {type(e).__name__}: {e}")
            self._ready.set()
            self._shutdown()  # refuses what queued up; closes an engine that was built (its ranks)
            return
        engine, self.state = self._engine, "ready"
        self._publish()
        self._ready.set()
        while self.state == "ready":
            cmd = self._next_command() if engine.has_unfinished() else self._commands.get()  # idle: block
            while cmd is not None:
                if isinstance(cmd, Stop):
                    self._set_state("stopped")
                    break
                self._handle(cmd)
                cmd = self._next_command()
            if self.state == "ready" and engine.has_unfinished():
                self._step()
            self._publish()
        self._shutdown()

    def _set_state(self, state: str, error: str | None = None) -> None:
        with self._lock:  # no request gets queued after this: _shutdown / _drain_after_failure see them all
            self.state, self.error = state, error or self.error

    def _next_command(self) -> Command | None:
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _handle(self, cmd: AddRequest | AbortRequest) -> None:
        if isinstance(cmd, AbortRequest):
            return self._drop(cmd.request_id)
        stream, ids = cmd.stream, cmd.token_ids
        try:  # mm= only with images: a text engine's add_request need not know it
            self._engine.add_request(ids, params=cmd.params, request_id=stream.request_id,
                                     **({"mm": cmd.mm} if cmd.mm else {}))
        except (ValueError, TypeError) as e:
            return self._admit(stream, e)
        except Exception as e:  # noqa: BLE001 - not a refusal: report it as an internal error
            return self._admit(stream, RuntimeError(f"engine failed to admit the request: {type(e).__name__}"))
        self._tracks[stream.request_id] = (stream, cmd.decoder)
        self._counts["admitted"] += 1
        self._counts["prompt_tokens"] += len(ids)
        self._admit(stream, None)

    def _admit(self, stream: RequestStream, error) -> None:
        def settle():
            if not stream.admitted.done():
                stream.admitted.set_result(error)
        self._outbox.append((stream, settle))

    def _step(self) -> None:
        try:
            outs = self._engine.step()
        except Exception as e:  # noqa: BLE001 - the engine is broken: its requests fail in-band, /health says so
            log.exception("the engine failed")
            self._set_state("failed", f"the engine failed: {type(e).__name__}: {e}")
            return
        for out in outs:
            track = self._tracks.get(out.request_id)
            if track is None:
                continue
            stream, decoder = track
            text, stopped = decoder.feed(out.token_id)
            self._counts["generation_tokens"] += 1
            if stopped:
                self._engine.abort(out.request_id)
                self._finish(out.request_id, Chunk(text, 1, "stop"))
            elif out.finished and out.finish_reason in ("stop", "length"):
                self._finish(out.request_id, Chunk(text + decoder.flush(), 1, out.finish_reason))
            elif out.finished:
                self._finish(out.request_id, Chunk(text, 1, error=f"the engine ended the request ({out.finish_reason})"))
            elif self.stream_interval == 1:
                self._deliver(stream, Chunk(text, 1))
            else:  # hold tokens until stream_interval of them are there (SGLang's --stream-interval)
                held = self._held.setdefault(out.request_id, [])
                held.append(Chunk(text, 1))
                if len(held) >= self.stream_interval:
                    self._deliver(stream, Chunk.merge(self._held.pop(out.request_id)))

    def _finish(self, rid: str, chunk: Chunk) -> None:
        stream, _ = self._tracks.pop(rid)
        chunk = Chunk.merge(self._held.pop(rid, []) + [chunk])
        self._release(rid)
        self._counts[f"finished_{chunk.finish_reason or 'error'}"] += 1
        self._deliver(stream, chunk)

    def _deliver(self, stream: RequestStream, chunk: Chunk) -> None:
        self._outbox.append((stream, lambda: stream.put(chunk)))

    def _publish(self) -> None:
        """Snapshot the stats, then hand out what this step produced: a reader that sees a token sees stats at
        least as new as the step that made it. One wake-up per event loop per step, however many streams."""
        self._snapshot()
        outbox, self._outbox = self._outbox, []
        by_loop: dict = {}
        for stream, callback in outbox:
            by_loop.setdefault(stream.loop, []).append((stream, callback))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_run_all, [callback for _, callback in items])
            except RuntimeError:  # its event loop is closed: nobody is reading any more
                for stream, _ in items:
                    self._drop(stream.request_id)

    def _drop(self, rid: str) -> None:
        """The reader went away: the request leaves the engine (its blocks are freed)."""
        self._held.pop(rid, None)
        if self._tracks.pop(rid, None) is not None:
            self._quietly("abort", rid)
            self._release(rid)
            self._counts["finished_abort"] += 1

    def _release(self, rid: str) -> None:
        """The engine forgets a request once its stream has it all (memory stays bounded)."""
        self._quietly("release", rid)

    def _quietly(self, method: str, rid: str) -> None:
        try:  # best effort: after an engine failure the request may be unknown or unfinished
            getattr(self._engine, method)(rid)
        except Exception:  # noqa: BLE001
            pass

    def _snapshot(self) -> None:
        try:
            stats = dict(self._engine.stats()) if self._engine is not None else {}
        except Exception:  # noqa: BLE001 - keep the last good numbers
            stats = dict(self._stats)
        stats.update(self._counts)
        self._stats = stats

    def _shutdown(self) -> None:
        """Stopped or failed: every running request ends with an error chunk, queued ones are refused."""
        why = "the service stopped" if self.state == "stopped" else "the engine failed; the request was dropped"
        for rid in list(self._tracks):
            self._finish(rid, Chunk(error=why))
            self._quietly("abort", rid)
        self._drain_after_failure()
        if self._close is not None and self._engine is not None:
            try:
                self._close(self._engine)
            except Exception:  # noqa: BLE001 - stopping anyway: say why, end the thread cleanly
                log.exception("closing the engine failed")

    def _drain_after_failure(self) -> None:
        """Refuse requests still queued (the service failed to load, or stopped)."""
        while (cmd := self._next_command()) is not None:
            if isinstance(cmd, AddRequest):
                self._admit(cmd.stream, ServiceUnavailable(self.state, f"the service is {self.state}"))
        self._publish()
