"""The OpenAI-compatible HTTP API over a Service, on FastAPI and uvicorn as vLLM does it (notebook 06, section 6;
`python -m labkit.serving` starts it, the notebook calls it with the `openai` package).

    GET  /health                503 {"status": "loading" | "failed" | "stopped", ...} until warmup succeeded, then
                                200 {"status": "ready"}; with the engine in its own process (Service(process=True))
                                also "engine": {"pid", "alive"}; an engine process that died makes it 503
    GET  /v1/models             the one model (its id is the served model name); /v1/models/{id} too
    POST /v1/completions        prompt (a string) -> text; "stream": true sends server-sent events
    POST /v1/chat/completions   messages (text and image_url parts) -> the model's processor -> the assistant's
                                message
    GET  /metrics               Prometheus text: running, waiting, swapped, KV usage, prefix cache, preemptions,
                                requests and tokens (names "labkit:...", as vLLM's "vllm:...")
    GET  /openapi.json          the OpenAPI schema FastAPI generates from these routes, with the request bodies
                                (protocol's models) and every status each route answers; /docs (Swagger UI) and
                                /redoc render it, as vLLM serves them (the pages load their scripts from a CDN: in
                                a browser offline they stay blank, /openapi.json does not)

A POST whose Content-Type is not application/json gets a 415 (protocol.check_content_type; vLLM refuses it too);
a method a path does not serve gets a 405 whose `Allow` header lists those it does.
Streams are OpenAI's: `data: {chunk json}` events, a usage chunk (choices []) when stream_options.include_usage,
then `data: [DONE]` sent raw. Every error is OpenAI's body (protocol.APIError) with a 4xx (bad input, FastAPI's
own validation errors included) or 503 (not ready); anything unexpected is a 500 with that body and no
traceback, and an error after a stream started goes out in-band as a `data: {"error": ...}` event. A client
that disconnects mid-stream cancels its stream's generator, which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from .._checks import Refusal, check_int, check_number, check_type, fail
from ..kv_cache import LargerThanPoolError
from . import protocol
from .processor import message_parts
from .protocol import APIError, Reply, check_content_type, parse_body, parse_request, refusal, sse
from .service import Service, ServiceUnavailable

log = logging.getLogger("labkit.serving")

# name (after "labkit:"), type, key in Service.stats(), help
METRICS = [line.split(None, 3) for line in """
num_requests_running        gauge    running               Requests in the running batch.
num_requests_waiting        gauge    waiting               Requests waiting to be scheduled.
num_requests_swapped        gauge    swapped               Requests preempted by swap (their KV blocks on the host).
kv_cache_usage_perc         gauge    kv_usage              Fraction of the KV-cache blocks in use (0 to 1).
kv_cache_blocks_used        gauge    kv_blocks_used        KV-cache blocks in use.
kv_cache_blocks_total       gauge    kv_blocks_total       KV-cache blocks in the pool.
prefix_cache_queries_total  counter  prefix_cache_queries  Prompt tokens looked up in the prefix cache.
prefix_cache_hits_total     counter  prefix_cache_hits     Prompt tokens found in the prefix cache.
num_preemptions_total       counter  preemptions           Preemptions (recompute or swap).
engine_steps_total          counter  steps                 Engine steps (one batched forward each).
requests_total              counter  admitted              Requests admitted.
prompt_tokens_total         counter  prompt_tokens         Prompt tokens of admitted requests.
generation_tokens_total     counter  generation_tokens     Output tokens delivered to clients.
""".strip().splitlines()]
FINISHED = ("stop", "length", "abort", "error")


MAX_BODY_BYTES = 1_000_000
"""Largest request body (bytes): TinyLM's context is 256 tokens and TinyVLM's 32x32 images are a few KB as data
URLs; a bigger body gets a 413 before it is parsed. Lab 07's per-image limit, labkit.day0.multimodal
.MAX_IMAGE_BYTES (512 KiB decoded, 699,052 bytes as base64), is set below this so that one image at that limit
fits in a body: an image over it gets the processor's 400 naming its url field, not this 413. Keep
4 * ceil(MAX_IMAGE_BYTES / 3) well under MAX_BODY_BYTES (tests/day0/test_http_limits.py checks it over HTTP)."""
DISCONNECT_POLL_S = 0.1
"""How often a non-streaming request checks that its client is still connected (seconds)."""


def _sample(value) -> str:
    """A sample value, exact: ints as ints (a counter past 10**6 keeps every digit), floats by repr."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else repr(float(value))


def prometheus_text(stats: dict, model_name: str) -> str:
    """Service.stats() in Prometheus' text format (version 0.0.4): # HELP and # TYPE, then `name{labels} value`."""
    escaped = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # the format's escapes
    label = f'model_name="{escaped}"'
    lines = []
    for short, kind, key, text in METRICS:
        name = f"labkit:{short}"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {_sample(stats.get(key, 0))}"]
    name = "labkit:request_success_total"
    lines += [f"# HELP {name} Requests finished, by finish reason.", f"# TYPE {name} counter"]
    lines += [f'{name}{{{label},finished_reason="{r}"}} {_sample(stats.get("finished_" + r, 0))}' for r in FINISHED]
    return "\n".join(lines) + "\n"


def _internal(message: str = "internal server error") -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")


class _CatchAll:
    """ASGI middleware: an unexpected exception becomes a 500 with OpenAI's body (the traceback goes to the log,
    never to the client); the server keeps serving."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        started = False

        async def watch(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:  # noqa: BLE001 - the point of this middleware
            log.exception("unexpected error serving %s", scope.get("path"))
            if scope["type"] == "http" and not started:
                await protocol.error_response(_internal())(scope, receive, send)


async def _submit(service: Service, req):
    """The request's Prompt (made by the model's processor, off the event loop), then its stream."""
    field = "messages" if req.kind == "chat" else "prompt"
    prompt = None
    try:
        prompt = await service.process(req.kind, req.prompt)
        return await service.submit(prompt, req.params, req.stop)
    except ServiceUnavailable as e:
        raise APIError(503, str(e), type="service_unavailable_error", code="model_not_ready") from None
    except LargerThanPoolError as e:
        raise APIError(400, f"the request does not fit in the KV cache: {e}", None, "request_too_large") from None
    except (ValueError, TypeError) as e:  # the processor's (a bad image, ...) name their field; the engine's say
        # "prompt", worded for the request by _engine_refusal
        refused = getattr(getattr(e, "refusal", None), "name", None)
        if prompt is None and req.kind == "chat" and refused == "messages" and not any(
                p.kind != "text" or p.value for _, parts in message_parts(req.prompt) for p in parts):
            raise _empty_chat(req.prompt) from None
        raise (refusal(e, default=field) if prompt is None else _engine_refusal(e, req.kind, prompt)) from None


def _empty_chat(messages: list) -> APIError:
    """The 400 for messages the chat template renders to no token at all (every content empty: the processors
    refuse that whole, as "messages"): it names the last message's content, where the reply would continue.
    vLLM accepts an empty content and refuses only a prompt of 0 tokens, "The decoder prompt cannot be empty"
    (vllm/v1/engine/input_processor.py, _validate_prompt_len); TinyLM's template adds no token of its own, so
    one empty message is such a prompt, while an empty message among others is a newline and is served."""
    param = f"messages[{len(messages) - 1}].content"
    return APIError(400, f"{param} must hold text or an image (the messages render to a prompt of 0 tokens, and "
                         f"the decoder prompt cannot be empty), got {json.dumps(messages[-1].get('content'))[:80]}",
                    param, "invalid_value")


def _engine_refusal(error: Exception, kind: str, prompt) -> APIError:
    """The 400 for an Engine refusal of a processed Prompt: what it calls "prompt" is a chat request's
    "messages", and a refused prompt says how many of its tokens are image tokens (Prompt.num_image_tokens)."""
    refused = getattr(error, "refusal", None)
    if not isinstance(refused, Refusal) or refused.name != "prompt":  # max_tokens, ...: the request's own field
        return refusal(error)
    message = refused.message("messages" if kind == "chat" else "prompt")
    if prompt.num_image_tokens:
        message += f" ({prompt.num_image_tokens} of its {len(prompt.token_ids)} tokens are image tokens)"
    return refusal(type(error)(message), "messages" if kind == "chat" else "prompt")


async def _events(stream, reply: Reply, req):
    """The server-sent events of one streamed request; closing it (the client went away) aborts the request."""
    usage = req.include_usage
    try:
        if reply.kind == "chat":
            yield sse(reply.chunk("", first=True, with_usage=usage))
        async for chunk in stream:
            if chunk.text or chunk.finish_reason:
                yield sse(reply.chunk(chunk.text, chunk.finish_reason, with_usage=usage))
            if chunk.error:
                yield sse(_internal(chunk.error).body())
        if usage and stream.finish_reason:
            yield sse(reply.usage_chunk(Reply.usage(stream.num_prompt_tokens, stream.num_output_tokens)))
    except Exception:  # noqa: BLE001 - headers are gone: report in-band, never a traceback
        log.exception("unexpected error in a stream")
        yield sse(_internal().body())
    finally:
        stream.abort()  # a no-op when it finished; frees its blocks when the client left early
    yield sse("[DONE]")


SERVICE_ERRORS = {500: "an unexpected error (its traceback goes to the server's log, never to the client)"}
GENERATION_ERRORS = {
    400: "a bad request: a body that is not a JSON object, a field of the wrong type, out of range, unknown or not "
         "supported (`param` names it), a prompt the model cannot take, or one larger than the KV cache",
    404: "an unknown model (code model_not_found)",
    413: f"a body larger than {MAX_BODY_BYTES:,} bytes",
    415: "a Content-Type other than application/json",
    503: "the model is not ready (code model_not_ready: loading, failed or stopped)"}
HEALTH_503 = {503: {"description": 'not ready: {"status": "loading" | "failed" | "stopped", "error"?, "engine"?}',
                    "content": {"application/json": {}}}}


def make_app(service: Service, model_name: str = "tinylm") -> FastAPI:
    """The FastAPI app serving `service` under the model id `model_name`."""
    check_type("service", service, Service, "a labkit.serving.Service")
    if not check_type("model_name", model_name, str, "a non-empty str (the model id clients send)"):
        fail("model_name", model_name, "a non-empty str (the model id clients send)")
    app = FastAPI(title="labkit serving", summary="An OpenAI-compatible API over a labkit.serving.Service",
                  responses=protocol.error_answers(SERVICE_ERRORS))
    app.add_middleware(_CatchAll)
    protocol.add_error_handlers(app)
    _status_routes(app, service, model_name)
    _generation_routes(app, service, model_name)
    protocol.publish(app)
    return app


def _status_routes(app: FastAPI, service: Service, model_name: str) -> None:
    """GET /health, /v1/models, /v1/models/{model_id} and /metrics."""
    created = int(time.time())

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "labkit"}

    @app.get("/health", responses=HEALTH_503)
    async def health():
        """200 {"status": "ready"} once warmup succeeded, else 503; with the engine in its own process also
        "engine": {"pid", "alive"}."""
        status = 200 if service.state == "ready" else 503
        body = {"status": service.state, **({"error": service.error} if service.error else {})}
        if service.engine_pid != os.getpid():  # the engine in its own process: which, and whether it runs
            body["engine"] = {"pid": service.engine_pid, "alive": service.alive}
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}", responses=protocol.error_answers({404: "an unknown model"}))
    async def model(model_id: str):
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {model_name!r}",
                           "model", "model_not_found")
        return model_card()

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        """Prometheus' text format (version 0.0.4)."""
        return PlainTextResponse(prometheus_text(service.stats(), model_name),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


def _generation_routes(app: FastAPI, service: Service, model_name: str) -> None:
    """POST /v1/completions and /v1/chat/completions: the body checked (protocol.parse_request), then the
    answer whole or streamed."""
    responses = {**protocol.SSE_OK, **protocol.error_answers(GENERATION_ERRORS), **protocol.CLIENT_LEFT}

    @app.post("/v1/completions", openapi_extra=protocol.request_schema("completion"), responses=responses)
    async def completions(request: Request):
        """A completion of `prompt` (OpenAI's Completions API); `"stream": true` sends server-sent events."""
        req = await _read(request, "completion", model_name)
        return await _generate(service, request, req, model_name)

    @app.post("/v1/chat/completions", openapi_extra=protocol.request_schema("chat"), responses=responses)
    async def chat_completions(request: Request):
        """The assistant's reply to `messages` (OpenAI's Chat Completions API); `"stream": true` sends
        server-sent events."""
        req = await _read(request, "chat", model_name)
        return await _generate(service, request, req, model_name)


async def _read(request: Request, kind: str, model_name: str) -> protocol.GenerationRequest:
    """The request's body checked in the order a client can fix it: its Content-Type (415), its size before it
    is read (413), JSON (400), then its fields (400, or 404 for an unknown model)."""
    check_content_type(request.headers.get("content-type"))  # a header: before the body is read
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else len(await request.body())
    if size > MAX_BODY_BYTES:  # refused before it is read or parsed
        raise APIError(413, f"the request body must be at most {MAX_BODY_BYTES} bytes, got {size}",
                       code="request_too_large")
    return parse_request(parse_body(await request.body()), kind, model_name)


async def _generate(service: Service, request: Request, req: protocol.GenerationRequest, model_name: str):
    """Run `req` on `service`: its stream of server-sent events, or its whole answer once done (a client that
    leaves first aborts it)."""
    stream = await _submit(service, req)
    reply = Reply(req.kind, model_name)
    if req.stream:
        return StreamingResponse(_events(stream, reply, req), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    collect = asyncio.ensure_future(stream.collect())
    try:
        while not (await asyncio.wait({collect}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():  # a non-streaming client that left is aborted too
                collect.cancel()
                return Response(status_code=499)
        out = collect.result()
    finally:
        stream.abort()  # the client left or the handler was cancelled: drop the request (no-op when done)
    if out.error:
        raise _internal(out.error)
    return reply.full(out.text, out.finish_reason, Reply.usage(stream.num_prompt_tokens, out.num_tokens))


class ServerThread:
    """uvicorn serving `app` from a background thread on a socket bound at construction (port 0: a free one,
    read `.port`). Used by `python -m labkit.serving`, the tests and the notebook. No signal handling here:
    the owner decides when to stop()."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        check_int("port", port, 0, 65535)
        self.host = check_type("host", host, str, "a host name or address (str)")
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                        name="labkit-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        """Start serving; returns once uvicorn is listening (RuntimeError if it did not start in `timeout` s)."""
        deadline = time.monotonic() + check_number("timeout", timeout, low=0.0, unit="seconds")
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop accepting, let running requests end (5 s grace), and join the thread."""
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(check_number("timeout", timeout, low=0.0, unit="seconds"))
        self.socket.close()
