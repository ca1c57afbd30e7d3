"""The HTTP service against the in-process engine on the same requests, measured in one run (goal: 32
concurrent streaming clients get at least 90% of the in-process engine's output tokens/s).

    python benchmarks/serving_http.py [--clients 32] [--max-tokens 64] [--repeats 6] [--intervals 1 8]
                                      [--load openai httpx]

In-process: labkit.serving.Engine on the wall clock, the 32 requests added at once and run to completion, with
as many torch threads as the service uses (its --threads default: the cores but one) and with torch's default.
HTTP: `python -m labkit.serving --model data/tinylm --port 0` in its own process (labkit.serving.launch: the API
process, which spawns the engine-core process), and `clients` concurrent streaming completions (temperature 0,
the same prompts and max_tokens, stream_options.include_usage for the token count) from one asyncio process
here, by two load generators in turn:
  openai  the `openai.AsyncOpenAI` client (what a user runs; it parses every chunk into a typed object),
  httpx   plain streaming POSTs that only split the event stream into lines and read the last chunk's usage
          (as vLLM's benchmarks/benchmark_serving.py drives a server with aiohttp: the client's own CPU kept
          small, so the server is what is measured).
Tokens/s = output tokens / (last token - start). The runs take turns, `repeats` times; the ratio of medians is
printed with the per-repeat ratios, and the goal is met when enough repeats' ratios reach it (the course's rule,
labkit.course.evidence.against_goal, the sign test: all 6 of 6, 12 of 15). The load generator shares the
machine's cores with the server, as one on the same host does, so the CPU seconds per output token of the API
process, the engine process it spawned and the load generator are printed beside the ratio, with the ceiling
they set: on `cores` cores the HTTP run can reach at most cores / (their sum) tokens per second, shown as a share
of the in-process run beside it. The service is started once per stream interval (`--stream-interval`: tokens
per streamed chunk at least; 1 sends every token as it is made).
"""

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx
import openai
import torch

from labkit.course import evidence
from labkit.serving import Engine, SamplingParams
from labkit.serving.launch import start_service
from labkit.serving.workload import make_trace
from labkit.tinylm import ByteTokenizer, load_pretrained

GOAL = 0.9


def in_process(model, prompts, max_tokens: int, threads: int) -> float:
    """Output tokens/s of Engine.generate on every prompt at once, with `threads` torch threads (this process's
    CPU time is read around it by the caller)."""
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


async def _openai_stream(client: openai.AsyncOpenAI, text: str, max_tokens: int) -> int:
    """One streaming completion through the openai client; its output tokens (the usage chunk)."""
    stream = await client.completions.create(model="tinylm", prompt=text, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    tokens = 0
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens


async def _httpx_stream(client: httpx.AsyncClient, text: str, max_tokens: int) -> int:
    """One streaming completion as plain HTTP: the event stream read line by line, only the last chunk (the
    usage) parsed."""
    body = {"model": "tinylm", "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    last = None
    async with client.stream("POST", "completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = line
    usage = json.loads(last.removeprefix("data: ")).get("usage") if last else None
    if not usage:  # an in-band error event, or a stream cut short: say so rather than count it
        raise RuntimeError(f"the stream for {text[:40]!r} ended without its usage chunk; its last event: {last}")
    return usage["completion_tokens"]


def over_http(base_url: str, texts: list[str], max_tokens: int, load: str, meter=lambda: ()) -> tuple:
    """Output tokens/s of one streaming completion per text, all at once: concurrent streams from one asyncio
    client (as vLLM's benchmark_serving drives a server: one process, one event loop), `load` "openai" or
    "httpx" (the module's docstring); with `meter()` (CPU seconds of the processes watched) read when the
    timing starts and when it ends."""

    async def run() -> tuple:
        if load == "openai":
            client = openai.AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0, timeout=120)
            one = _openai_stream
        else:
            client = httpx.AsyncClient(base_url=base_url + "/", timeout=120,
                                       limits=httpx.Limits(max_connections=len(texts)))
            one = _httpx_stream
        await one(client, texts[0], max_tokens)  # a connection and the client's first-call set-up, not timed
        before, t0 = meter(), time.perf_counter()
        counts = await asyncio.gather(*(one(client, t, max_tokens) for t in texts))
        seconds, after = time.perf_counter() - t0, meter()
        await (client.close() if load == "openai" else client.aclose())
        return sum(counts) / seconds, [b - a for a, b in zip(before, after)]

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=evidence.MIN_GOAL_REPEATS)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--load", nargs="+", choices=["openai", "httpx"], default=["openai", "httpx"],
                        help="the load generators, each in turn in every repeat")
    args = parser.parse_args()
    model, _ = load_pretrained()
    tok = ByteTokenizer()
    trace = [r for r in make_trace(4 * args.clients, float("inf"), seed=3) if len(r.prompt) + args.max_tokens <= 256]
    prompts = [list(r.prompt) for r in trace[:args.clients]]
    texts = [tok.decode(p) for p in prompts]
    assert [tok.encode(t) for t in texts] == prompts  # the service sees exactly these tokens
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # the cores but one, as the service's --threads default (passed to it explicitly, so both run the same)
    served, default = max(1, cores - 1), torch.get_num_threads()
    tokens = args.clients * args.max_tokens
    print(f"{args.clients} concurrent requests, {args.max_tokens} output tokens each, greedy, on {cores} cores; "
          f"the service runs {served} torch thread(s), in-process runs {served} and torch's default {default}")
    for interval in args.intervals:
        with start_service(args=["--stream-interval", str(interval)], timeout=120, threads=served) as service:
            for load in args.load:  # warm-up, both sides
                over_http(service.url, texts[:4], 4, load)
            in_process(model, prompts[:4], 4, default)
            runs = {"same": [], "default": [], **{load: [] for load in args.load}}
            cpu = {(load, who): [] for load in args.load for who in ("api", "engine", "load")}
            ceiling = {load: [] for load in args.load}
            engine = json.loads(service.get("/health"))["engine"]["pid"]  # the engine process (/health)
            meter = lambda: (cpu_seconds(service.pid), cpu_seconds(engine), time.process_time())  # noqa: E731
            for _ in range(args.repeats):
                runs["same"].append(in_process(model, prompts, args.max_tokens, served))
                runs["default"].append(in_process(model, prompts, args.max_tokens, default))
                for load in args.load:
                    rate, spent = over_http(service.url, texts, args.max_tokens, load, meter)
                    runs[load].append(rate)
                    for who, seconds in zip(("api", "engine", "load"), spent):
                        cpu[load, who].append(seconds / tokens)
                    # what the cores allow at this CPU per token, as a share of the in-process run beside it
                    ceiling[load].append(cores / (sum(spent) / tokens) / runs["same"][-1])
        med = {k: statistics.median(v) for k, v in runs.items()}
        us = {k: statistics.median(v) * 1e6 for k, v in cpu.items()}
        print(f"--stream-interval {interval}: in-process {med['same']:,.0f} tokens/s ({served} thread), "
              f"{med['default']:,.0f} ({default} threads)")
        for load in args.load:
            ratios = [h / i for h, i in zip(runs[load], runs["same"])]
            ratio = med[load] / med["same"]
            verdict = evidence.against_goal("http / in-process", ratios, GOAL).verdict()
            print(f"  {load:>6}: http {med[load]:,.0f} tokens/s; http / in-process at the same threads = "
                  f"{ratio:.2f} (per repeat {', '.join(f'{r:.2f}' for r in ratios)}): {verdict}; against "
                  f"{default} threads: {med[load] / med['default']:.2f}\n"
                  f"          CPU per output token: API process {us[load, 'api']:.0f} us, engine process "
                  f"{us[load, 'engine']:.0f} us, load generator {us[load, 'load']:.0f} us: at that CPU per "
                  f"token {cores} cores allow at most {statistics.median(ceiling[load]):.2f} of in-process")


if __name__ == "__main__":
    main()
