"""OpenAI's wire format for the service (notebook 06, section 6) and lab 08's router: the request bodies as
pydantic models, the response and stream-chunk bodies, the error body, and what both HTTP apps say about their
answers in /openapi.json. api.py and labkit.cluster.router route HTTP to these.

Each request is declared once, as a pydantic model (CompletionRequest, ChatCompletionRequest, as vLLM's OpenAI
server declares them): parse_request validates a body with it and /openapi.json publishes its JSON schema
(request_schema, publish). A field sent as null takes its default. Fields this server does not implement
(logprobs, echo, suffix, penalties, logit_bias, tools, n > 1, ...) are accepted only at their default value;
"user" is accepted and ignored; any other field is refused.

Errors are OpenAI's body, {"error": {"message", "type", "param", "code"}} (labkit.serving.errors): a field of the
wrong type or out of range is a 400 naming it (`param`, the field's path: max_tokens, messages[0].content[1].type)
in the message "<param> must be <what was expected>, got <the value>", an unknown model a 404 "model_not_found".
A body whose Content-Type is not application/json is a 415 (check_content_type). An empty prompt is refused as
vLLM refuses it ("Either prompt or prompt_embeds must be provided and non-empty.", CompletionRequest in
vllm/entrypoints/openai/completion/protocol.py), naming `prompt`. A 405 carries the `Allow` header (RFC 9110,
section 15.5.6) listing the methods the path serves. Every status a route answers is in /openapi.json
(error_answers, SSE_OK, CLIENT_LEFT); FastAPI's 422 is not, as no route answers it (publish).

The chat template is the processor's (labkit.serving.processor): a chat request's `messages` are checked
against OpenAI's schema here (text and image_url parts) and handed on whole, not flattened to text. A newline
ends a TinyLM document, so for chat it is a stop sequence: the reply ends at the end of its line (the newline
is not part of it).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      WithJsonSchema, create_model, model_validator)
from pydantic.json_schema import models_json_schema

from .._checks import check_choice, is_number
from .errors import APIError, ErrorResponse, Unsupported, invalid, refusal
from .errors import add_error_handlers as add_error_handlers  # for lab 08's router, which reaches labkit.serving
from .errors import error_response as error_response  # through its face: this module
from .processor import CHAT_ROLES
from .sampling import SamplingParams

CHAT_STOP = ("\n",)
MAX_STOP = 4  # OpenAI's limit on stop sequences
# field -> its default: accepted with that value (or null), refused with any other
DEFAULT_ONLY = {"n": 1, "best_of": 1, "echo": False, "logprobs": False, "top_logprobs": 0, "presence_penalty": 0,
                "frequency_penalty": 0, "logit_bias": {}, "suffix": "", "tools": [], "tool_choice": "none",
                "response_format": {"type": "text"}, "parallel_tool_calls": False}
SCHEMAS = "#/components/schemas/"  # where /openapi.json keeps the models' schemas


# ---- the request bodies --------------------------------------------------------------------------------------

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # no coercion ("5" is not 5), no extras
_OPEN = ConfigDict(strict=True, extra="allow")  # a message or a part: other fields (name, detail) are ignored
Text = Annotated[str, Field(min_length=1)]


def _integral(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(**bounds):
    """JSON Schema's integer within `bounds` (Field's ge, le): a number without a fractional part (5.0 is 5),
    never a bool or a string. (The bounds go before the validator, or the schema would not show them.)"""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


def _same(value, default) -> bool:
    if is_number(default) and not isinstance(default, bool):
        return is_number(value) and value == default
    return type(value) is type(default) and value == default


def _default_only(default: Any):
    """The type of a field this server does not implement: its default (or null) passes, anything else is
    refused (Unsupported); the schema says so."""
    def check(value):
        if value is not None and not _same(value, default):
            raise Unsupported(default)
        return value
    schema = {"anyOf": [{"const": default}, {"type": "null"}], "description": "not supported: only the default"}
    return Annotated[Any, AfterValidator(check), WithJsonSchema(schema)]


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Fields(BaseModel):
    model_config = _STRICT
    model: str = Field(description="the served model's id (GET /v1/models)")
    max_tokens: _int(ge=1) | None = 16
    temperature: Annotated[float, Field(ge=0, le=2)] | None = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] | None = 1.0
    top_k: _int(ge=-1) | None = Field(0, description="0 or -1: off")
    min_p: Annotated[float, Field(ge=0, le=1)] | None = 0.0
    seed: _int(ge=0, le=2**64 - 1) | None = None  # torch's seeds
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    user: str | None = Field(None, description="accepted and ignored")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}  # unknown: refused


_Request = create_model("_Request", __base__=_Fields,
                        **{name: (_default_only(default), None) for name, default in DEFAULT_ONLY.items()})
"""The fields both requests share: the model, sampling, stop, streaming, and the ones not implemented."""


class CompletionRequest(_Request):
    """POST /v1/completions (OpenAI's Completions API)."""
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        description="a non-empty string, or a list of one (token ids and batches are not supported)")


class ImageURL(BaseModel):
    model_config = _OPEN
    url: str = Field(description="a data URL, data:image/<type>;base64,<data>")


class TextPart(BaseModel):
    model_config = _OPEN
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    model_config = _OPEN
    type: Literal["image_url"]
    image_url: ImageURL


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal[CHAT_ROLES]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]]


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions (OpenAI's Chat Completions API)."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: _int(ge=1) | None = Field(None, description="overrides max_tokens")


REQUESTS = {"completion": CompletionRequest, "chat": ChatCompletionRequest}


@dataclass(frozen=True)
class GenerationRequest:
    """A checked /v1/completions or /v1/chat/completions body: what to run and how to answer."""
    kind: str                 # "completion" or "chat"
    prompt: str | list        # completion: the prompt text; chat: the messages (checked, OpenAI's schema)
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def check_content_type(value: str | None) -> None:
    """A 415 unless `value` (the Content-Type header) is application/json, parameters (charset) allowed. The
    test is vLLM's validate_json_request (a dependency of its /v1/completions and /v1/chat/completions routes):
    "Unsupported Media Type: Only 'application/json' is allowed", a 415 in the releases that raised an
    HTTPException, a 400 in those that raise a RequestValidationError; 415 is HTTP's status for it."""
    if (value or "").split(";")[0].strip().lower() != "application/json":
        got = json.dumps(value) if value is not None else "no Content-Type header"
        raise APIError(415, f"Content-Type must be application/json (the request body is JSON), got {got}",
                       code="unsupported_media_type")


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body, or a 400."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body must be a JSON object, got invalid JSON ({e})",
                       code="invalid_json") from None
    except RecursionError:  # json.loads on thousands of nested brackets
        raise APIError(400, "the request body must be a JSON object, got JSON nested too deeply",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got a JSON {type(body).__name__}",
                       code="invalid_json")
    return body


def parse_request(body: dict, kind: str, model_name: str) -> GenerationRequest:
    """Validate a completion (`kind` "completion") or chat ("chat") request body with its model (REQUESTS);
    the 400 names the first bad field, the 404 an unknown model."""
    check_choice("kind", kind, tuple(REQUESTS))
    try:
        req = REQUESTS[kind].model_validate(body)
    except ValidationError as e:
        raise invalid(e.errors(), body) from None
    if req.model != model_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}", "model",
                       "model_not_found")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options", "invalid_value")
    try:
        params = SamplingParams(
            max_tokens=getattr(req, "max_completion_tokens", None) or req.max_tokens, top_k=max(req.top_k, 0),
            temperature=req.temperature, top_p=req.top_p, min_p=req.min_p, seed=req.seed)
    except (TypeError, ValueError) as e:
        raise refusal(e) from None
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if kind == "completion":
        prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    else:
        prompt = body["messages"]  # as sent: the processor reads the contents
    return GenerationRequest(kind, prompt, params, (stop + CHAT_STOP) if kind == "chat" else stop, req.stream,
                             req.stream_options is not None and req.stream_options.include_usage)


# ---- the answers ---------------------------------------------------------------------------------------------

class Reply:
    """The response bodies of one request: the whole answer, or its stream chunks (OpenAI's shapes)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model, self.created = kind, model, int(time.time())
        self.id = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def full(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.kind == "completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("text_completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        return {**self._head("chat.completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False, with_usage: bool = False) -> dict:
        if self.kind == "completion":
            body = {**self._head("text_completion"),
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
        else:
            delta = {"role": "assistant", "content": text} if first else {"content": text} if text else {}
            body = {**self._head("chat.completion.chunk"),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        return {**body, "usage": None} if with_usage else body

    def usage_chunk(self, usage: dict) -> dict:
        obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
        return {**self._head(obj), "choices": [], "usage": usage}


def sse(data) -> str:
    """One server-sent event; a dict goes as JSON, a str (the final "[DONE]") raw, as the openai client expects."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


# ---- what /openapi.json says ---------------------------------------------------------------------------------

def request_schema(kind: str) -> dict:
    """A route's `openapi_extra` for a `kind` ("completion" or "chat") request: its body is the model's schema
    (the routes read the raw body, so FastAPI cannot infer it; publish() puts the schema in components)."""
    check_choice("kind", kind, tuple(REQUESTS))
    schema = {"$ref": SCHEMAS + REQUESTS[kind].__name__}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def error_answers(descriptions: dict[int, str]) -> dict:
    """A route's `responses` for the error statuses it answers ({status: what it means}), each OpenAI's body."""
    content = {"application/json": {"schema": {"$ref": SCHEMAS + ErrorResponse.__name__}}}  # publish() puts it there
    return {status: {"description": text, "content": content} for status, text in descriptions.items()}


SSE_OK = {200: {"description": "the answer (application/json), or with \"stream\": true its server-sent events",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
"""The 200 of a generation route: OpenAI's JSON body, or its stream."""
CLIENT_LEFT = {499: {"description": "the client closed the connection before the answer (nothing reaches it)"}}


def publish(app: FastAPI) -> None:
    """Make app.openapi() (its /openapi.json) say what the app answers: the request models' and the error body's
    schemas in components/schemas, where request_schema() and error_answers() refer, and no 422, which FastAPI lists
    for a route with parameters while add_error_handlers answers their validation errors with a 400."""
    generate = app.openapi
    models = [*REQUESTS.values(), ErrorResponse]
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=SCHEMAS + "{model}")

    def openapi() -> dict:
        schema = generate()  # FastAPI's, generated once and kept; the edits below are idempotent
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(defs["$defs"])
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        return schema

    app.openapi = openapi
