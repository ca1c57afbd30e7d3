"""Service start-up and time to first token for TinyVLM's release. Goal: start to 200 on /health with --tp 2
in at most 15 s on 2 cores. Also measured: time to first token for an image request, and the encoder cache's
effect on a repeated image.

    python benchmarks/day0_startup.py [--model data/tinyvlm] [--repeats 5]

`python -m labkit.serving --model FOLDER --tp N --port 0` is started as a child process (labkit.serving.launch)
`repeats` times for each tp; "start to 200" runs from just before the process is spawned to the first 200 on
/health (polled every 0.1 s: the figure is up to 0.1 s late). Without data/tinyvlm (not trained yet) a random
TinyVLM(small_config()) release is written to a temporary folder, and the script says so: its start-up is the
same machinery (process groups, per-rank loading, warm-up), its weights are smaller.

Time to first token is measured with the `openai` client, streaming, against the tp 2 service: from sending the
request to the first chunk with text, medians of `repeats`, in turns: a text request; an image request with an
image the service has not seen (the encoder runs); the same image again (the encoder cache answers). Each
repeat uses a new image for the "new" case. The ratio new / repeated is from the same run.
"""

import argparse
import base64
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai
import torch

from labkit.day0 import TinyVLM, make_image_tasks, small_config
from labkit.day0.release import write_release
from labkit.paths import DATA
from labkit.serving.launch import start_service

GOAL_S = 15.0


def random_release(folder: Path) -> Path:
    torch.manual_seed(0)
    model = TinyVLM(small_config())
    write_release(model.state_dict(), model.config, folder, max_shard_size="20KB")
    return folder


def data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def ttft(client, name: str, content) -> float:
    """Seconds from sending a streamed chat request to its first chunk with text."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": content}],
                                            max_tokens=4, temperature=0, stream=True)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    return first if first is not None else time.perf_counter() - t0  # no text at all: the whole answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DATA / "tinyvlm"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model)
        if not (folder / "config.json").is_file():
            folder = random_release(Path(tmp) / "tinyvlm")
            print(f"{args.model} has no release (train it: python -m labkit.day0.train); using a random "
                  f"TinyVLM(small_config()) written to a temporary folder")
        starts = {1: [], 2: []}
        for _ in range(args.repeats):
            for tp in (1, 2):
                t0 = time.perf_counter()
                with start_service(folder, args=["--tp", str(tp)], timeout=120):
                    starts[tp].append(time.perf_counter() - t0)
        for tp, runs in starts.items():
            print(f"start to 200 on /health, --tp {tp}: median {statistics.median(runs):.1f} s "
                  f"(min {min(runs):.1f}, max {max(runs):.1f}, {len(runs)} starts)")
        s2 = statistics.median(starts[2])
        verdict = "met" if max(starts[2]) <= GOAL_S else "met by the median only" if s2 <= GOAL_S else "NOT met"
        print(f"goal: --tp 2 up in at most {GOAL_S:.0f} s: {verdict}")

        tasks = make_image_tasks("colour", args.repeats + 1, "test", 0)
        urls = [data_url(t.image) for t in tasks]
        times = {"text": [], "new image": [], "repeated image": []}
        with start_service(folder, args=["--tp", "2"], timeout=120) as service:
            client = openai.OpenAI(base_url=service.url, api_key="any", max_retries=0, timeout=60)
            name = client.models.list().data[0].id
            ttft(client, name, "warm-up")
            for i in range(args.repeats):
                times["text"].append(ttft(client, name, "12+7="))
                image = [{"type": "image_url", "image_url": {"url": urls[i + 1]}}, {"type": "text", "text": "colour="}]
                times["new image"].append(ttft(client, name, image))
                times["repeated image"].append(ttft(client, name, image))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"time to first token, {k:>14}: median {v * 1e3:.0f} ms ({args.repeats} requests)")
        ratio = med["new image"] / med["repeated image"]
        spread = max(times["repeated image"]) - min(times["repeated image"])
        if spread > abs(med["new image"] - med["repeated image"]):
            print(f"encoder cache: new / repeated image TTFT {ratio:.2f}x, unreliable on this run (the repeats "
                  f"spread {spread * 1e3:.0f} ms, more than the difference)")
        else:
            print(f"encoder cache: new / repeated image TTFT {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
