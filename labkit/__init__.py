"""labkit: the tested reference implementation behind the Breaking the Memory Wall notebooks."""

import inspect

__version__ = "0.1.0"


def show(obj) -> None:
    """Print the source code of a labkit function or class: how notebooks display the reference."""
    print(inspect.getsource(obj).rstrip())
