"""Fixtures for the router's tests (test_router, test_load): an in-process router (labkit.cluster.router on
labkit.serving's ServerThread), two real replicas (`python -m labkit.serving`, 1 thread each) registered with a
shared one, and fake replicas (small FastAPI apps) that answer 503, hang, or break a stream on purpose."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from labkit.cluster.launch import start_replica
from labkit.cluster.policies import make_policy
from labkit.cluster.registry import Registry
from labkit.cluster.router import Router, make_router_app
from labkit.serving import ServerThread, protocol
from tests.serving.answers import Recorder


class LocalRouter:
    """A Router served in this process on a free port: .router (its state), .root, .url (/v1), .client();
    .undocumented() the answers it gave that its /openapi.json does not list (tests/serving/answers.py)."""

    def __init__(self, policy: str = "round_robin", heartbeat_timeout: float = 1.0, **options):
        self.router = Router(Registry(heartbeat_timeout), make_policy(policy), **options)
        app = make_router_app(self.router)
        self.schema, self.recorder = app.openapi(), Recorder(app)
        self.server = ServerThread(self.recorder).start()
        self.root, self.url = self.server.url, self.server.url + "/v1"
        self.replica_processes, self.ids = [], []

    @property
    def registry(self) -> Registry:
        return self.router.registry

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key="any", max_retries=0, timeout=timeout)

    def register(self, url: str, model: str = "tinylm") -> str:
        reply = httpx.post(self.root + "/replicas", json={"url": url, "model": model})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def replicas(self) -> list[dict]:
        return httpx.get(self.root + "/replicas").json()["data"]  # over HTTP: the registry lives on the server's loop

    def routed(self) -> dict[str, int]:
        return {r["id"]: r["routed"] for r in self.replicas()}

    def undocumented(self) -> list[str]:
        return self.recorder.undocumented(self.schema)

    def stop(self) -> None:
        self.server.stop()


@contextlib.contextmanager
def local_router(**options):
    router = LocalRouter(**options)
    try:
        yield router
    finally:
        router.stop()
    assert router.undocumented() == []


@contextlib.contextmanager
def heartbeats(root: str, ids, interval: float = 0.1):
    """Heartbeat replicas `ids` (a list, or a function returning the ids to beat now) at the router `root` from a
    thread, every `interval` s (for replicas registered by hand)."""
    stop = threading.Event()

    def beat():
        while not stop.wait(interval):
            for id in (ids() if callable(ids) else ids):
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(f"{root}/replicas/{id}/heartbeat", json={"running": 0, "waiting": 0}, timeout=3)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


class FakeReplica:
    """A replica that misbehaves on purpose: mode "503" answers every generation request 503 (OpenAI's body);
    "hang" sends `events` stream events (0: nothing, not even headers) then waits until stop(); "break" sends
    `events` events then drops the connection mid-body; "end" sends `events` events and ends its body cleanly
    without [DONE]; "inband" sends `events` events, its own in-band error event and [DONE]; "inband-hang" the
    same without [DONE], waiting until stop(). `calls` counts generation requests; `left` the callers that hung up
    while it was hanging (before its headers or mid-stream)."""

    def __init__(self, mode: str, events: int = 0):
        self.mode, self.events, self.calls, self.left = mode, events, 0, 0
        self.released = threading.Event()
        app = FastAPI()

        async def hang(request: Request) -> bool:
            """Wait until stop(); True if the caller hung up first."""
            while not self.released.is_set():
                if await request.is_disconnected():
                    self.left += 1
                    return True
                await asyncio.sleep(0.05)
            return False

        async def stream(request: Request):
            reply = protocol.Reply("completion", "tinylm")
            for i in range(self.events):
                yield protocol.sse(reply.chunk(f"t{i} "))
            if self.mode == "break":
                raise RuntimeError("the fake replica breaks its stream (on purpose)")
            if self.mode == "end":
                return
            if self.mode.startswith("inband"):
                yield protocol.sse(protocol.APIError(500, "the fake engine failed", type="server_error").body())
            if self.mode == "inband":
                yield protocol.sse("[DONE]")
                return
            try:
                await hang(request)
            except asyncio.CancelledError:  # starlette cancels a stream whose caller hung up
                if not self.released.is_set():
                    self.left += 1
                raise

        @app.post("/v1/completions")
        async def completions(request: Request):
            self.calls += 1
            if self.mode == "503":
                error = protocol.APIError(503, "the fake replica is not ready", type="service_unavailable_error",
                                          code="model_not_ready")
                return JSONResponse(error.body(), status_code=503)
            if self.events == 0 and await hang(request):
                return Response(status_code=499)
            return StreamingResponse(stream(request), media_type="text/event-stream")

        self.server = ServerThread(app).start()
        self.url = self.server.url + "/v1"

    def stop(self) -> None:
        self.released.set()
        self.server.stop()


@contextlib.contextmanager
def fake_replica(mode: str, events: int = 0):
    fake = FakeReplica(mode, events)
    try:
        yield fake
    finally:
        fake.stop()


@contextlib.contextmanager
def raw_server(respond):
    """A TCP server on a free loopback port that answers each connection with respond(conn) (on its own thread,
    after reading the request's head): for answers no well-behaved server sends. Yields its /v1 base URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                head += data
            respond(conn)

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener was closed
            while True:
                threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        listener.close()


def sse_head(extra: bytes = b"transfer-encoding: chunked\r\n") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + extra + b"\r\n"


def chunked(data: bytes) -> bytes:
    """`data` as one chunk of a chunked HTTP body."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.fixture(scope="session")
def shared():
    """A round-robin LocalRouter (heartbeat timeout 3 s: heartbeats late on a busy machine do not remove
    anyone) with two real TinyLM replicas registered by their Registrars; the replicas' ServiceProcesses in
    shared.replica_processes, their ids in shared.ids (registration order). Tests may change shared.router.policy."""
    router = LocalRouter("round_robin", heartbeat_timeout=3.0)
    try:
        with ThreadPoolExecutor(2) as pool:  # side by side: a replica's start is mostly waiting for torch
            futures = [pool.submit(start_replica, router.root, heartbeat_interval=0.2, timeout=90) for _ in range(2)]
        router.replica_processes = [f.result() for f in futures if f.exception() is None]
        for f in futures:
            f.result()
        by_url = {r["url"]: r["id"] for r in router.replicas()}
        router.ids = [by_url[r.url] for r in router.replica_processes]
        yield router
    finally:
        for replica in router.replica_processes:
            replica.stop()
        router.stop()
    assert router.undocumented() == []


def accounted(stats: dict) -> bool:
    """The router's counters add up: every request answered, failed, refused or still in flight."""
    return stats["requests"] == stats["answered"] + stats["failed"] + stats["refused"] + stats["in_flight"]


def settled(router, timeout: float = 10.0) -> dict:
    """The router's counters once nothing is in flight: a client sees a stream's last event (an in-band error
    included) a moment before the router's handler returns and counts the request."""
    wait_until(lambda: router.stats()["in_flight"] == 0, timeout)
    return router.stats()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
