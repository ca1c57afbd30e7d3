"""One request forwarded through the router to one replica, and the bookkeeping that accounts for it (notebook 08,
sections 3 and 4; labkit.cluster.router decides where it goes and when to try again).

    Attempt   the HTTP exchange with one replica: a task that sends the body and pumps the replica's answer into
              a queue as ("start", response), ("data", bytes) ..., ("end", None), or ("error", Failure). The
              router cancels it when the registry removes the replica (cancel(why): the reader gets a Failure
              at once) and closes it when the client leaves (close(): the upstream connection is dropped, so
              the replica's server sees the disconnect and aborts the request).
    Ticket    one client request's outcome, recorded exactly once: "answered", "failed" or "refused" (through
              the router's count(), the only writer of its counters). They add up because every request holds
              one ticket from its first byte to its last: requests == answered + failed + refused + in_flight
              (in_flight counted, not derived).
    SSEBuffer cuts the replica's byte stream at event boundaries ("\\n\\n"), so the router forwards whole events
              and, when the replica breaks mid-event, drops the half event before its in-band error.
    forward   the retry loop: choose, attempt, and on a failure before the first byte choose again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

import httpx
from fastapi.responses import Response, StreamingResponse

from ..serving import protocol

OUTCOMES = ("answered", "failed", "refused")


@dataclass(frozen=True)
class Failure:
    """Why a forward did not complete: `message` for the client's error body; `connection` True when the
    connection itself failed (refused, reset, closed mid-answer, timed out): the router marks the replica down."""
    message: str
    connection: bool = False


def describe(error: Exception) -> str:
    """An error (an httpx transport error, mostly) in a few words: its class and its message when it has one."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Attempt:
    """POST `content` (the client's JSON body, bytes unchanged) to `url` on `client`, the answer pumped into
    `queue` by a task started now (on the running loop). `on_end` runs once, when the attempt is closed."""

    def __init__(self, client: httpx.AsyncClient, replica_id: str, url: str, content: bytes,
                 on_end: Callable[["Attempt"], None]):
        self.replica_id, self.url = replica_id, url
        self.queue: asyncio.Queue = asyncio.Queue()
        self._on_end, self._closed = on_end, False
        self.task = asyncio.ensure_future(self._pump(client, content))

    async def _pump(self, client: httpx.AsyncClient, content: bytes) -> None:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        try:
            async with client.stream("POST", self.url, content=content, headers=headers) as response:
                self.queue.put_nowait(("start", response))
                async for data in response.aiter_bytes():
                    self.queue.put_nowait(("data", data))
            self.queue.put_nowait(("end", None))
        except Exception as e:  # noqa: BLE001 - whatever ends the exchange, the reader must hear of it, never wait
            # a TransportError (refused, reset, closed mid-body, timed out) is the connection's: the replica is
            # marked down; anything else (a body httpx cannot decode, a client closed by Router.stop(), a bug) is
            # a failed attempt. CancelledError (cancel(), close()) is not an Exception: it passes.
            self.queue.put_nowait(("error", Failure(describe(e), connection=isinstance(e, httpx.TransportError))))

    async def next(self, request=None, poll: float = 0.1):
        """The next (kind, value) from the queue. With `request` (the client's starlette Request), checks every
        `poll` s that the client is still there: None when it left. Without `request` (a committed stream, whose
        client starlette watches itself): just the next message, no task and no polling per chunk."""
        if request is None:
            return await self.queue.get()
        getter = asyncio.ensure_future(self.queue.get())
        try:
            while not (await asyncio.wait({getter}, timeout=poll))[0]:
                if await request.is_disconnected():
                    return None
            return getter.result()
        finally:
            getter.cancel()  # a no-op once it returned; a pending get takes nothing from the queue

    def cancel(self, why: str) -> None:
        """The replica is gone: stop the exchange, and the reader gets ("error", Failure(why)) next."""
        if not self.task.done():
            self.task.cancel()
            self.queue.put_nowait(("error", Failure(why)))

    def close(self) -> None:
        """Drop the exchange (closing the upstream connection if it is still open); idempotent."""
        self.task.cancel()
        if not self._closed:
            self._closed = True
            self._on_end(self)


class Ticket:
    """One request's outcome, reported through `count` (Router.count: count(name=delta, ...) changes the
    router's counters in one step): counted as a request in flight at creation, resolved once (in_flight - 1,
    the outcome + 1), so a snapshot taken from another thread always adds up. `detail` keeps why."""

    def __init__(self, count: Callable[..., None]):
        self.count, self.outcome, self.detail = count, None, ""
        count(requests=1, in_flight=1)

    def resolve(self, outcome: str, detail: str = "") -> bool:
        """Record `outcome` (one of OUTCOMES) if none was recorded yet; True when this call recorded it."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        if self.outcome is not None:
            return False
        self.outcome, self.detail = outcome, detail
        self.count(**{outcome: 1, "in_flight": -1})
        return True


class SSEBuffer:
    """Bytes in, whole server-sent events out (each with its "\\n\\n"); remembers whether [DONE] or an error
    event went by."""

    def __init__(self):
        self._pending = b""
        self.done = False   # a `data: [DONE]` event was seen
        self.error = False  # a `data: {"error": ...}` event was seen (the replica's own in-band error)

    def feed(self, data: bytes) -> list[bytes]:
        """The events `data` completes (none while an event is still partial)."""
        self._pending += data.replace(b"\r\n", b"\n")
        *events, self._pending = self._pending.split(b"\n\n")
        out = []
        for event in events:
            if not event.strip():
                continue
            if event.startswith(b"data: [DONE]"):
                self.done = True
            elif event.startswith(b'data: {"error"'):
                self.error = True
            out.append(event + b"\n\n")
        return out


def unavailable(message: str, code: str) -> protocol.APIError:
    """A 503 in OpenAI's body (type service_unavailable_error): no replica could answer."""
    return protocol.APIError(503, message, type="service_unavailable_error", code=code)


def _said(status: int, content: bytes) -> str:
    """What a replica's error answer says: HTTP status and its OpenAI error message when it has one."""
    try:
        message = protocol.parse_body(content)["error"]["message"]
    except (protocol.APIError, KeyError, TypeError):
        message = content[:200].decode("utf-8", "replace").strip()
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


CLIENT_LEFT = "the client disconnected"


async def forward(router, request, path: str, content: bytes, body: dict, model: str, ticket: Ticket) -> Response:
    """Forward one generation request (`content`: its body as sent; `body`: parsed; `model`: checked) through
    `router` (labkit.cluster.router.Router): the answer to send the client, `ticket` resolved (or, for a
    committed stream, resolved when the stream ends). Raises the 503 when no replica answered."""
    tried, said = [], []
    while len(tried) <= router.retries and not router.closing:  # a stopping router's client is closing: no retry
        candidates = [r for r in router.registry.healthy(model) if r.id not in tried]
        if not candidates:
            break
        replica = router.policy.choose(candidates, body)
        if tried:
            router.count(retried=1)
        tried.append(replica.id)
        attempt, result = router.open(replica, path, content), None
        try:
            result = await _first(router, attempt, request, ticket)
        finally:
            if not isinstance(result, _Forwarded):  # the stream closes it when it ends
                attempt.close()
        if not isinstance(result, Failure):
            return result
        if result.connection:
            router.connection_failed(replica.id, result.message)
        said.append(f"{replica.id} ({replica.url}): {result.message}")
    if not said:
        raise (unavailable("the router is stopping", "router_stopping") if router.closing else
               unavailable(f"no healthy replica serves {model!r}", "no_healthy_replica"))
    raise unavailable(f"no replica answered ({len(said)} tried, retries={router.retries}): " + "; ".join(said),
                      "all_replicas_failed")


async def _first(router, attempt: Attempt, request, ticket: Ticket):
    """Read `attempt` up to the point of no return: a Failure (nothing sent yet: retry), the whole answer (a
    non-streamed 2xx or any 4xx), or a _Forwarded stream holding its first events."""
    message = await attempt.next(request)
    if message is None:
        return _left(ticket)
    kind, value = message
    if kind != "start":
        return value if kind == "error" else Failure("the replica closed the connection without answering", True)
    status, ctype = value.status_code, value.headers.get("content-type", "application/json")
    if status < 300 and ctype.startswith("text/event-stream"):
        buffer, events = SSEBuffer(), []
        while not events:
            message = await attempt.next(request)
            if message is None:
                return _left(ticket)
            kind, data = message
            if kind != "data":
                return data if kind == "error" else Failure("the replica ended its stream before any event")
            events = buffer.feed(data)
        return _Forwarded(router, attempt, buffer, events, ticket)
    chunks = []
    while (message := await attempt.next(request)) is not None and message[0] == "data":
        chunks.append(message[1])
    if message is None:
        return _left(ticket)
    if message[0] == "error":
        return message[1]
    answer = b"".join(chunks)
    if status >= 500:
        return Failure(_said(status, answer))
    ticket.resolve("answered" if status < 400 else "refused", "" if status < 400 else _said(status, answer))
    return Response(answer, status_code=status, media_type=ctype)


def _left(ticket: Ticket) -> Response:
    ticket.resolve("failed", CLIENT_LEFT)
    return Response(b"", status_code=499)


class _Forwarded(StreamingResponse):
    """A committed stream: the replica's events forwarded whole, ending at its [DONE]; a failure after the first
    event (the replica died, was removed, or broke off) ends it in-band with an error event and [DONE]."""

    def __init__(self, router, attempt: Attempt, buffer: SSEBuffer, first: list[bytes], ticket: Ticket):
        self.router, self.attempt, self.buffer, self.ticket = router, attempt, buffer, ticket
        super().__init__(self._events(first), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _events(self, events: list[bytes]):
        failure = None
        while True:
            # the replica's own in-band error fails the request before its event goes out: a client that stops
            # reading at the error (the openai client raises) must not turn it into "the client left"
            if self.buffer.error and self.ticket.resolve("failed", "the replica's own in-band error"):
                self.router.count(inband_errors=1)
            for event in events:
                yield event
            if self.buffer.done:
                break
            kind, value = await self.attempt.next()
            if kind != "data":
                failure = value if kind == "error" else Failure("the replica closed the stream before [DONE]")
                break
            events = self.buffer.feed(value)
        if failure is None:
            self.attempt.close()
            self.ticket.resolve("answered")  # no-op after the replica's own error
            return
        if failure.connection:
            self.router.connection_failed(self.attempt.replica_id, failure.message)
        self.router.count(inband_errors=1)
        self.ticket.resolve("failed", failure.message)
        error = protocol.APIError(502, f"{self.attempt.replica_id} failed mid-stream: {failure.message}",
                                  type="server_error", code="replica_failed")
        yield protocol.sse(error.body())
        yield protocol.sse("[DONE]")

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # the client left (or the stream ended): drop the upstream, account for the request
            self.attempt.close()
            self.ticket.resolve("failed", CLIENT_LEFT)
