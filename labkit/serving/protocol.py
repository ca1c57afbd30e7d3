"""OpenAI's wire format for the service (notebook 06, section 6): request bodies checked field by field, the chat
template, response and stream-chunk bodies, and the error body. api.py routes HTTP to these.

Errors are OpenAI's body, {"error": {"message", "type", "param", "code"}}: a field of the wrong type or out of
range is a 400 naming it (`param`), an unknown model a 404 "model_not_found". Fields this server does not
implement (logprobs, echo, suffix, penalties, logit_bias, tools, n > 1, ...) are refused with a 400 naming them
unless they hold their default value; "user" is accepted and ignored; any other unknown field is a 400. A body
whose Content-Type is not application/json is a 415 (check_content_type). An empty prompt is refused as vLLM
refuses it ("Either prompt or prompt_embeds must be provided and non-empty.", CompletionRequest in
vllm/entrypoints/openai/completion/protocol.py), naming `prompt`. request_schema() describes the bodies for
/openapi.json.

The chat template is the processor's (labkit.serving.processor): a chat request's `messages` are checked
against OpenAI's schema here (text and image_url parts) and handed on whole, not flattened to text. A newline
ends a TinyLM document, so for chat it is a stop sequence: the reply ends at the end of its line (the newline
is not part of it).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass

from .._checks import (Refusal, check_bool, check_choice, check_int, check_number, check_positive_int, check_type,
                       fail, is_number)
from .processor import CHAT_ROLES, message_parts, prompt_text
from .sampling import SamplingParams

CHAT_STOP = ("\n",)
MAX_STOP = 4  # OpenAI's limit on stop sequences
IGNORED = ("user",)
# field -> its default: accepted with that value (or null), refused with any other
DEFAULT_ONLY = {"n": 1, "best_of": 1, "echo": False, "logprobs": False, "top_logprobs": 0, "presence_penalty": 0,
                "frequency_penalty": 0, "logit_bias": {}, "suffix": "", "tools": [], "tool_choice": "none",
                "response_format": {"type": "text"}, "parallel_tool_calls": False}
SAMPLING = ("model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
            "stream_options")
FIELDS = {"completion": SAMPLING + ("prompt",), "chat": SAMPLING + ("messages", "max_completion_tokens")}


class APIError(Exception):
    """An error the client gets as OpenAI's body with HTTP `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


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


_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
_TEXT = {"type": "string", "minLength": 1}
_TYPES = {"model": {"type": "string"},
          "prompt": {"anyOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1}]},
          "messages": {"type": "array", "minItems": 1, "items": {
              "type": "object", "required": ["role", "content"],
              "properties": {"role": {"enum": list(CHAT_ROLES)}, "content": _CONTENT}}},
          "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
          "temperature": {"type": "number", "minimum": 0, "maximum": 2},
          "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "top_k": {"type": "integer", "minimum": -1},
          "min_p": {"type": "number", "minimum": 0, "maximum": 1}, "seed": {"type": "integer", "minimum": 0},
          "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP}]},
          "stream": {"type": "boolean"},
          "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
          "user": {"type": "string"}}


def request_schema(kind: str) -> dict:
    """The OpenAPI requestBody of a `kind` ("completion" or "chat") request: the fields parse_request reads,
    for FastAPI's generated /openapi.json (the routes read the raw body, so FastAPI cannot infer it)."""
    check_choice("kind", kind, tuple(FIELDS))
    required = ["model", "prompt" if kind == "completion" else "messages"]
    schema = {"type": "object", "required": required,
              "properties": {name: _TYPES[name] for name in FIELDS[kind] + IGNORED}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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


def _get(body: dict, name: str, check, default=None):
    value = body.get(name)
    if value is None:
        return default
    try:
        return check(name, value)
    except (TypeError, ValueError) as e:
        raise refusal(e, name) from None


def _same(value, default) -> bool:
    if is_number(default) and not isinstance(default, bool):
        return is_number(value) and value == default
    return type(value) is type(default) and value == default


def _stop(name: str, value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        fail(name, value, "a string or a list of strings", TypeError)
    if len(stops) > MAX_STOP or not all(stops):
        fail(name, value, f"at most {MAX_STOP} non-empty strings")
    return tuple(stops)


def _stream_options(name: str, value) -> bool:
    check_type(name, value, dict, 'an object such as {"include_usage": true}')
    if set(value) - {"include_usage"}:
        fail(name, value, 'an object with only "include_usage"')
    return check_bool("stream_options.include_usage", value.get("include_usage", False))


def parse_request(body: dict, kind: str, model_name: str) -> GenerationRequest:
    """Check every field of a completion (`kind` "completion") or chat ("chat") request body."""
    for name, value in body.items():
        if name in DEFAULT_ONLY:
            if value is not None and not _same(value, DEFAULT_ONLY[name]):
                raise APIError(400, f"{name} is not supported by this server (only {json.dumps(DEFAULT_ONLY[name])}),"
                                    f" got {json.dumps(value)[:80]}", name, "unsupported_value")
        elif name not in FIELDS[kind] and name not in IGNORED:
            raise APIError(400, f"unrecognized request argument: {name}", name, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise APIError(400, f"model must be a string (the model's id, {model_name!r}), got {json.dumps(model)}",
                       "model", "invalid_type" if model is not None else "missing_required_parameter")
    if model != model_name:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {model_name!r}", "model",
                       "model_not_found")
    required = "prompt" if kind == "completion" else "messages"
    if body.get(required) is None:
        raise APIError(400, f"{required} is a required field", required, "missing_required_parameter")
    if kind == "completion":
        prompt = _get(body, "prompt", prompt_text)
    else:
        prompt = body["messages"]
        try:  # the shape only (roles, parts); the model's processor reads the contents
            message_parts(prompt)
        except (TypeError, ValueError) as e:
            raise refusal(e, default="messages") from None
    max_tokens = _get(body, "max_tokens", lambda n, v: check_positive_int(n, v, "tokens"), 16)
    max_tokens = _get(body, "max_completion_tokens", lambda n, v: check_positive_int(n, v, "tokens"), max_tokens)
    top_k = _get(body, "top_k", lambda n, v: check_int(n, v, -1), 0)
    stream = _get(body, "stream", check_bool, False)
    include_usage = _get(body, "stream_options", _stream_options, False)
    if body.get("stream_options") is not None and not stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options", "invalid_value")
    try:
        params = SamplingParams(
            max_tokens=max_tokens, top_k=max(top_k, 0),
            temperature=_get(body, "temperature", lambda n, v: check_number(n, v, 0.0, 2.0), 1.0),
            top_p=_get(body, "top_p", lambda n, v: check_number(n, v, 0.0, 1.0, low_open=True), 1.0),
            min_p=_get(body, "min_p", lambda n, v: check_number(n, v, 0.0, 1.0), 0.0),
            seed=_get(body, "seed", lambda n, v: check_int(n, v, 0)))
    except (TypeError, ValueError) as e:
        raise refusal(e) from None
    stop = _get(body, "stop", _stop, ())
    return GenerationRequest(kind, prompt, params, (stop + CHAT_STOP) if kind == "chat" else stop, stream,
                             include_usage)


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

