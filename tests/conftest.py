import pytest
from hypothesis import settings

from labkit.tinylm import load_pretrained

# The same examples on every run and every machine: CI's verdict never depends on the draw. To explore
# other examples by hand, load the "default" profile instead.
settings.register_profile("course", derandomize=True)
settings.load_profile("course")


@pytest.fixture(scope="session")
def pretrained():
    """(model, tokenizer) from the committed checkpoint."""
    return load_pretrained()
