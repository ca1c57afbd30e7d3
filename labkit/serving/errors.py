"""The errors of the service and lab 08's router in OpenAI's body, {"error": {"message", "type", "param", "code"}}
(notebooks 06 and 08; labkit.serving.protocol uses them and hands them on to the router).

    APIError            an error with its HTTP status; body() is OpenAI's error body (ErrorResponse)
    refusal             a labkit refusal (labkit._checks.fail) as a 400 naming the request's field
    invalid             pydantic's validation errors about a request body as that 400: the first bad field, by its
                        path (messages[0].content[1].type), "<param> must be <what was expected>, got <value>";
                        a field sent with a value this server does not implement (Unsupported) "unsupported_value"
    add_error_handlers  an app's APIError, FastAPI's own 404 and 405 (with the `Allow` header RFC 9110 section
                        15.5.6 requires) and FastAPI's validation of a route's parameters, all in that body
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from .._checks import Refusal, fail


class APIError(Exception):
    """An error the client gets as OpenAI's body with HTTP `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body: every error answer of the service and the router."""
    error: ErrorDetail


class Unsupported(ValueError):
    """A field this server does not implement, sent with a value other than its `default` (pydantic passes it on
    in its error's ctx; invalid() answers it with code "unsupported_value")."""

    def __init__(self, default: Any):
        super().__init__(json.dumps(default))
        self.default = default


FIELD_PATH = re.compile(r"[A-Za-z_]\w*(?:\[\d+\]|\.\w+)*")
"""A field as OpenAI's `param` names it: max_tokens, messages[0].content[1].image_url.url"""


def refusal(error: Exception, param: str | None = None, default: str | None = None) -> APIError:
    """A 400 from a labkit refusal (an error raised by labkit._checks.fail, its Refusal attached): `param` when
    given, else the refused argument's name when it is a request field path (messages[0].content[1].type),
    else `default`."""
    message = str(error)
    refused = getattr(error, "refusal", None)
    name = refused.name if isinstance(refused, Refusal) else None
    name = param or (name if name and FIELD_PATH.fullmatch(name) else default)
    code = "invalid_type" if isinstance(error, TypeError) else "invalid_value"
    return APIError(400, message, name, code)


_KINDS = {"string": "a string", "int": "an int", "float": "a number", "bool": "true or false", "list": "an array",
          "dict": "an object", "model": "an object", "model_attributes": "an object"}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}


def _is_type(kind: str) -> bool:
    return kind.endswith("_type")


def _expected(error: dict) -> str:
    """What a pydantic error (its type and ctx) says the value should have been, in the course's words."""
    kind, ctx = error["type"], error.get("ctx", {})
    if _is_type(kind) and kind.removesuffix("_type") in _KINDS:
        return _KINDS[kind.removesuffix("_type")]
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return f"{op} {ctx[key] if isinstance(ctx[key], int) else format(ctx[key], 'g')}"
    if kind == "string_too_short":
        return "a non-empty string" if ctx["min_length"] == 1 else f"a string of at least {ctx['min_length']} chars"
    if kind in ("too_short", "too_long"):
        n = ctx["min_length" if kind == "too_short" else "max_length"]
        return f"an array of at {'least' if kind == 'too_short' else 'most'} {n} item{'s' * (n != 1)}"
    if kind == "literal_error":
        return f"one of {ctx['expected']}"
    if kind == "union_tag_invalid":
        return f"one of {ctx['expected_tags']}"
    return {"finite_number": "a finite number"}.get(kind, error["msg"])


def _locate(body, loc: tuple, missing: bool) -> tuple[str, Any, int]:
    """OpenAI's param for a pydantic error location, the value there and its depth: the steps that are the body's
    own keys and indices (messages[0].content[1].type), without pydantic's union tags ("str", "list[...]")."""
    name, value, depth = "", body, 0
    for i, step in enumerate(loc):
        if isinstance(value, dict) and (step in value or (missing and i == len(loc) - 1)):
            name, value = (f"{name}.{step}" if name else str(step)), value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            name, value = f"{name}[{step}]", value[step]
        else:
            continue
        depth += 1
    return name, value, depth


def _refused(param: str, value, expected: str, error: type[Exception]) -> APIError:
    try:
        fail(param, value, expected, error)  # labkit's one message format
    except (TypeError, ValueError) as e:
        return refusal(e, param)


def invalid(errors: list[dict], body) -> APIError:
    """The 400 for pydantic's `errors` about `body` (FastAPI's own, about a request's query or path, when `body`
    is None): the first bad field's deepest error, or, when it fits no member of a union, every member's type."""
    if body is None:
        errors = [{**e, "loc": tuple(e["loc"])[1:]} for e in errors]  # ("query", "n"): the field is "n"
        body = {str(e["loc"][0]): e.get("input") for e in errors if e["loc"]}
    field = tuple(errors[0]["loc"])[:1]
    found = [(e, *_locate(body, tuple(e["loc"]), e["type"] == "missing")) for e in errors
             if tuple(e["loc"])[:1] == field]
    deepest = [f for f in found if f[3] == max(f[3] for f in found)]
    error, param, value, _ = next((f for f in deepest if not _is_type(f[0]["type"])), deepest[0])
    kind, members = error["type"], [f[0] for f in deepest if f[1] == param]
    if kind == "missing":
        return APIError(400, f"{param} is a required field", param, "missing_required_parameter")
    if kind == "extra_forbidden":
        return APIError(400, f"unrecognized request argument: {param}", param, "unknown_parameter")
    if isinstance(error.get("ctx", {}).get("error"), Unsupported):
        return APIError(400, f"{param} is not supported by this server (only {error['ctx']['error']}), got "
                             f"{json.dumps(value)[:80]}", param, "unsupported_value")
    if kind == "union_tag_not_found":
        return APIError(400, f"{param}.type is a required field", f"{param}.type", "missing_required_parameter")
    if kind == "union_tag_invalid":
        param, value = f"{param}.type", value["type"]
    if _is_type(kind):  # no member of the union took it: each one's type
        return _refused(param, value, " or ".join(dict.fromkeys(map(_expected, members))), TypeError)
    return _refused(param, value, _expected(error), ValueError)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def allowed_methods(request: Request) -> list[str]:
    """The methods the app serves at the request's path: the `Allow` of its 405 (RFC 9110, section 15.5.6)."""
    methods = set()
    for route in request.app.router.routes:
        if route.matches(request.scope)[0] is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def add_error_handlers(app: FastAPI) -> None:
    """Every error `app` answers in OpenAI's body: an APIError with its status, FastAPI's own 404 and 405 (with
    `Allow`), and FastAPI's validation of a route's parameters as a 400 naming the parameter."""

    async def api_error(request: Request, exc: APIError):
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        response = error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                           code=code))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only those of the route starlette tried
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    async def validation_error(request: Request, exc: RequestValidationError):
        return error_response(invalid(list(exc.errors()), None))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
