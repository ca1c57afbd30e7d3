"""labkit.serving.errors on its own: OpenAI's error body, a pydantic error turned into the 400 naming the field by
OpenAI's path, and a 405 with RFC 9110's Allow header (the service's and the router's answers are tested end to
end in test_api.py and tests/cluster/test_router.py)."""
from typing import Literal

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labkit._checks import fail
from labkit.serving.errors import APIError, add_error_handlers, invalid, refusal


class Part(BaseModel):
    type: Literal["text"]


class Body(BaseModel):
    model_config = ConfigDict(strict=True)  # as the service's requests: "16" is not an int
    max_tokens: int = Field(16, ge=1)
    parts: list[Part] = []


def first_error(body: dict) -> APIError:
    with pytest.raises(ValidationError) as e:
        Body.model_validate(body)
    return invalid(e.value.errors(), body)


def test_the_body_is_openais():
    assert APIError(404, "no such model", "model", "model_not_found").body() == {
        "error": {"message": "no such model", "type": "invalid_request_error", "param": "model",
                  "code": "model_not_found"}}


@pytest.mark.parametrize("body, param, code, words", [
    ({"max_tokens": 0}, "max_tokens", "invalid_value", "max_tokens must be >= 1, got 0"),
    ({"max_tokens": "x"}, "max_tokens", "invalid_type", "max_tokens must be an int"),
    ({"parts": [{"type": "text"}, {"type": "image"}]}, "parts[1].type", "invalid_value", "one of"),
])
def test_a_validation_error_names_the_field_by_its_path(body, param, code, words):
    error = first_error(body)
    assert (error.status, error.param, error.code) == (400, param, code)
    assert words in error.message, error.message


def test_a_labkit_refusal_keeps_its_field():
    with pytest.raises(ValueError) as e:
        fail("temperature", -1, "a number >= 0")
    error = refusal(e.value)
    assert (error.status, error.param, error.code) == (400, "temperature", "invalid_value")
    assert "temperature" in error.message and "-1" in error.message


def test_a_405_says_which_methods_the_path_serves():
    app = FastAPI()
    add_error_handlers(app)
    app.get("/x")(lambda: {})
    app.post("/x")(lambda: {})
    answer = TestClient(app).put("/x")
    assert answer.status_code == 405
    assert sorted(m.strip() for m in answer.headers["allow"].split(",")) == ["GET", "POST"]
    assert answer.json()["error"]["type"] == "invalid_request_error"
    missing = TestClient(app).get("/nowhere")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
