"""Fixtures shared by tests/serving: the committed TinyLM and its tokenizer (loaded once per session)."""
import pytest

from labkit.tinylm import TASK_KINDS, load_pretrained, make_tasks


@pytest.fixture(scope="session")
def model():
    return load_pretrained()[0]


@pytest.fixture(scope="session")
def tok():
    return load_pretrained()[1]


@pytest.fixture(scope="session")
def prompts(tok):
    """18 task prompts of the course (6 of each kind), as token ids: 6 to 190 tokens."""
    return [tok.encode(t.prompt) for k in TASK_KINDS for t in make_tasks(k, 6)]
