"""Notebook 04's exercises, defined once: the reference, fixed cases, random cases and tolerance of each.
The notebook's check cells and tests/parallel/test_exercises.py both use them:

    RING_ALL_REDUCE  ring_all_reduce(tensors) -> every rank's sum, chunk by chunk            (section 1)
    TP_MLP           tp_mlp(x, w_gate, w_up, w_down, tp) -> each rank's partial output       (section 3)
    BUBBLE           bubble_fraction(stages, microbatches) -> idle share of the total time  (section 4)
    MIN_CARDS        min_cards(name, card, batch, context, per_node) -> the fewest cards of one
                     tensor-parallel group that serve the workload, or None                  (section 7)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_positive_int, check_type, fail
from ..course import Exercise
from ..rng import Rng
from ..specs import device, model
from .collectives import ring_all_reduce
from .planner import USABLE
from .schedule import bubble_fraction


def _gen(rng: Rng) -> torch.Generator:
    return torch.Generator().manual_seed(rng.below(2**31))


def random_ranks(rng: Rng) -> tuple[list[torch.Tensor]]:
    """2 to 5 ranks, each a float64 tensor of 1 to 23 elements (not always a multiple of the rank count)."""
    n, numel, g = 2 + rng.below(4), 1 + rng.below(23), _gen(rng)
    return ([torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(n)],)


RING_ALL_REDUCE = Exercise(
    "ring_all_reduce", ring_all_reduce,
    cases=[([torch.tensor([1.0, 2, 3, 4, 5, 6]), torch.tensor([10.0, 20, 30, 40, 50, 60]),
             torch.tensor([100.0, 200, 300, 400, 500, 600])],)],
    random_case=random_ranks, rtol=1e-12, atol=1e-12)


def tp_mlp_reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                     tp: int) -> list[torch.Tensor]:
    """Rank r's partial output of a SwiGLU MLP split over tp ranks: gate and up by output rows (column
    parallel), down by input columns (row parallel); their sum (the all-reduce) is the full MLP."""
    gates, ups, downs = w_gate.chunk(tp, 0), w_up.chunk(tp, 0), w_down.chunk(tp, 1)
    return [(F.silu(x @ g.T) * (x @ u.T)) @ d.T for g, u, d in zip(gates, ups, downs)]


def random_mlp(rng: Rng) -> tuple:
    """x [tokens, d] and an MLP whose hidden width divides by tp (1, 2 or 4)."""
    tp, g = rng.choice([1, 2, 4]), _gen(rng)
    t, d, f = 1 + rng.below(4), 2 + rng.below(7), tp * (1 + rng.below(5))
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(t, d), r(f, d), r(f, d), r(d, f), tp


TP_MLP = Exercise("tp_mlp", tp_mlp_reference, cases=[random_mlp(Rng(7))], random_case=random_mlp,
                  rtol=1e-9, atol=1e-12)


def random_pipeline(rng: Rng) -> tuple[int, int]:
    return 1 + rng.below(16), 1 + rng.below(64)


BUBBLE = Exercise("bubble_fraction", bubble_fraction, cases=[(4, 8), (1, 5), (8, 1)],
                  random_case=random_pipeline, rtol=1e-12)


DENSE_KV_MODELS = ("tinylm", "opt-13b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "gpt3-175b",
                   "mixtral-8x7b", "dense-320b", "llama-3.1-405b", "moe-3t")  # presets with KV heads (no MLA)
CARDS = ("rtx-4090", "a100-80gb", "h100-sxm", "h200", "mi300x")


def min_cards_reference(name: str, card: str, batch: int, context: int, per_node: int) -> int | None:
    """The fewest cards tp of one tensor-parallel group (PP = EP = 1, tp <= per_node: TP stays inside one node)
    on which model `name` (a labkit.specs preset with KV heads) serves `batch` sequences of `context` tokens,
    each card within USABLE of `device(card).memory_bytes`; None when no degree up to per_node fits.

    Per card, in bytes: the BF16 weights / tp; the BF16 KV cache of every sequence / min(tp, n_kv_heads) (past
    the KV heads each head is copied, not split); per sequence 8 x d_model + 2 x vocab / tp FP32 activations.
    tp must divide the heads, and divide or be a multiple of the KV heads. This is labkit.parallel.planner's
    memory model for TP alone (tests/parallel/test_exercises.py checks that they agree)."""
    spec, dev = model(check_type("name", name, str)), device(check_type("card", card, str))
    if spec.is_mla:
        fail("name", name, "a model with KV heads (not multi-head latent attention)")
    if not dev.memory_bytes or dev.kind == "link":
        fail("card", card, "a device with memory (a card of data/hardware.json)")
    for arg, value in (("batch", batch), ("context", context), ("per_node", per_node)):
        check_positive_int(arg, value)
    kv = batch * context * spec.kv_bytes_per_token(2)
    for tp in range(1, per_node + 1):
        if spec.n_heads % tp or (spec.n_kv_heads % tp and tp % spec.n_kv_heads):
            continue
        need = (spec.n_params * 2 / tp + kv / min(tp, spec.n_kv_heads)
                + batch * (8 * spec.d_model + 2 * spec.vocab_size / tp) * 4)
        if need <= USABLE * dev.memory_bytes:
            return tp
    return None


def random_cards(rng: Rng) -> tuple[str, str, int, int, int]:
    """A preset, a card, 1-256 sequences of a context the model has, one node of 8, 16 or 72 cards."""
    name = rng.choice(DENSE_KV_MODELS)
    contexts = [c for c in (256, 1024, 4096, 8192, 32768, 131072) if c <= model(name).context]
    return (name, rng.choice(CARDS), rng.choice([1, 4, 16, 64, 256]), rng.choice(contexts),
            rng.choice([8, 8, 16, 72]))


MIN_CARDS = Exercise("min_cards", min_cards_reference, cases=[
    ("llama-3-70b", "h100-sxm", 1, 4096, 8),        # the weights decide
    ("llama-3-70b", "h100-sxm", 64, 8192, 8),       # the KV cache decides, and 5 or 6 cards split no head evenly
    ("gpt3-175b", "h100-sxm", 1, 2048, 8),          # 96 heads: 6 cards split them, 5 do not
    ("llama-3-70b", "h100-sxm", 64, 32768, 72),     # past 8 KV heads the cache stops shrinking
    ("llama-3.1-405b", "h100-sxm", 64, 8192, 8),    # no degree of one node holds it
    ("llama-2-7b", "h100-sxm", 109, 1024, 8),       # the activations tip one card over
    ("tinylm", "rtx-4090", 1, 256, 8)],
    random_case=random_cards)
