"""Pools of real gloo ranks shared by every test of tests/parallel (start-up is paid once per size)."""
import pytest

from labkit.parallel import Pool


@pytest.fixture(scope="session")
def pool2():
    with Pool(2, timeout=20) as pool:
        yield pool


@pytest.fixture(scope="session")
def pool4():
    with Pool(4, timeout=20) as pool:
        yield pool


@pytest.fixture(scope="session")
def tinylm():
    from labkit.tinylm import load_pretrained
    return load_pretrained()[0]
