"""The one assertion the bad-input tests make (not a test module: a helper the tests of every package import)."""
import pytest


def assert_refused(call, error: type[Exception], name: str, value, expected: str) -> None:
    """call() raises exactly `error`, whose message names the argument first, says what was expected and
    shows the bad value: "<name> must be <expected...>, got <value>"."""
    with pytest.raises(Exception) as info:
        call()
    message = str(info.value)
    assert type(info.value) is error, f"{type(info.value).__name__}, expected {error.__name__}: {message}"
    assert message.startswith(f"{name} must be "), message
    assert expected in message, message
    assert repr(value) in message.rsplit("got ", 1)[-1], message
