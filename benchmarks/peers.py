"""llama.cpp beside labkit on the course's own model, in one run: the same text, the INT4
matrix-vector product, and serving.

    make peers                                  # once: builds llama-cpp-python (llama.cpp from source)
    .venv/bin/python benchmarks/peers.py [--repeats 9] [--parts text,gemv,serving]

Notebooks 03 (parts text and gemv) and 06 (serving) run it in a cell when llama-cpp-python is installed.

(a) text     TinyLM written as GGUF (labkit.quant.write_gguf: F32, Q8_0, Q4_0) and run by llama.cpp, greedy,
             "\\n" allowed (llama.cpp would stop there: generate() does not), against TinyLM's own greedy
             continuation (labkit.tinylm.generate) on the course's task prompts, in FP32 and on the file's own
             weights (each matrix through lab 03's block format and back: the same numbers llama.cpp holds;
             llama.cpp's Q8_0/Q4_0 matmuls also round the activations to 8 bits, labkit's do not): the share of
             prompts whose continuations agree token for token, and the mean share of tokens before the first
             difference.
(b) GEMV     a one-layer Llama of width 4096 (d_ff 4096, 32 heads, vocabulary 256: per token, seven 4096 x 4096
             matrices and a 256 x 4096 one) in Q4_0 (lab 03's bytes) and Q4_K_S (llama.cpp's own quantizer);
             llama.cpp's time per token over its seven matrices against labkit's QuantLinear INT4 (torch's
             kernel) and lab 03's top rung (labkit.quant.kernels.RUNGS: 7, or 5 without a C compiler) over
             seven distinct 4096 x 4096 layers, on 1 and 2 threads, and torch's sum over 256 MiB (the memory
             roof), all in turns (labkit.course.timing.interleave). llama.cpp's time includes norms, RoPE, a short
             attention and the 256-row output: its GFLOP/s (2 * 7 * 4096^2 FLOP per token) is a lower bound of its
             GEMV's. Each case makes its seven products (llama.cpp: 16 tokens of them) one after another.
(c) serving  `python -m llama_cpp.server` (Q8_0) against `python -m labkit.serving` (TinyLM, FP32), each on one
             torch/ggml thread, the same 32 concurrent streaming completions from the same `openai` client:
             output tokens/s, the median and p90 time to first token, and the tokens each stream got.
             llama.cpp's server runs one request at a time (no continuous batching), and by default a new request
             interrupts the running one (its stream ends early): it runs with --interrupt_requests False, so the
             32 streams queue and each gets all its tokens.

Copy the output into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

try:
    import llama_cpp
except ImportError:
    sys.exit("llama-cpp-python is not installed: run `make peers` (it compiles llama.cpp: minutes on 2 cores)")

from labkit.course import interleave
from labkit.day0.explore import free_port
from labkit.paths import ROOT
from labkit.quant import QuantLinear, kernels, quantize, write_gguf
from labkit.quant.gguf import QUANTIZE, tensor_plan
from labkit.quant.formats import dequantize_q4_0, dequantize_q8_0
from labkit.serving.launch import start_service
from labkit.serving.workload import make_trace
from labkit.tinylm import TASK_KINDS, ByteTokenizer, TinyLM, TinyLMConfig, generate, load_pretrained, make_tasks

WIDTH = 4096
MATRICES = 7  # q, k, v, o, gate, up, down
ROOF_BYTES = 256 * 2**20
PARTS = ("text", "gemv", "serving")
BUFTS = ""  # set below on a CPU with AMX
DEQUANTIZE = {"Q8_0": dequantize_q8_0, "Q4_0": dequantize_q4_0}


AMX = "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()
"""On a CPU with AMX, llama.cpp (0.3.36's) puts Q8_0 and Q4_0 matrices in its AMX buffer type, whose matmul
crashes with SIGSEGV on TinyLM's first decode (Xeon with AMX, 2026-12-02; ggml_backend_amx_mul_mat, as
llama.cpp issue #20824 reports). There every Llama of this script, and its server, loads without llama.cpp's
extra buffer types (AMX and the repacked Q4_0 layouts: the plain ggml-cpu kernels, AVX-512 VNNI included)."""
NO_EXTRA_BUFTS = """
import llama_cpp.llama_cpp as api
default = api.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = False
    return p
api.llama_model_default_params = params
"""
"""Run in this process (and before llama_cpp.server in its own) where AMX is: every Llama loads without them."""
if AMX:
    exec(NO_EXTRA_BUFTS)
    BUFTS = " (this CPU has AMX: llama.cpp runs without its AMX and repacked buffers, see peers.AMX)"


def llama(path: Path, threads: int, n_ctx: int = 256) -> "llama_cpp.Llama":
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                           verbose=False)


# --- (a) the same text ------------------------------------------------------------------------------------------

def llama_greedy(llm, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` in llama.cpp, "\\n" allowed (generate() never stops by itself)."""
    out = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == n:
            return out
    return out


def file_weights(model, qtype: str):
    """A copy of TinyLM whose weights are the ones the `qtype` GGUF file stores (each matrix through lab 03's
    block format and back): TinyLM's own forward on exactly llama.cpp's weights."""
    copy = load_pretrained()[0]
    state = copy.state_dict()
    with torch.no_grad():
        for _, name, q in tensor_plan(model, qtype):
            if q != "F32":
                w = state[name].numpy()
                back = DEQUANTIZE[q](QUANTIZE[q](w)).reshape(w.shape)
                state[name].copy_(torch.from_numpy(back))
    return copy


def same_text(got: list[list[int]], ref: list[list[int]], n: int) -> str:
    same = sum(g == r for g, r in zip(got, ref))
    first = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), n) / n for g, r in zip(got, ref)]
    return (f"identical {same}/{len(ref)} ({same / len(ref):.0%}), "
            f"{statistics.mean(first):.0%} of tokens before a difference")


def agreement(model, folder: Path, prompts: list[list[int]], n: int) -> None:
    reference = [generate(model, p, n) for p in prompts]
    print(f"(a) greedy text, {len(prompts)} task prompts, {n} tokens each: llama.cpp against TinyLM in FP32 and "
          f"against TinyLM on the file's own (dequantized) weights{BUFTS}")
    for qtype in ("F32", "Q8_0", "Q4_0"):
        llm = llama(write_gguf(model, folder / f"tinylm-{qtype.lower()}.gguf", qtype), threads=1)
        assert llm.tokenize(b"copy abc -> ", add_bos=False, special=False) == list(b"copy abc -> ")  # id = byte
        got = [llama_greedy(llm, p, n) for p in prompts]
        same_weights = file_weights(model, qtype)
        ours = [generate(same_weights, p, n) for p in prompts]
        print(f"    {qtype:<5} vs FP32: {same_text(got, reference, n)}; vs the same weights in labkit: "
              f"{same_text(got, ours, n)}")
        del llm


# --- (b) the INT4 matrix-vector product ------------------------------------------------------------------------

def wide_model() -> TinyLM:
    torch.manual_seed(0)
    cfg = TinyLMConfig(d_model=WIDTH, n_layers=1, n_heads=32, n_kv_heads=32, d_ff=WIDTH, max_seq_len=256)
    model = TinyLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02)
    return model.eval()


def q4_k(src: Path, dst: Path) -> Path:
    """llama.cpp's own quantizer: `src` (F32) to Q4_K_S (every matrix q4_K where its rows allow)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src}")
    return dst


def decode_tokens(llm, tokens: int = 16):
    """A function that decodes `tokens` tokens one at a time from an empty context (one llama_decode each)."""
    def run():
        llm.reset()
        for t in range(tokens):
            llm.eval([65 + t % 26])
    run.tokens = tokens
    return run


def gemv(folder: Path, repeats: int) -> None:
    model = wide_model()
    q4_0 = write_gguf(model, folder / "wide-q4_0.gguf", "Q4_0")
    f32 = write_gguf(model, folder / "wide-f32.gguf", "F32")
    q4k = q4_k(f32, folder / "wide-q4_k_s.gguf")
    f32.unlink()
    gen = torch.Generator().manual_seed(0)
    qs = [quantize(torch.randn(WIDTH, WIDTH, generator=gen) * 0.02, 4, "asym", 32) for _ in range(MATRICES)]
    layers = [QuantLinear(q) for q in qs]
    rung = next(name for name in reversed(kernels.RUNGS) if kernels.available(name)[0])  # the ladder's top rung here
    packed = [kernels.pack_weight(q) for q in qs]
    x = torch.randn(1, WIDTH, generator=gen)
    roof = torch.ones(ROOF_BYTES // 4)

    def on(threads: int, fn):  # kernels.threads: torch's and numba's counts (rung 5 runs on numba's)
        def run():
            with kernels.threads(threads):
                fn()
        return run

    sweep = lambda: [m(x) for m in layers]  # noqa: E731
    ladder = lambda: [kernels.RUNGS[rung](x, w) for w in packed]  # noqa: E731
    cases = {f"{label}, {t} thread{'s' if t > 1 else ''}": on(t, fn) for label, fn in
             (("labkit INT4 (QuantLinear)", sweep), (f"labkit rung {rung[0]}", ladder)) for t in (2, 1)}
    tokens = 16
    llms = {}
    for name, path in (("Q4_0", q4_0), ("Q4_K_S", q4k)):
        for threads in (2, 1):
            llm = llms[(name, threads)] = llama(path, threads, n_ctx=64)
            cases[f"llama.cpp {name}, {threads} thread{'s' if threads > 1 else ''}"] = decode_tokens(llm, tokens)
    cases["roof: torch sum over 256 MiB, 2 threads"] = on(2, roof.sum)
    cases["roof: torch sum over 256 MiB, 1 thread"] = on(1, roof.sum)
    timings = interleave(cases, repeats=repeats, warmup=1)
    flop = 2 * MATRICES * WIDTH * WIDTH
    q4_0_bytes = MATRICES * WIDTH * WIDTH // 32 * 18  # 18 bytes per 32 weights
    q4_k_bytes = MATRICES * WIDTH * WIDTH // 256 * 144  # 144 bytes per 256 weights (4.5 bits)
    labkit_bytes = MATRICES * (layers[0].int4pack.numel() * layers[0].int4pack.element_size()
                               + layers[0].scales_and_zeros.numel() * layers[0].scales_and_zeros.element_size())
    rung_bytes = MATRICES * packed[0].nbytes  # codes and float32 scales and offsets: 6 bits per weight
    roofs = {t: ROOF_BYTES / timings[f"roof: torch sum over 256 MiB, {t} thread{'s' if t > 1 else ''}"].median
             for t in (1, 2)}
    print(f"(b) INT4 batch-1 matrix-vector products, {MATRICES} x [{WIDTH}, {WIDTH}] per sweep or per llama.cpp "
          f"token, {repeats} rounds in turns (medians); torch {torch.__version__}, llama-cpp-python "
          f"{llama_cpp.__version__}{BUFTS}; labkit rung {rung!r}")
    if rung in kernels.C_RUNGS:  # which instructions ran: the build's compiler, flags, lanes and rung 7's path
        print(f"    labkit's C rungs: {kernels.available(rung)[1]}")
    for t in (2, 1):
        print(f"    roof on {t} thread{'s' if t > 1 else ' '}: {roofs[t] / 1e9:5.1f} GB/s")
    for name, timing in timings.items():
        if name.startswith("roof"):
            continue
        threads = 1 if name.endswith("1 thread") else 2
        seconds = timing.median / (tokens if name.startswith("llama") else 1)
        nbytes = q4_k_bytes if "Q4_K" in name else q4_0_bytes if "Q4_0" in name else \
            rung_bytes if "rung" in name else labkit_bytes
        rate = nbytes / seconds
        print(f"    {name:<36} {seconds * 1e3 / MATRICES:6.2f} ms per matrix {flop / seconds / 1e9:6.1f} GFLOP/s "
              f"{rate / 1e9:5.1f} GB/s = {rate / roofs[threads]:4.0%} of the roof (spread {timing.spread:.0%})")
    del llms


# --- (c) serving -------------------------------------------------------------------------------------------------

def streams(base_url: str, texts: list[str], max_tokens: int, extra: dict) -> tuple[float, list[float], list[int]]:
    """(output tokens/s, times to first token in s, tokens of each stream) of one streaming completion per text,
    all at once, from one asyncio client. Tokens are counted as bytes of text (both tokenizers: one token per
    byte)."""

    async def run():
        import openai
        client = openai.AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0, timeout=600)

        async def one(text: str) -> tuple[int, float]:
            t0 = time.perf_counter()
            stream = await client.completions.create(model="tinylm", prompt=text, max_tokens=max_tokens,
                                                     temperature=0, stream=True, **extra)
            first, out = None, b""
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    first = first or time.perf_counter() - t0
                    out += chunk.choices[0].text.encode()
            return len(out), first

        await one(texts[0])  # the connection and the client's set-up, outside the timing
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(t) for t in texts))
        seconds = time.perf_counter() - t0
        await client.close()
        return sum(n for n, _ in results) / seconds, [f for _, f in results], [n for n, _ in results]

    return asyncio.run(run())


def serving(folder: Path, clients: int, max_tokens: int) -> None:
    tok = ByteTokenizer()
    trace = [r for r in make_trace(4 * clients, float("inf"), seed=3) if len(r.prompt) + max_tokens <= 256]
    texts = [tok.decode(list(r.prompt)) for r in trace[:clients]]
    model, _ = load_pretrained()
    gguf = write_gguf(model, folder / "tinylm-q8_0.gguf", "Q8_0")
    port = free_port()
    launch = ["-c", NO_EXTRA_BUFTS + "import runpy; runpy.run_module('llama_cpp.server', run_name='__main__')"] \
        if AMX else ["-m", "llama_cpp.server"]  # the same argv either way: runpy keeps sys.argv[1:]
    server = subprocess.Popen([sys.executable, *launch, "--model", str(gguf), "--port", str(port),
                               "--host", "127.0.0.1", "--n_ctx", "256", "--n_threads", "1", "--n_threads_batch", "1",
                               "--model_alias", "tinylm", "--interrupt_requests", "False"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import httpx
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama_cpp.server did not start in 120 s"
            time.sleep(0.2)
        peer = streams(f"http://127.0.0.1:{port}/v1", texts, max_tokens,
                       {"logit_bias": {str(ByteTokenizer.eos_id): -100}})
    finally:
        server.terminate()
        server.wait(30)
    with start_service(args=["--threads", "1"], timeout=120) as service:
        ours = streams(service.url, texts, max_tokens, {})
    print(f"(c) serving: {clients} concurrent streaming completions, {max_tokens} tokens each (llama.cpp: \"\\n\" "
          f"banned with logit_bias so that it does not stop early), one thread each")
    for name, (rate, ttft, tokens) in (("llama_cpp.server (Q8_0)", peer), ("python -m labkit.serving (FP32)", ours)):
        q = statistics.quantiles(ttft, n=10)
        print(f"    {name:<32} {rate:7.0f} output tokens/s   TTFT median {statistics.median(ttft) * 1e3:7.0f} ms, "
              f"p90 {q[-1] * 1e3:7.0f} ms   tokens per stream {min(tokens)}-{max(tokens)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--parts", default=",".join(PARTS), help="which of text, gemv, serving to run")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if not parts or any(p not in PARTS for p in parts):
        parser.error(f"--parts must be a comma-separated list of {', '.join(PARTS)}, got {args.parts!r}")
    for name in ("repeats", "prompts", "tokens", "clients", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive int, got {getattr(args, name)}")
    torch.set_num_threads(2)
    model, _ = load_pretrained()
    per_kind = -(-args.prompts // len(TASK_KINDS))
    prompts = [list(t.prompt.encode()) for kind in TASK_KINDS for t in make_tasks(kind, per_kind)][:args.prompts]
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        folder = Path(tmp)
        if "text" in parts:
            agreement(model, folder, prompts, args.tokens)
        if "gemv" in parts:
            gemv(folder, args.repeats)
        if "serving" in parts:
            serving(folder, args.clients, args.max_tokens)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
