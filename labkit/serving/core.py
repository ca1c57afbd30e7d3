"""The engine core: an Engine driven by typed messages, in the service's own thread or in its own process (issue
27; the split of vLLM V1's AsyncLLM / EngineCoreClient / EngineCoreProc, vllm/v1/engine/core_client.py).

    API process (HTTP, tokenization, detokenization, stop strings)       engine-core process (spawned)
    Service.submit --> AddRequest(request_id, token_ids, params, mm) -->  EngineCore.handle: engine.add_request
    stream.abort / a stop string --> AbortRequest(request_id)        -->  engine.abort
    Service.stop   --> Stop                                          -->  engine.close(), the process ends
    Service's output thread <-- Outputs (one per engine step: new tokens, finishes, admissions, refusals, stats)
                            <-- Ready(pid) once built and warmed up, or Failed(error)

The messages are frozen dataclasses pickled whole (pickle.dumps: tensors of images by value). The process is
started with "spawn" (torch and fork do not mix) and builds its engine with `build()`, a picklable callable
(a module-level function, or functools.partial of one: checkpoint_engine below), then warms it up, then says
Ready. It is not a daemon, so a TP engine's gloo ranks (labkit.serving.tp) can be its children; Stop closes the
engine (its ranks) before the process exits, and a parent that went away (the pipe closed) ends it too.
"""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass, field
from typing import Callable

from .._checks import fail
from .sampling import SamplingParams


# --- messages in -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AddRequest:
    """Admit a request (the answer comes back in Outputs: `admitted`, or `refused` with the engine's error)."""
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    mm: tuple = ()  # images (labkit.serving.mm.MultiModalInput), lab 07


@dataclass(frozen=True)
class AbortRequest:
    """The reader went away or a stop string matched: the request leaves the engine (its blocks are freed)."""
    request_id: str


@dataclass(frozen=True)
class Stop:
    """End the engine core (a process closes its engine and exits)."""


Command = AddRequest | AbortRequest | Stop


# --- messages out ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outputs:
    """What one engine step (and the commands before it) produced: `tokens` (request_id, token_id, finish_reason
    or None) for every request that made a token, `admitted` and `aborted` request ids, `refused` (request_id,
    the engine's exception), `stats` engine.stats() after the step, `error` set when the engine failed (the core
    is over)."""
    tokens: tuple[tuple[str, int, str | None], ...] = ()
    admitted: tuple[str, ...] = ()
    aborted: tuple[str, ...] = ()
    refused: tuple[tuple[str, BaseException], ...] = ()
    stats: dict = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Ready:
    """The engine was built and warmed up in process `pid`; `stats` its engine.stats() then (the warmup's)."""
    pid: int
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """Building or warming up the engine failed (`error` says why); the process ends."""
    error: str


# --- the loop both backends run --------------------------------------------------------------------------------

class EngineCore:
    """An Engine behind commands: handle() each command, then step() once per loop; both return into one Outputs.
    The one caller of the engine (it is not thread-safe). Finished and aborted requests are released at once."""

    def __init__(self, engine):
        self.engine = engine
        self._admitted: list[str] = []
        self._aborted: list[str] = []
        self._refused: list[tuple[str, BaseException]] = []

    def handle(self, cmd: Command) -> bool:
        """Apply one command; False for Stop."""
        if isinstance(cmd, Stop):
            return False
        if isinstance(cmd, AbortRequest):
            self._quietly("abort", cmd.request_id)
            self._quietly("release", cmd.request_id)
            self._aborted.append(cmd.request_id)
            return True
        try:  # mm= only with images: a text engine's add_request need not know it
            self.engine.add_request(cmd.token_ids, params=cmd.params, request_id=cmd.request_id,
                                    **({"mm": cmd.mm} if cmd.mm else {}))
        except (ValueError, TypeError) as e:
            self._refused.append((cmd.request_id, e))
        except Exception as e:  # noqa: BLE001 - not a refusal: report it as an internal error
            self._refused.append((cmd.request_id,
                                  RuntimeError(f"engine failed to admit the request: {type(e).__name__}")))
        else:
            self._admitted.append(cmd.request_id)
        return True

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> Outputs:
        """One engine step (when there is work) and what the commands since the last one did."""
        tokens, error = [], None
        if self.engine.has_unfinished():
            try:
                outs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - the engine is broken: the service fails, in-band
                error = f"the engine failed: {type(e).__name__}: {e}"
                outs = []
            for out in outs:
                reason = out.finish_reason if out.finished else None
                tokens.append((out.request_id, out.token_id, reason))
                if out.finished:
                    self._quietly("release", out.request_id)
        try:
            stats = dict(self.engine.stats())
        except Exception:  # noqa: BLE001
            stats = {}
        out = Outputs(tuple(tokens), tuple(self._admitted), tuple(self._aborted), tuple(self._refused), stats, error)
        self._admitted, self._aborted, self._refused = [], [], []
        return out

    def news(self, out: Outputs, last: Outputs | None) -> bool:
        """Whether `out` says anything `last` (the previous one sent) did not: worth a message."""
        return bool(out.tokens or out.admitted or out.aborted or out.refused or out.error) or \
            last is None or out.stats != last.stats

    def _quietly(self, method: str, rid: str) -> None:
        try:  # best effort: the request may be unknown or unfinished
            getattr(self.engine, method)(rid)
        except Exception:  # noqa: BLE001
            pass


def check_picklable(name: str, value) -> None:
    """TypeError naming `name` when `value` cannot go to a spawned process (a lambda, a closure)."""
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - pickle raises several kinds
        fail(name, value, "picklable (a module-level function or functools.partial of one): it runs in the engine "
                          "process", TypeError)


def run_engine_core(build: Callable[[], object], conn) -> None:
    """The engine process's main: build and warm up the engine, say Ready (or Failed), then serve commands from
    `conn` (a multiprocessing Connection; messages as pickle bytes) until Stop or until the parent is gone."""
    engine = None
    try:
        engine = build()
        if isinstance(engine, tuple):
            raise TypeError("a loader that returns (engine, processor[, tokenizer]) runs in the service's thread "
                            "(its processor serves the API process), not in an engine process")
        engine.warmup()
    except BaseException as e:  # noqa: BLE001 - said to the parent, which reports it
        _send(conn, Failed(f"loading the model failed: {type(e).__name__}: {e}"))
        _close(engine)
        return
    _send(conn, Ready(os.getpid(), dict(engine.stats())))
    core = EngineCore(engine)
    try:
        running, last = True, None
        while running:
            if not core.busy:
                running = core.handle(pickle.loads(conn.recv_bytes()))  # idle: block for the next command
            while running and conn.poll():
                running = core.handle(pickle.loads(conn.recv_bytes()))
            if running:
                out = core.step()
                if core.news(out, last):
                    _send(conn, out)
                    last = out
                running = out.error is None
    except (EOFError, OSError):  # the parent went away
        pass
    finally:
        _close(engine)


def _send(conn, message) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _close(engine) -> None:
    try:
        if engine is not None:
            engine.close()
    except Exception:  # noqa: BLE001 - ending anyway
        traceback.print_exc()


def checkpoint_engine(path, tp: int, config, threads: int | None = None):
    """The Engine serving the TinyLM release folder `path` (load_pretrained, e.g. data/tinylm) with `config`
    (EngineConfig), on `tp` gloo ranks when tp > 1, torch on `threads` threads (None: as it is): what
    `python -m labkit.serving --model PATH` runs (picklable with functools.partial, so an engine process can
    build it)."""
    import torch
    from ..tinylm import load_pretrained
    if threads is not None:
        torch.set_num_threads(threads)
    model, _ = load_pretrained(path)
    if tp > 1:  # the model over tp gloo processes (imported only when asked for)
        from .tp import tp_engine
        return tp_engine(model, tp, config=config)
    from .engine import Engine
    return Engine(model, config=config)
