"""Notebook 09's calculator: bytes by part and the compute ceiling on tokens/s for each method, the rule that picks
a method for a machine's memory, and the widget (sections 1 and 6).

The rule (choose): the first of full fine-tuning, LoRA and QLoRA whose bytes fit the machine, without activation
checkpointing when that fits and with it otherwise. Each step down the list trades something for bytes: LoRA
trains a small share of the weights (and forgets less of what the model knew), QLoRA adds the 4-bit base's
quantization error and its rebuild in every matmul; checkpointing costs time only. Replay, old lines mixed into
every batch so that the model keeps its old skills, costs tokens: REPLAY_TOKENS times the tokens per batch when
half of each batch is old lines and the new lines stay as many.
"""

from __future__ import annotations

from .._checks import check_bool, check_choice, check_number, check_positive_int
from ..course import env, table
from ..specs import model as model_spec
from .factcheck import LAPTOP_FLOPS, tokens_per_s
from .memory import METHODS, training_memory

CALC_MODELS = ("llama-2-7b", "llama-3-70b", "deepseek-v3", "moe-3t")
MACHINES_GB = (8, 16, 24, 32, 64, 128)
REPLAY_TOKENS = 2
"""Replay at half of each batch, the new lines as many as without it: twice the tokens per batch."""


def ceiling(model: str, method: str, checkpointing: bool = False, flops: float = LAPTOP_FLOPS) -> float:
    """Training tokens/s ceiling at `flops` FLOP/s (factcheck.tokens_per_s: 6 N FLOP per token for full
    fine-tuning, 4 N for the adapters), with checkpointing's extra forward (2 N) counted when it is on."""
    check_choice("method", method, METHODS)
    check_bool("checkpointing", checkpointing)
    k = 6 if method == "full" else 4
    return tokens_per_s(model_spec(model), method, flops) * k / (k + 2 * checkpointing)


def calculator_table(model: str, tokens: int = 4096, rank: int = 16, checkpointing: bool = False,
                     flops: float = LAPTOP_FLOPS) -> str:
    """The bytes by part for each method (GB = 1e9 bytes) and the tokens/s ceiling at `flops` FLOP/s, as a table."""
    check_choice("model", model, CALC_MODELS + ("tinylm",))
    check_number("flops", flops, low=0.0, low_open=True)
    rows = []
    for method in METHODS:
        parts = training_memory(model, method, tokens, rank, checkpointing)
        rows.append({"method": method} | {k + " GB": v / 1e9 for k, v in parts.items()}
                    | {"tokens/s ceiling": ceiling(model, method, checkpointing, flops)})
    return table(rows, digits=4)


def choose(model: str, memory_gb: float, tokens: int = 2048, rank: int = 16) -> tuple[str, bool] | None:
    """The rule (module docstring): (method, checkpointing) for fine-tuning `model` on `tokens` tokens per batch
    in `memory_gb` GB (1e9 bytes), or None when not even QLoRA with checkpointing fits."""
    check_number("memory_gb", memory_gb, low=0.0, low_open=True)
    for method in METHODS:
        for ckpt in (False, True):
            if training_memory(model, method, tokens, rank, ckpt)["total"] <= memory_gb * 1e9:
                return method, ckpt
    return None


def choice_text(choice: tuple[str, bool] | None) -> str:
    """("lora", True) -> "lora + ckpt"; None -> "none fits"."""
    if choice is None:
        return "none fits"
    method, ckpt = choice
    return method + (" + ckpt" if ckpt else "")


def machines_table(models=("llama-2-7b", "llama-3-70b"), tokens: int = 2048, rank: int = 16,
                   machines=MACHINES_GB) -> str:
    """For each machine's memory (GB): each model's choice, and its choice with replay (REPLAY_TOKENS times the
    tokens), as a table."""
    check_positive_int("tokens", tokens)
    rows = []
    for gb in machines:
        row = {"memory GB": gb}
        for name in models:
            row[name] = choice_text(choose(name, gb, tokens, rank))
            row[name + " + replay"] = choice_text(choose(name, gb, REPLAY_TOKENS * tokens, rank))
        rows.append(row)
    return table(rows)


def your_machine(model: str, memory_gb: float, tokens: int, rank: int = 16) -> str:
    """One line: the rule's choice for `model` in `memory_gb` GB, without and with replay."""
    plain, replay = choose(model, memory_gb, tokens, rank), choose(model, memory_gb, REPLAY_TOKENS * tokens, rank)
    return (f"{model} in {memory_gb:g} GB, {tokens} tokens per batch: {choice_text(plain)}; "
            f"with replay: {choice_text(replay)}")


def calculator(static: bool = False, tokens: int = 4096, memory_gb: float | None = None,
               tflops: float = LAPTOP_FLOPS / 1e12):
    """Dropdown (model), sliders (log2 tokens per batch, LoRA rank), a checkpointing box, your memory (GB; this
    machine's by default) and your compute (TFLOP/s; the course's M2 Ultra figure by default), showing
    calculator_table and the rule's choice for your memory. static=True (or without ipywidgets) prints the table
    for every model at `tokens` tokens instead, and the choices for `memory_gb` when given. Returns the
    ipywidgets.interactive, or None when static."""
    check_bool("static", static)
    check_positive_int("tokens", tokens)
    check_number("tflops", tflops, low=0.0, low_open=True)
    if memory_gb is not None:
        check_number("memory_gb", memory_gb, low=0.0, low_open=True)
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            static = True
    if static:
        for name in CALC_MODELS:
            print(f"{name}, {tokens} tokens per batch, {tflops:g} TFLOP/s:\n"
                  f"{calculator_table(name, tokens, flops=tflops * 1e12)}\n")
            if memory_gb is not None:
                print(your_machine(name, memory_gb, tokens) + "\n")
        return None
    if memory_gb is None:
        memory_gb = round((env.total_memory_bytes() or 16e9) / 1e9, 1)

    def show(model, log2_tokens, rank, checkpointing, memory_gb, tflops):
        print(calculator_table(model, 2 ** log2_tokens, rank, checkpointing, tflops * 1e12))
        print(your_machine(model, memory_gb, 2 ** log2_tokens, rank))

    return widgets.interactive(
        show,
        model=widgets.Dropdown(options=list(CALC_MODELS), value=CALC_MODELS[0], description="model"),
        log2_tokens=widgets.IntSlider(value=12, min=8, max=20, description="log2 tokens"),
        rank=widgets.IntSlider(value=16, min=1, max=256, description="LoRA rank"),
        checkpointing=widgets.Checkbox(value=False, description="checkpointing"),
        memory_gb=widgets.BoundedFloatText(value=memory_gb, min=0.5, max=1e6, description="memory GB"),
        tflops=widgets.BoundedFloatText(value=tflops, min=0.01, max=1e6, description="TFLOP/s"))
