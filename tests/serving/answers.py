"""What a server answers, held against the /openapi.json it publishes: an answer to a path the schema lists has
its status and media type documented there, and a method the path does not serve is a 405 whose `Allow` header
names exactly the documented methods (RFC 9110, section 15.5.6). Recorder wraps an app to collect every answer a
test module's requests get (tests/serving/test_api.py's `serving`, tests/cluster/conftest.py's LocalRouter)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Answer:
    method: str
    path: str
    status: int
    content_type: str | None
    allow: str | None


class Recorder:
    """ASGI middleware: every HTTP answer of `app` in `answers` (lifespan and the rest passed through)."""

    def __init__(self, app):
        self.app, self.answers = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def record(message):
            if message["type"] == "http.response.start":
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
                self.answers.append(Answer(scope["method"], scope["path"], message["status"],
                                           headers.get("content-type"), headers.get("allow")))
            await send(message)
        await self.app(scope, receive, record)

    def undocumented(self, schema: dict) -> list[str]:
        return [why for a in self.answers if (why := undocumented(schema, a))]


def operations(schema: dict, path: str) -> dict | None:
    """The schema's operations ({method: operation}) of the path template `path` matches, None if none does."""
    for template, ops in schema["paths"].items():
        parts = re.split(r"(\{[^}]+\})", template)  # "/v1/models/{model_id}": "/v1/models/", "{model_id}", ""
        if re.fullmatch("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts), path):
            return ops
    return None


def undocumented(schema: dict, answer: Answer) -> str | None:
    """Why `answer` is not what `schema` says (None when it is, or when the schema lists no such path)."""
    ops = operations(schema, answer.path)
    where = f"{answer.method} {answer.path} answered {answer.status}"
    if ops is None:
        return None
    if answer.method.lower() not in ops:
        allowed = sorted(m.upper() for m in ops)
        if answer.status != 405:
            return f"{where}: an undocumented method, not a 405"
        if sorted((answer.allow or "").replace(" ", "").split(",")) != allowed:
            return f"{where} with Allow {answer.allow!r}, not the documented methods {allowed}"
        return None
    responses = ops[answer.method.lower()]["responses"]
    if str(answer.status) not in responses:
        return f"{where}: the status is not documented (only {sorted(responses)})"
    media = (answer.content_type or "").split(";")[0].strip() or None
    documented = set(responses[str(answer.status)].get("content", {}))
    if (media or documented) and media not in documented:
        return f"{where} as {media}: documented as {sorted(documented) or 'no body'}"
    return None


def methods_not_served(root: str, schema: dict) -> list[str]:
    """Send every method a documented path does not serve to `root`; what is wrong with the answers."""
    problems = []
    for template, ops in schema["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x", template)
        for method in METHODS:
            if method.lower() not in ops:
                r = httpx.request(method, root + path, timeout=30)
                answer = Answer(method, path, r.status_code, r.headers.get("content-type"), r.headers.get("allow"))
                problems += [why] if (why := undocumented(schema, answer)) else []
                if method != "HEAD" and set(r.json()) != {"error"}:
                    problems.append(f"{method} {path}: {r.text}, not OpenAI's error body")
    return problems
