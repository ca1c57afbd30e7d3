"""Notebook 09's tables, plots and the calculator widget."""

from __future__ import annotations

from .._checks import check_bool, check_choice, check_positive_int
from ..course import table
from .memory import METHODS, training_memory

CALC_MODELS = ("llama-2-7b", "llama-3-70b", "deepseek-v3", "moe-3t")


def calculator_table(model: str, tokens: int = 4096, rank: int = 16, checkpointing: bool = False) -> str:
    """The bytes by part for each method (GB = 1e9 bytes), as a table."""
    check_choice("model", model, CALC_MODELS + ("tinylm",))
    rows = []
    for method in METHODS:
        parts = training_memory(model, method, tokens, rank, checkpointing)
        rows.append({"method": method} | {k + " GB": v / 1e9 for k, v in parts.items()})
    return table(rows, digits=4)


def calculator(static: bool = False, tokens: int = 4096):
    """Dropdown (model), sliders (log2 tokens per batch, LoRA rank) and a checkpointing box, showing
    calculator_table. static=True (or without ipywidgets) prints the table for every model at `tokens` tokens
    instead. Returns the ipywidgets.interactive, or None when static."""
    check_bool("static", static)
    check_positive_int("tokens", tokens)
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for name in CALC_MODELS:
            print(f"{name}, {tokens} tokens per batch:\n{calculator_table(name, tokens)}\n")
        return None
    return widgets.interactive(
        lambda model, log2_tokens, rank, checkpointing: print(
            calculator_table(model, 2 ** log2_tokens, rank, checkpointing)),
        model=widgets.Dropdown(options=list(CALC_MODELS), value=CALC_MODELS[0], description="model"),
        log2_tokens=widgets.IntSlider(value=12, min=8, max=20, description="log2 tokens"),
        rank=widgets.IntSlider(value=16, min=1, max=256, description="LoRA rank"),
        checkpointing=widgets.Checkbox(value=False, description="checkpointing"))
