"""TinyLM's decode step in one process against TP ranks, and the alpha-beta model's prediction of it
(notebook 04, section 3; benchmarks/parallel_decode.py). `measure` takes every timing once; each method of
the report it returns says one thing, so that a notebook cell reads as one step:

    measured()     one process (1 thread, like each rank), the TP step, the link's alpha measured two ways
    alphas()       alpha after compute against alpha back to back (the course's evidence rule)
    prediction()   the alpha-beta prediction against the measured TP step (within 2x or not)
    speed()        TP against one process (the evidence rule)

alpha is timed on all-reduces of one decode message (d_model float32 values), `rounds` times each way, each
round the median of `repeats`: back to back, and after every rank computes for as long as it does between
two collectives of a TP step (the pattern decode has). The prediction is priced with the second. The
hypothesis that it is higher (gloo's threads idle during compute and slow to wake) was measured and refuted
on a quiet machine (benchmarks/RESULTS.md, issue 12); `alphas()` says what this run found.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from .._checks import check_positive, check_positive_int, check_type
from ..course import Timing, evidence, measure as measure_seconds
from ..tinylm import KVCache, TinyLM
from . import gloo
from .distributed import Pool
from .linkmodel import LinkModel, steps
from .tensor import predicted_step_seconds, tensor_parallel_generate


@dataclass(frozen=True)
class DecodeReport:
    """Seconds of one decode step in one process (`single`, a Timing) and with TP (`tp`, one per step, the
    slowest rank's); alpha (seconds per message) per round, back to back and after `gap` seconds of compute;
    the link priced with the median after-compute alpha; the predicted TP step (seconds)."""
    tp_degree: int
    single: Timing
    tp: tuple[float, ...]
    back_to_back: tuple[float, ...]
    after: tuple[float, ...]
    gap: float
    link: LinkModel
    predicted: float
    collectives: int
    message_bytes: int

    @property
    def single_step(self) -> float:
        return self.single.median

    @property
    def tp_step(self) -> float:
        return statistics.median(self.tp)

    def measured(self) -> str:
        """The timings, in one line each."""
        med = statistics.median
        return (f"one process {self.single_step * 1e3:.2f} ms/token, TP={self.tp_degree} {self.tp_step * 1e3:.2f} "
                f"ms/token (medians of {len(self.single.times)} and {len(self.tp)} steps)\n"
                f"alpha of a {self.message_bytes}-byte all-reduce: back to back {med(self.back_to_back) * 1e6:.0f} us, "
                f"after {self.gap * 1e6:.0f} us of compute {med(self.after) * 1e6:.0f} us "
                f"(medians of {len(self.after)} rounds each)")

    def alpha_comparison(self) -> evidence.Comparison:
        return evidence.compare("back to back", self.back_to_back, "after compute", self.after, " s")

    def alphas(self) -> str:
        """Whether alpha after compute is higher, lower, or not told apart from back to back on this run."""
        c = self.alpha_comparison()
        if not c.reliable:
            return f"alpha after compute against back to back: {c.unreliable()}"
        return (f"alpha after compute is {c.ratio:.2f}x alpha back to back, "
                f"{'higher' if c.higher == 'after compute' else 'lower'} in every round")

    def prediction(self) -> str:
        """The prediction against the measurement, and the cost per collective the step really paid."""
        ratio = self.tp_step / self.predicted
        one = self.link.collective("all_reduce", self.message_bytes, self.tp_degree)
        paid = (self.tp_step - self.single_step / self.tp_degree) / self.collectives
        head = (f"alpha-beta prediction {self.predicted * 1e3:.2f} ms/token (compute / {self.tp_degree} + "
                f"{self.collectives} collectives at about {one * 1e3:.2f} ms), measured {self.tp_step * 1e3:.2f} ms: ")
        if 0.5 <= ratio <= 2:
            return head + f"measured / predicted {ratio:.2f}, within 2x"
        return head + (f"measured / predicted {ratio:.2f}, outside 2x: the step paid {paid * 1e3:.2f} ms per "
                       "collective, a cost the alpha-beta model does not price")

    def speed_comparison(self) -> evidence.Comparison:
        return evidence.compare("one process", self.single, f"TP={self.tp_degree}", self.tp, " s")

    def speed(self) -> str:
        """TP against one process, by the evidence rule."""
        c, name = self.speed_comparison(), f"TP={self.tp_degree}"
        if not c.reliable:
            return f"{name} against one process: {c.unreliable()}"
        if c.higher == name:
            return f"{name} is {c.ratio:.1f}x slower than one process here (every step of each)"
        return f"{name} runs {1 / c.ratio:.1f}x as fast as one process here (every step of each)"


def single_step(model: TinyLM, prompt: list[int], repeats: int = 20) -> Timing:
    """One decode step of one sequence after `prompt` (KV cache, batch 1) on one torch thread, like each rank
    of a Pool; the thread count is restored after."""
    cache = KVCache(model.cfg, max_len=len(prompt) + 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(torch.tensor([prompt]), cache)

            def step():
                cache.rewind(len(prompt))
                model(torch.tensor([[7]]), cache)
            return measure_seconds(step, repeats=repeats, warmup=3)
    finally:
        torch.set_num_threads(threads)


def measure(model: TinyLM, prompt: list[int], pool: Pool, tokens: int = 24, rounds: int = 5, repeats: int = 10,
            beta: float = 1e9) -> DecodeReport:
    """Time TinyLM's decode step in one process and with TP = pool.world (greedy, `tokens` steps), and the
    link's alpha both ways (see the module docstring); `beta` (bytes/s, e.g. section 2's fit) prices the
    bytes, which matter little at decode's message size."""
    check_type("pool", pool, Pool)
    for name, v in (("tokens", tokens), ("rounds", rounds), ("repeats", repeats)):
        check_positive_int(name, v)
    check_positive("beta", beta, unit="bytes/s")
    cfg, n = model.cfg, pool.world
    single = single_step(model, prompt)
    tp = tuple(tensor_parallel_generate(model, prompt, tokens, n, pool=pool)["seconds"])
    collectives = 2 * cfg.n_layers + 2  # 2 all-reduces per layer, the embedding's, the logits' all-gather
    gap = single.median / n / collectives  # each rank's compute between two collectives
    nbytes, per_op = cfg.d_model * 4, steps("all_reduce", n)
    back, after = [], []
    for _ in range(rounds):  # interleaved, so that a change of load hits both alike
        back.append(pool.run(gloo.time_worker, "all_reduce", [nbytes], repeats)[0][0] / per_op)
        after.append(pool.run(gloo.time_worker, "all_reduce", [nbytes], repeats, gap)[0][0] / per_op)
    link = LinkModel(statistics.median(after), beta, "gloo, small messages after compute")
    return DecodeReport(n, single, tp, tuple(back), tuple(after), gap, link,
                        predicted_step_seconds(cfg, n, link, single.median), collectives, nbytes)
