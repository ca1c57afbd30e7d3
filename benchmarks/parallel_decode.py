"""TinyLM decode with TP=2 and PP=2 in real gloo processes against one process and against the
alpha-beta prediction (issue 12).

    python benchmarks/parallel_decode.py [tokens]

Measures, in one run: the single-process decode step (one thread, like each rank; KV cache, batch 1); the
link's small-message latency two ways (median all_reduce of 512 bytes back to back, and after each rank
computes for as long as it does between two all-reduces of a TP=2 step: the pattern decode has); TP=2 and PP=2
greedy decode steps (medians). Predictions: labkit.parallel.tensor.predicted_step_seconds (compute / 2 + 9
all-reduces + one all-gather) and labkit.parallel.pipeline.predicted_decode_seconds (the whole step + one
send + one broadcast), priced with the after-compute alpha. Goal: each prediction within 2x of the
measurement; a miss is printed with the cost per collective the step actually paid. Expected shape: both slower
than one process (TinyLM's step is a fraction of a millisecond; each message costs hundreds of
microseconds). Run it alone. Copy the output into benchmarks/RESULTS.md.
"""

import statistics
import sys

import torch

from labkit.course.timing import measure
from labkit.parallel import LinkModel, Pool, gloo, pipeline, tensor
from labkit.tinylm import KVCache, load_pretrained


def main(tokens: int = 48) -> None:
    model, tok = load_pretrained()
    prompt = tok.encode("The key of the red box is 42. The key of the blue box is")
    torch.set_num_threads(1)
    cache = KVCache(model.cfg, max_len=len(prompt) + 1)
    with torch.no_grad():
        model(torch.tensor([prompt]), cache)

        def step():
            cache.rewind(len(prompt))
            model(torch.tensor([[7]]), cache)
        single = measure(step, repeats=30, warmup=5).median
    with Pool(2) as pool:
        back_to_back = pool.run(gloo.time_worker, "all_reduce", [512], 30)[0][0] / 2  # 2 ring steps on 2 ranks
        gap = single / 2 / (2 * model.cfg.n_layers + 1)  # each rank's compute between two all-reduces
        alpha = pool.run(gloo.time_worker, "all_reduce", [512], 30, gap)[0][0] / 2
        link = LinkModel(alpha, 1e9, "gloo small messages after compute")
        tp = statistics.median(tensor.tensor_parallel_generate(model, prompt, tokens, 2, pool=pool)["seconds"])
        pp = statistics.median(pipeline.pipeline_generate(model, prompt, tokens, 2, pool=pool)["seconds"])
    rows = [("TP=2", tp, tensor.predicted_step_seconds(model.cfg, 2, link, single)),
            ("PP=2", pp, pipeline.predicted_decode_seconds(model.cfg, 2, link, single))]
    print(f"single process: {single * 1e3:.2f} ms/token ({1 / single:.0f} tokens/s); link alpha back to back "
          f"{back_to_back * 1e6:.0f} us, after {gap * 1e6:.0f} us of compute {alpha * 1e6:.0f} us")
    for name, measured, predicted in rows:
        ratio = measured / predicted
        print(f"{name}: {measured * 1e3:.2f} ms/token ({1 / measured:.0f} tokens/s, {single / measured:.2f}x the single "
              f"process), predicted {predicted * 1e3:.2f} ms: measured/predicted {ratio:.2f} "
              f"({'within' if 0.5 <= ratio <= 2 else 'outside'} 2x)")
    per_collective = (tp - single / 2) / (2 * model.cfg.n_layers + 2)
    print(f"TP=2 paid {per_collective * 1e3:.2f} ms per collective; the link after compute prices one at "
          f"{2 * alpha * 1e3:.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 48)
