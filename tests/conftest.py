import pytest

from labkit.model import load_pretrained


@pytest.fixture(scope="session")
def pretrained():
    """(model, tokenizer) from the committed checkpoint."""
    return load_pretrained()
