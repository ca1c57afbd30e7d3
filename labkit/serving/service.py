"""The service: one Engine behind per-request text streams for asyncio (notebook 06, section 6; the HTTP API in
api.py sits on it, `python -m labkit.serving` starts both). The engine runs in a thread of this process, or in
its own process (process=True, what `python -m labkit.serving` does): one state machine, one stream and
detokenization path, the same typed messages (labkit.serving.core) either way.

    asyncio (HTTP handlers)                       processor thread (the only caller of the Processor)
    await service.process(kind, payload)       --> processor.chat / .completion -> Prompt (or the refusal)
                                                  engine core (EngineCore: the only caller of the Engine)
    await service.submit(prompt, params, stop) --> AddRequest --> engine.add_request (refusals come back)
    async for chunk in stream  <-- call_soon_threadsafe <-- Outputs (one per step) -> TextDecoder -> text
    stream.abort()  (client gone)               --> AbortRequest --> engine.abort (its blocks are freed)

    process=False  the engine thread loads the engine, runs the EngineCore and turns its Outputs into text:
                   everything shares this interpreter (and its GIL) with the HTTP server
    process=True   a spawned engine-core process (core.run_engine_core) builds the engine with `load()` and
                   runs the EngineCore; commands go down a pipe as pickled messages, and this process's output
                   thread reads one Outputs per step and turns it into text. The engine's steps do not wait
                   for the HTTP server or the detokenizer, nor they for it. A process that dies (killed, out of
                   memory) fails the service: its requests end with an error chunk, new ones are refused.

The Processor (processor.py) runs on its own thread: a vision-language model's decodes images and runs the
vision encoder (lab 07), which on the loop would stall every client and on the engine thread every stream.
The Engine is not thread-safe, so only the engine core touches it: requests and aborts come in as commands,
and when the engine has nothing to do the core blocks on its commands (no busy loop). Output goes back per
request through an asyncio.Queue fed with loop.call_soon_threadsafe. A stream chunk carries every token that
queued up for its request since the consumer last looked: under load several tokens go out together in one
chunk, which keeps the event rate (and the event loop's work) bounded by how fast the consumer reads, not by
tokens/s. `stream_interval` N (SGLang's --stream-interval) holds a request's tokens until N of them are there
(or it finishes): N times fewer events for the server and the client to handle, at the price of text arriving
in steps of N tokens.

States: "loading" until the loader returned an engine and `engine.warmup()` (a one-token forward on every rank)
succeeded, then "ready"; a loader or warmup that raises leaves "failed" with `error` set, and so does an
engine step that raises (a TP rank that died) or an engine process that dies: its requests end with an error
chunk. stop() -> "stopped". Text stop strings are matched here (detokenize.TextDecoder): the request is
aborted in the engine at once.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import threading
from collections import Counter
from typing import Callable

from .._checks import check_number, check_positive_int, check_type, fail
from ..tinylm import ByteTokenizer
from .core import (AbortRequest, AddRequest, Command, EngineCore, Failed, Outputs, Stop, check_picklable,
                   run_engine_core)
from .detokenize import TextDecoder
from .processor import Processor, ProcessorThread, Prompt, TextProcessor
from .stream import Chunk, RequestStream, ServiceUnavailable
from .sampling import SamplingParams

log = logging.getLogger("labkit.serving")

COUNTERS = ("admitted", "prompt_tokens", "generation_tokens", "finished_stop", "finished_length", "finished_abort",
            "finished_error")
STOPPED = "the service stopped"


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except OSError:
        pass


def _run_all(callbacks: list) -> None:
    for callback in callbacks:
        callback()


class Service:
    """One Engine served to many asyncio clients. `load()` builds the Engine, or returns (engine, processor) or
    (engine, processor, tokenizer) when the model brings its own; it runs on the engine thread, so a slow load
    does not block the HTTP server. With process=True it runs in a spawned engine process instead: `load` must
    then be picklable (a module-level function or functools.partial of one, e.g. core.checkpoint_engine) and
    return an Engine, and `close` is not taken (the process closes its engine). `tokenizer` needs encode(text)
    -> ids and decode_bytes(ids) -> bytes (ByteTokenizer by default); `processor` makes the Prompts
    (TextProcessor(tokenizer) by default); `close(engine)`, if given, runs on the engine thread when it stops (a
    TP engine's rank processes). With process=True, `load_processor()` -> (processor, tokenizer), if given, runs in
    this process once the engine process is ready (a vision encoder: lab 07); until then the service is loading,
    and its failure fails the service. start() begins loading, stop() ends the threads (and the engine process)."""

    def __init__(self, load: Callable[[], object], tokenizer=None, close: Callable[[object], None] | None = None,
                 stream_interval: int = 1, processor: Processor | None = None, process: bool = False,
                 load_processor: Callable[[], tuple] | None = None):
        self.stream_interval = check_positive_int("stream_interval", stream_interval, "tokens")
        if not callable(load):
            fail("load", load, "a callable that returns an Engine (or an (engine, processor) pair)", TypeError)
        if close is not None and not callable(close):
            fail("close", close, "a callable close(engine), or None", TypeError)
        self._spawn = check_type("process", process, bool, "a bool (True: the engine in its own process)")
        if process:
            check_picklable("load", load)
            if close is not None:
                fail("close", close, "None with process=True (the engine process closes its engine)", TypeError)
        if load_processor is not None and not (process and callable(load_processor)):
            fail("load_processor", load_processor, "None, or with process=True a callable that returns (processor, "
                 "tokenizer) (with process=False, load() returns them)", TypeError)
        self._load_processor = load_processor
        self._load, self._close, self.tokenizer = load, close, tokenizer or ByteTokenizer()
        self.processor = TextProcessor(self.tokenizer) if processor is None else \
            check_type("processor", processor, Processor, "a Processor (chat(messages), completion(prompt)) or None")
        self._processing = ProcessorThread()
        self.state, self.error, self._engine = "loading", None, None
        self._commands: queue.Queue[Command] = queue.Queue()  # process=False: to the engine thread
        self._conn = self._child = None  # process=True: the pipe to the engine process, and the process
        self._send_lock = threading.Lock()
        self._tracks: dict[str, tuple[RequestStream, TextDecoder]] = {}  # submitted, not finished or dropped
        self._running: set[str] = set()  # admitted by the engine (output thread only)
        self._aborting: set[str] = set()  # dropped by their readers, not yet aborted by the engine
        self._held: dict[str, list[Chunk]] = {}  # output thread only: chunks waiting for stream_interval tokens
        self._counts = Counter(dict.fromkeys(COUNTERS, 0))
        self._engine_stats: dict = {}
        self._outbox: list = []  # (stream, callback for its loop), handed out by _publish
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._lock = threading.Lock()  # guards state changes against queueing a request (submit)
        self._thread = threading.Thread(target=self._run_process if process else self._run, name="labkit-engine",
                                        daemon=True)

    # --- any thread ----------------------------------------------------------------------------------------

    def start(self) -> "Service":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the engine runs: its thread (process=False), its process (process=True)."""
        if self._spawn:
            return self._child is not None and self._child.is_alive()
        return self._thread.is_alive()

    @property
    def engine_pid(self) -> int | None:
        """The id of the process the engine runs in (this one when process=False; None before it started)."""
        if not self._spawn:
            return os.getpid()
        return self._child.pid if self._child is not None else None

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until loading ended (either way); True when ready."""
        self._ready.wait(check_number("timeout", timeout, low=0.0, unit="seconds"))
        return self.state == "ready"

    def stop(self, timeout: float = 30.0) -> None:
        """End the engine (its thread, or its process: Stop, then a kill after `timeout` s); requests still
        running end with an error chunk ("the service stopped")."""
        check_number("timeout", timeout, low=0.0, unit="seconds")
        if self._spawn:
            if self.state in ("loading", "ready"):
                self._set_state("stopped")
            self._send(Stop())
            child = self._child
            if child is not None:
                child.join(timeout)
                if child.is_alive():
                    child.kill()
                    child.join(5)
        else:
            self._commands.put(Stop())
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._processing.close()
        if self.state != "failed":
            self.state = "stopped"

    def stats(self) -> dict:
        """The engine's stats() as of its last step, plus this service's totals: admitted (requests),
        prompt_tokens, generation_tokens (delivered) and finished_<reason> counts (stop, length, abort, error)."""
        return {**self._engine_stats, **self._counts}

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
        stream = RequestStream(rid, len(ids), asyncio.get_running_loop(), on_abort=lambda: self._abort(rid))
        with self._lock:
            if self.state != "ready":
                raise self._unavailable()
            self._tracks[rid] = (stream, decoder)
            self._send(AddRequest(rid, list(ids), params, tuple(mm)))
        try:
            error = await stream.admitted
        except asyncio.CancelledError:  # the client left before admission
            stream.abort()
            raise
        if error is not None:
            raise error
        return stream

    def _send(self, cmd: Command) -> None:
        """A command to the engine core: its thread's queue, or down the pipe to its process."""
        if not self._spawn:
            return self._commands.put(cmd)
        data = pickle.dumps(cmd, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            try:
                if self._conn is not None:
                    self._conn.send_bytes(data)
            except (OSError, ValueError):  # the process is gone: the output thread says so
                pass

    def _abort(self, rid: str) -> None:
        """The reader went away (or a stop string matched): forget the stream, drop the request in the engine."""
        self._drop(rid)
        self._send(AbortRequest(rid))

    def _drop(self, rid: str) -> None:
        """Forget the stream (no more chunks); finished_abort counts it once the engine aborted it."""
        self._held.pop(rid, None)
        if self._tracks.pop(rid, None) is not None:
            self._running.discard(rid)
            self._aborting.add(rid)

    def _set_state(self, state: str, error: str | None = None) -> None:
        with self._lock:  # no request gets queued after this: _shutdown sees them all
            self.state, self.error = state, error or self.error

    # --- the engine thread (process=False) -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._engine = self._load()
            if isinstance(self._engine, tuple):  # (engine, processor[, tokenizer]): the model's own
                self._engine, self.processor, *tokenizer = self._engine
                self.tokenizer = tokenizer[0] if tokenizer else self.tokenizer
                check_type("processor", self.processor, Processor, "a Processor")
            self._engine.warmup()
        except BaseException as e:  # a failed load is a state, not a crash of the thread
            self._loading_failed(f"loading the model failed: {type(e).__name__}: {e}")
            self._close_engine()
            return
        core = EngineCore(self._engine)
        self._became_ready()
        while self.state == "ready":
            cmd = self._next_command() if core.busy else self._commands.get()  # idle: block
            while cmd is not None:
                if not core.handle(cmd):
                    self._set_state("stopped")
                    break
                cmd = self._next_command()
            if self.state == "ready":
                self._receive(core.step())
        self._shutdown()
        self._close_engine()

    def _next_command(self) -> Command | None:
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _close_engine(self) -> None:
        if self._close is not None and self._engine is not None:
            try:
                self._close(self._engine)
            except Exception:  # noqa: BLE001 - stopping anyway: say why, end the thread cleanly
                log.exception("closing the engine failed")

    # --- the output thread (process=True) ------------------------------------------------------------------

    def _run_process(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # torch and fork do not mix
        conn, child_conn = ctx.Pipe()
        child = ctx.Process(target=run_engine_core, args=(self._load, child_conn), name="labkit-engine-core",
                            daemon=False)  # not a daemon: a TP engine's ranks are its children
        with self._send_lock:
            if self.state == "stopped":  # stopped before it started
                return self._ready.set()
            child.start()
            self._conn, self._child = conn, child
        atexit.register(_close_quietly, conn)  # an interpreter that exits without stop(): the child sees EOF and
        # ends, so multiprocessing's exit hook, which joins non-daemon children, does not wait forever
        child_conn.close()  # this end is the child's: its death closes the pipe (EOFError here)
        try:
            first = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            first = Failed(f"loading the model failed: the engine process died (exit code {self._exitcode()})")
        if isinstance(first, Failed) or self.state != "loading":
            if isinstance(first, Failed):
                self._loading_failed(first.error)
            self._ready.set()
            return self._end_process()
        self._engine_stats = first.stats
        if self._load_processor is not None:  # after the engine: a release the ranks cannot load is named by them
            try:
                self.processor, self.tokenizer = self._load_processor()
                check_type("processor", self.processor, Processor, "a Processor")
            except BaseException as e:  # noqa: BLE001 - a failed load is a state
                self._loading_failed(f"loading the processor failed: {type(e).__name__}: {e}")
                return self._end_process()
        self._became_ready()
        try:
            while self.state == "ready":
                out = pickle.loads(conn.recv_bytes())
                self._receive(out)
        except (EOFError, OSError):
            if self.state == "ready":
                log.error("the engine process died (exit code %s)", self._exitcode())
                self._set_state("failed", f"the engine process died (exit code {self._exitcode()})")
        self._shutdown()
        self._end_process()

    def _exitcode(self):
        if self._child is not None:
            self._child.join(1)
            return self._child.exitcode
        return None

    def _end_process(self) -> None:
        """Stop the engine process (it closes its engine) and wait for it; a kill if it does not end."""
        self._send(Stop())
        self._child.join(30)
        if self._child.is_alive():
            self._child.kill()
            self._child.join(5)
        with self._send_lock:
            self._conn.close()

    # --- either: turning the core's Outputs into stream chunks -----------------------------------------------

    def _loading_failed(self, error: str) -> None:
        self._set_state("failed", error)
        self._ready.set()
        self._shutdown()  # refuses what was submitted meanwhile

    def _became_ready(self) -> None:
        with self._lock:
            if self.state == "loading":
                self.state = "ready"
        self._ready.set()

    def _receive(self, out: Outputs) -> None:
        """One step's Outputs: admissions and refusals settle their submit(), tokens become text, then they
        are handed out (_publish)."""
        self._engine_stats = out.stats or self._engine_stats
        for rid in out.admitted:
            track = self._tracks.get(rid)
            if track is not None:  # None: its client left meanwhile (the abort follows in the engine)
                self._running.add(rid)
                self._counts["admitted"] += 1
                self._counts["prompt_tokens"] += track[0].num_prompt_tokens
                self._admit(track[0], None)
        for rid in out.aborted:
            if rid in self._aborting:
                self._aborting.discard(rid)
                self._counts["finished_abort"] += 1
        for rid, error in out.refused:
            track = self._tracks.pop(rid, None)
            if track is not None:
                self._admit(track[0], error)
        for rid, token_id, reason in out.tokens:
            self._token(rid, token_id, reason)
        if out.error is not None:
            log.error("%s", out.error)
            self._set_state("failed", out.error)
        self._publish()

    def _token(self, rid: str, token_id: int, reason: str | None) -> None:
        track = self._tracks.get(rid)
        if track is None:
            return
        stream, decoder = track
        text, stopped = decoder.feed(token_id)
        self._counts["generation_tokens"] += 1
        if stopped:
            self._send(AbortRequest(rid))
            self._finish(rid, Chunk(text, 1, "stop"))
        elif reason in ("stop", "length"):
            self._finish(rid, Chunk(text + decoder.flush(), 1, reason))
        elif reason is not None:
            self._finish(rid, Chunk(text, 1, error=f"the engine ended the request ({reason})"))
        elif self.stream_interval == 1:
            self._deliver(stream, Chunk(text, 1))
        else:  # hold tokens until stream_interval of them are there (SGLang's --stream-interval)
            held = self._held.setdefault(rid, [])
            held.append(Chunk(text, 1))
            if len(held) >= self.stream_interval:
                self._deliver(stream, Chunk.merge(self._held.pop(rid)))

    def _admit(self, stream: RequestStream, error) -> None:
        def settle():
            if not stream.admitted.done():
                stream.admitted.set_result(error)
        self._outbox.append((stream, settle))

    def _finish(self, rid: str, chunk: Chunk) -> None:
        track = self._tracks.pop(rid, None)
        self._running.discard(rid)
        held = self._held.pop(rid, [])
        if track is None:  # dropped meanwhile by its reader
            return
        chunk = Chunk.merge(held + [chunk])
        self._counts[f"finished_{chunk.finish_reason or 'error'}"] += 1
        self._deliver(track[0], chunk)

    def _deliver(self, stream: RequestStream, chunk: Chunk) -> None:
        self._outbox.append((stream, lambda: stream.put(chunk)))

    def _publish(self) -> None:
        """Hand out what this step produced (the stats were taken first: a reader that sees a token sees stats
        at least as new as the step that made it). One wake-up per event loop per step, however many streams."""
        outbox, self._outbox = self._outbox, []
        by_loop: dict = {}
        for stream, callback in outbox:
            by_loop.setdefault(stream.loop, []).append((stream, callback))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_run_all, [callback for _, callback in items])
            except RuntimeError:  # its event loop is closed: nobody is reading any more
                for stream, _ in items:
                    self._abort(stream.request_id)

    def _shutdown(self) -> None:
        """Stopped or failed: every running request ends with an error chunk, the others are refused."""
        why = STOPPED if self.state == "stopped" else "the engine failed; the request was dropped"
        with self._lock:  # no request gets submitted any more: these are all of them
            rids = list(self._tracks)
        for rid in rids:
            if rid in self._running:
                self._finish(rid, Chunk(error=why))
            elif (track := self._tracks.pop(rid, None)) is not None:
                self._admit(track[0], ServiceUnavailable(self.state, f"the service is {self.state}"))
        self._publish()
