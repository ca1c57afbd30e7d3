"""TinyLM decode with TP=2 and PP=2 in real gloo processes against one process and against the
alpha-beta prediction.

    python benchmarks/parallel_decode.py [tokens]

Measures, in one run (labkit.parallel.decode.measure, as notebook 04 does): the single-process decode step
(one thread, like each rank; KV cache, batch 1); the link's small-message alpha two ways, 5 rounds each
(back to back, and after each rank computes for as long as it does between two collectives of a TP=2 step:
the pattern decode has), compared by the course's evidence rule; TP=2 and PP=2 greedy decode steps (medians).
Predictions: labkit.parallel.tensor.predicted_step_seconds (compute / 2 + 9 all-reduces + one all-gather)
and labkit.parallel.pipeline.predicted_decode_seconds (the whole step + one send + one broadcast), priced
with the after-compute alpha. Goal: each prediction within 2x of the measurement; a miss is printed with the
cost per collective the step actually paid. Then the TP=2 step taken apart from timestamps on both ranks
(labkit.parallel.decode.step_timeline): each part of a step per rank, each collective's wait for the peer,
time in the collective and late exit, and the spread of the collectives. Run it alone. Copy the output into
benchmarks/RESULTS.md.
"""

import statistics
import sys

from labkit.parallel import Pool, decode, pipeline
from labkit.tinylm import load_pretrained


def main(tokens: int = 48) -> None:
    model, tok = load_pretrained()
    prompt = tok.encode("The key of the red box is 42. The key of the blue box is")
    with Pool(2) as pool:
        run = decode.measure(model, prompt, pool, tokens)
        pp = statistics.median(pipeline.pipeline_generate(model, prompt, tokens, 2, pool=pool)["seconds"])
        timeline = decode.step_timeline(model, prompt, pool, tokens, alpha=run.link.alpha)
    print(run.measured())
    print(run.alphas())
    print(run.prediction())
    print(run.speed())
    predicted = pipeline.predicted_decode_seconds(model.cfg, 2, run.link, run.single_step)
    ratio = pp / predicted
    print(f"PP=2: {pp * 1e3:.2f} ms/token ({run.single_step / pp:.2f}x the single process), predicted "
          f"{predicted * 1e3:.2f} ms: measured/predicted {ratio:.2f} "
          f"({'within' if 0.5 <= ratio <= 2 else 'outside'} 2x)")
    print("\nThe TP=2 step from timestamps on both ranks:")
    print(timeline.table())
    print(timeline.explain())
    print(timeline.tail())
    print(f"step {timeline.steps // 2}, collective by collective:")
    print(timeline.timeline(timeline.steps // 2))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 48)
