"""The HTTP service against the in-process engine on the same requests, measured in one run (issue 27: 32
concurrent streaming clients get at least 90% of the in-process engine's output tokens/s; issue 14 asked 80%).

    python benchmarks/serving_http.py [--clients 32] [--max-tokens 64] [--repeats 3] [--intervals 1 8]

In-process: labkit.serving.Engine on the wall clock, the 32 requests added at once and run to completion, with
as many torch threads as the service uses (its --threads default: the cores but one) and with torch's default.
HTTP: `python -m labkit.serving --model data/tinylm --port 0` in its own process (labkit.serving.launch: the API
process, which spawns the engine-core process), and
`clients` concurrent streaming completions from one `openai.AsyncOpenAI` client here (temperature 0, the same
prompts and max_tokens, stream_options.include_usage for the token count; 32 threads with the sync client
cost more CPU per token). Tokens/s = output tokens / (last token - start). The runs take turns, `repeats`
times; the ratio of medians is printed with the per-repeat ratios. The client shares the machine's cores with
the server, as a load generator on the same host does. The service is started once per stream interval
(`--stream-interval`: tokens per streamed chunk at least; 1 sends every token as it is made). The CPU seconds
the server's processes (the API process, and the engine process it spawned) and this client process spent per
output token are printed beside the ratio: they say where a shortfall comes from.
"""

import argparse
import asyncio
import json
import os
import statistics
import time

import openai
import torch

from labkit.serving import Engine, SamplingParams
from labkit.serving.launch import start_service
from labkit.serving.workload import make_trace
from labkit.tinylm import ByteTokenizer, load_pretrained

GOAL = 0.9


def in_process(model, prompts, max_tokens: int, threads: int) -> float:
    """Output tokens/s of Engine.generate on every prompt at once, with `threads` torch threads."""
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        engine = Engine(model)
        t0 = time.perf_counter()
        outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
        return sum(map(len, outs)) / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(default)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def over_http(base_url: str, texts: list[str], max_tokens: int) -> float:
    """Output tokens/s of one streaming completion per text, all at once: concurrent streams from one asyncio
    client (as vLLM's benchmark_serving drives a server: one process, one event loop)."""

    async def run() -> float:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0, timeout=120)

        async def one(text: str) -> int:
            stream = await client.completions.create(model="tinylm", prompt=text, max_tokens=max_tokens,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
            tokens = 0
            async for chunk in stream:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return tokens

        await one(texts[0])  # a connection and the client's first-call set-up, outside the timing
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(t) for t in texts))
        seconds = time.perf_counter() - t0
        await client.close()
        return sum(counts) / seconds

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    model, _ = load_pretrained()
    tok = ByteTokenizer()
    trace = [r for r in make_trace(4 * args.clients, float("inf"), seed=3) if len(r.prompt) + args.max_tokens <= 256]
    prompts = [list(r.prompt) for r in trace[:args.clients]]
    texts = [tok.decode(p) for p in prompts]
    assert [tok.encode(t) for t in texts] == prompts  # the service sees exactly these tokens
    served, default = max(1, (os.cpu_count() or 1) - 1), torch.get_num_threads()  # the service's --threads default
    tokens = args.clients * args.max_tokens
    print(f"{args.clients} concurrent requests, {args.max_tokens} output tokens each, greedy; the service runs "
          f"{served} torch thread(s), in-process runs {served} and torch's default {default}")
    for interval in args.intervals:
        with start_service(args=["--stream-interval", str(interval)], timeout=120, threads=served) as service:
            over_http(service.url, texts[:4], 4)  # warm-up, both sides
            in_process(model, prompts[:4], 4, default)
            runs, api_cpu, engine_cpu, client_cpu = {"same": [], "default": [], "http": []}, [], [], []
            engines = [json.loads(service.get("/health"))["engine"]["pid"]]  # the engine process (/health)
            for _ in range(args.repeats):
                runs["same"].append(in_process(model, prompts, args.max_tokens, served))
                runs["default"].append(in_process(model, prompts, args.max_tokens, default))
                s0, e0, c0 = cpu_seconds(service.pid), sum(map(cpu_seconds, engines)), time.process_time()
                runs["http"].append(over_http(service.url, texts, args.max_tokens))
                api_cpu.append((cpu_seconds(service.pid) - s0) / tokens)
                engine_cpu.append((sum(map(cpu_seconds, engines)) - e0) / tokens)
                client_cpu.append((time.process_time() - c0) / tokens)
        med = {k: statistics.median(v) for k, v in runs.items()}
        ratios = [h / i for h, i in zip(runs["http"], runs["same"])]
        ratio = med["http"] / med["same"]
        spread = (max(ratios) - min(ratios)) / ratio
        verdict = ("unreliable on this run (ratios spread > 25%)" if spread > 0.25 else
                   f"goal {GOAL:.0%} {'met' if ratio >= GOAL else 'NOT met'}")
        print(f"--stream-interval {interval}: http {med['http']:,.0f} tokens/s; in-process {med['same']:,.0f} "
              f"({served} thread), {med['default']:,.0f} ({default} threads)\n"
              f"    http / in-process at the same threads = {ratio:.2f} (per repeat "
              f"{', '.join(f'{r:.2f}' for r in ratios)}): {verdict}; against {default} threads: "
              f"{med['http'] / med['default']:.2f}\n"
              f"    CPU per output token: server API process {statistics.median(api_cpu) * 1e6:.0f} us, engine "
              f"process {statistics.median(engine_cpu) * 1e6:.0f} us, openai client "
              f"{statistics.median(client_cpu) * 1e6:.0f} us; in-process wall per token "
              f"{1e6 / med['same']:.0f} us ({served} thread)")


if __name__ == "__main__":
    main()
