"""The router: one OpenAI-compatible endpoint in front of many replicas of lab 06's service (notebook 08, sections
2-4; `python -m labkit.cluster` serves it, labkit.cluster.launch starts it as a process).

    router = Router(Registry(heartbeat_timeout=1.0), make_policy("prefix_affinity"), retries=2)
    server = ServerThread(make_router_app(router), port=0).start()     # labkit.serving's uvicorn thread

    POST /v1/completions, /v1/chat/completions   forwarded to a healthy replica of the body's "model", chosen by
                                                 the policy; streams (SSE) forwarded event by event
    GET  /v1/models                              the models the healthy replicas serve (OpenAI's list)
    GET  /health                                 200 {"status": "ok", "replicas": n} with n >= 1 healthy, else 503
    POST /replicas, POST /replicas/{id}/heartbeat, DELETE /replicas/{id}   discovery (labkit.serving.register)
    GET  /replicas                               the registry as JSON (replicas, their events, the timeout)
    GET  /metrics                                Prometheus text, "labkit_router:..." (labkit.cluster.counters)
    GET  /openapi.json                           these routes, FastAPI's generated schema with every status each
                                                 answers and the replicas' request bodies (no /docs page)

Forwarding a request (client -> router -> replica):

    choose among healthy(model) not tried yet ──> Attempt ──> connection error / 5xx / removed ──┐
          ^                                         │ before any byte went to the client          │
          └──────────── retry (at most `retries`, never the same replica twice) <─────────────────┘
                                                    │ 4xx: the client's error, passed through (refused)
                                                    │ 2xx: forwarded; a stream is committed with its first event,
                                                    v      after which a failure ends it in-band:
                                       data: {"error": {...}}  then  data: [DONE]      (never a hang)

A POST whose Content-Type is not application/json is refused here with the replicas' 415 (never forwarded); a
method a path does not serve is a 405 whose `Allow` lists those it does (labkit.serving.protocol).
Every replica failing is a 503 naming what each said; no healthy replica a 503; a model no replica serves a 404
model_not_found. A background task calls registry.expire() every `expire_interval` s and cancels the in-flight
forwards of each removed replica (handled as above: retried, or ended in-band). The counters always satisfy
requests == answered + failed + refused + in_flight (labkit.cluster.forward.Ticket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from .._checks import check_int, check_positive, check_type, fail
from ..serving import protocol
from ..serving import register as discovery
from .counters import metrics_text
from .forward import Attempt, Ticket, forward, unavailable
from .policies import Policy
from .registry import Registry, RegistryError

log = logging.getLogger("labkit.cluster")
APIError = protocol.APIError


class Router:
    """Routing state: the `registry` (who is up), the `policy` (who gets the next request; it may be swapped
    between requests), `retries` (re-sends to other replicas before the first byte), the upstream timeouts (s:
    to connect, and between two reads), how often the registry is expired (s), the heartbeat interval the
    registration answer suggests (s; default heartbeat_timeout / 4), the counters, and the forwards in flight
    per replica (`attempts`). Its HTTP client and expiry task live on the serving loop, from start()
    (make_router_app's lifespan) to stop(). stats() may be read from any thread."""

    def __init__(self, registry: Registry, policy: Policy, retries: int = 2, connect_timeout: float = 1.0,
                 read_timeout: float = 30.0, expire_interval: float = 0.1, heartbeat_interval: float | None = None):
        self.registry = check_type("registry", registry, Registry, "a labkit.cluster.registry.Registry")
        self.policy = check_type("policy", policy, Policy, "a Policy (labkit.cluster.policies.make_policy)")
        self.retries = check_int("retries", retries, 0, unit="re-sends")
        self.connect_timeout = check_positive("connect_timeout", connect_timeout, unit="s")
        self.read_timeout = check_positive("read_timeout", read_timeout, unit="s")
        self.expire_interval = check_positive("expire_interval", expire_interval, unit="s")
        if heartbeat_interval is None:
            heartbeat_interval = registry.heartbeat_timeout / 4
        self.heartbeat_interval = check_positive("heartbeat_interval", heartbeat_interval, unit="s")
        self.counters = {k: 0 for k in ("requests", "answered", "failed", "refused", "in_flight", "retried",
                                        "inband_errors", "removals")}
        self.attempts: dict[str, set[Attempt]] = {}
        self.client: httpx.AsyncClient | None = None
        self.closing = False  # stop() began: forwards end, none is retried
        self._expiry: asyncio.Task | None = None

    def count(self, **deltas: int) -> None:
        """Add `deltas` to the counters in one dict.update (a snapshot from another thread always adds up); the
        only way they change (tickets, retries, in-band errors, removals)."""
        for name in deltas:
            if name not in self.counters:
                fail("counter", name, f"one of {sorted(self.counters)}")
        self.counters.update({name: self.counters[name] + d for name, d in deltas.items()})

    def ticket(self) -> Ticket:
        """A new request, in flight until its Ticket is resolved."""
        return Ticket(self.count)

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered, failed or refused."""
        return self.counters["in_flight"]

    def stats(self) -> dict:
        """A consistent snapshot of the counters (safe from another thread) and the replicas' counts: what /metrics
        reports, as a dict."""
        replicas = self.registry.replicas()
        return {**dict(self.counters), "replicas_healthy": sum(r.state == "up" for r in replicas),
                "replicas_registered": len(replicas)}

    async def start(self) -> None:
        """Open the upstream client and start the expiry task (on the serving loop)."""
        timeout = httpx.Timeout(self.read_timeout, connect=self.connect_timeout)
        # idle connections expire after 2 s, before uvicorn's 5 s keep-alive closes them from its side: a request
        # sent on a connection the replica is closing fails (RemoteProtocolError), which would mark a healthy
        # replica down and retry the request
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
        self.client = httpx.AsyncClient(timeout=timeout, trust_env=False, limits=limits)
        self.closing = False
        self._expiry = asyncio.ensure_future(self._expire_loop())

    async def stop(self) -> None:
        """Cancel the expiry task and every forward (each ends as failed: no retry starts on the closing client),
        then close the client."""
        self.closing = True
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        for attempts in list(self.attempts.values()):
            for attempt in list(attempts):
                attempt.cancel("the router is stopping")
        if self.client is not None:
            await self.client.aclose()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.expire_interval)
            try:
                self.expire()
            except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                log.exception("expiring replicas failed")

    def expire(self) -> list:
        """registry.expire(), then cancel the forwards in flight to each removed replica."""
        removed = self.registry.expire()
        for replica in removed:
            self.count(removals=1)
            for attempt in list(self.attempts.pop(replica.id, ())):
                attempt.cancel(f"{replica.id} was removed ({replica.reason})")
        return removed

    def open(self, replica, path: str, content: bytes) -> Attempt:
        """Forward `content` to `replica` (its base URL + `path`), counted in its outstanding."""
        self.registry.begin(replica.id)
        attempt = Attempt(self.client, replica.id, replica.url + path, content, self._closed)
        self.attempts.setdefault(replica.id, set()).add(attempt)
        return attempt

    def _closed(self, attempt: Attempt) -> None:
        self.registry.end(attempt.replica_id)
        self.attempts.get(attempt.replica_id, set()).discard(attempt)

    def connection_failed(self, replica_id: str, why: str) -> None:
        """A connection to the replica failed: down (routed around) until a heartbeat revives it."""
        with contextlib.suppress(RegistryError):
            self.registry.mark_down(replica_id, why)

    def check_model(self, body: dict) -> str:
        """The body's model, served by a healthy replica (else the 400, 404 or 503 to answer)."""
        model = body.get("model")
        served = sorted({r.model for r in self.registry.replicas()})
        if model is None:
            raise APIError(400, f"model is a required field (one of {served})", "model", "missing_required_parameter")
        if not isinstance(model, str):
            raise APIError(400, f"model must be a string (one of {served}), got {type(model).__name__}", "model",
                           "invalid_type")
        if not self.registry.healthy():
            raise unavailable("no healthy replica is registered with this router", "no_healthy_replica")
        if model not in served:
            raise APIError(404, f"the model {model!r} does not exist; this router serves {served}", "model",
                           "model_not_found")
        if not self.registry.healthy(model):
            raise unavailable(f"no healthy replica serves {model!r}", "no_healthy_replica")
        return model

    def metrics_text(self) -> str:
        """The counters and each replica's routed / outstanding in Prometheus' text format (labkit.cluster.counters)."""
        return metrics_text(self.stats(), self.registry.replicas())


async def _json(request: Request, required: bool = True) -> tuple[bytes, dict]:
    """The request's body as sent and as a JSON object (a 400 when it is not one; {} when empty and optional)."""
    raw = await request.body()
    return raw, (protocol.parse_body(raw) if raw.strip() or required else {})


ROUTER_ERRORS = {500: "an unexpected error (its traceback goes to the router's log, never to the client)"}
GENERATION_ERRORS = {
    400: "a body that is not a JSON object or has no string model, or a replica's 400 passed on",
    404: "a model no replica serves (code model_not_found), or a replica's 404 passed on",
    413: "a replica's 413 (a body larger than it takes) passed on",
    415: "a Content-Type other than application/json (refused here, as a replica refuses it)",
    503: "no healthy replica serves the model, or every replica tried failed (codes no_healthy_replica, "
         "all_replicas_failed, router_stopping)"}


def make_router_app(router: Router) -> FastAPI:
    """The router's FastAPI app (serve it with labkit.serving.ServerThread)."""
    check_type("router", router, Router, "a labkit.cluster.router.Router")
    app = FastAPI(title="labkit router", docs_url=None, redoc_url=None, lifespan=_lifespan(router),
                  responses=protocol.error_answers(ROUTER_ERRORS))  # /openapi.json only
    _error_handlers(app)
    _status_routes(app, router)
    _discovery_routes(app, router)
    _generation_routes(app, router)
    protocol.publish(app)
    return app


def _lifespan(router: Router):
    """The app's lifespan: the router's client and expiry task run while it serves."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await router.start()
        try:
            yield
        finally:
            await router.stop()
    return lifespan


def _error_handlers(app: FastAPI) -> None:
    """OpenAI's error body for every error: protocol's handlers, a RegistryError's status, and a 500 for anything
    unexpected (logged, never sent)."""
    protocol.add_error_handlers(app)

    @app.exception_handler(RegistryError)
    async def registry_error(request, exc: RegistryError):
        code = {400: "invalid_value", 404: "not_found", 409: "conflict"}.get(exc.status, "invalid_request_error")
        return protocol.error_response(APIError(exc.status, exc.message, exc.param, code))

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        log.error("unexpected error serving %s", request.url.path, exc_info=exc)
        return protocol.error_response(APIError(500, "internal server error", type="server_error",
                                                code="internal_error"))


def _status_routes(app: FastAPI, router: Router) -> None:
    """GET /health, /v1/models and /metrics."""
    registry, created = router.registry, int(time.time())

    @app.get("/health", responses=protocol.error_answers({503: "no healthy replica (code no_healthy_replica)"}))
    async def health():
        n = len(registry.healthy())
        if not n:
            raise unavailable("no healthy replica is registered with this router", "no_healthy_replica")
        return {"status": "ok", "replicas": n}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": created, "owned_by": "labkit"}
                                           for m in registry.models()]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(router.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _discovery_routes(app: FastAPI, router: Router) -> None:
    """The replicas' side of discovery (labkit.serving.register): register, heartbeat, deregister; and the
    registry as JSON."""
    registry = router.registry
    bad = {400: "a body that is not a JSON object, or a field of the wrong type or value (`param` names it)"}
    unknown = {404: "an unknown replica id, or one registered with another url"}

    @app.get(discovery.REGISTER_PATH)
    async def replicas():
        return {"object": "list", "heartbeat_timeout": registry.heartbeat_timeout, "now": registry.clock(),
                "data": [r.to_dict() for r in registry.replicas()],
                "events": [{"time": e.time, "kind": e.kind, "id": e.id, "detail": e.detail} for e in registry.events]}

    @app.post(discovery.REGISTER_PATH, status_code=201,
              responses=protocol.error_answers({**bad, 409: "the url is registered already"}))
    async def register(request: Request):
        _, body = await _json(request)
        for field in ("url", "model"):
            if body.get(field) is None:
                raise APIError(400, f"{field} is a required field", field, "missing_required_parameter")
        try:
            replica = registry.register(body["url"], body["model"])
        except (TypeError, ValueError) as e:
            raise protocol.refusal(e) from None
        return {"id": replica.id, "heartbeat_interval": router.heartbeat_interval,
                "heartbeat_timeout": registry.heartbeat_timeout}

    @app.post(discovery.heartbeat_path("{replica_id}"), responses=protocol.error_answers({**bad, **unknown}))
    async def heartbeat(replica_id: str, request: Request):
        _, body = await _json(request, required=False)
        try:
            url = body.get("url") if isinstance(body, dict) else None  # a restarted router may reuse the id
            replica = registry.heartbeat(replica_id, body or None, url=url)
        except (TypeError, ValueError) as e:
            raise protocol.refusal(e) from None
        return {"id": replica.id, "state": replica.state}

    @app.delete(discovery.replica_path("{replica_id}"), responses=protocol.error_answers(unknown))
    async def deregister(replica_id: str, url: str | None = None):
        replica = registry.deregister(replica_id, url)
        return {"id": replica.id, "deregistered": True}


def _generation_routes(app: FastAPI, router: Router) -> None:
    """POST /v1/completions and /v1/chat/completions, forwarded to the replica's same path (labkit.cluster
    .forward); documented with the replicas' request bodies, which the replicas check."""
    responses = {**protocol.SSE_OK, **protocol.error_answers(GENERATION_ERRORS), **protocol.CLIENT_LEFT}
    for path, kind in (("/completions", "completion"), ("/chat/completions", "chat")):
        app.post("/v1" + path, openapi_extra=protocol.request_schema(kind), responses=responses,
                 name=kind)(_forwarder(router, path))


def _forwarder(router: Router, path: str):
    """The handler forwarding to `path`: one Ticket per request, resolved whatever happens."""
    async def handler(request: Request):
        ticket = router.ticket()
        handed_off = False
        try:
            protocol.check_content_type(request.headers.get("content-type"))  # a 415, as the replicas answer
            raw, body = await _json(request)
            model = router.check_model(body)
            response = await forward(router, request, path, raw, body, model, ticket)
            handed_off = True
            return response
        except APIError as e:
            ticket.resolve("refused" if e.status < 500 else "failed", e.message)
            return protocol.error_response(e)
        finally:
            if not handed_off:  # cancelled, or an unexpected error: still accounted for
                ticket.resolve("failed", "the request ended unexpectedly")
    return handler
