"""labkit.day0.serve: `python -m labkit.serving --model <release> --tp N` answers the real `openai` client with
text and image chat, as the single-process FP32 TinyVLM does (the independent reference: its own forward with
pixels, greedy); bad images get 400s naming the field and the service keeps serving; a rank that cannot load
ends the service with exit code 1 naming the rank, with no process left behind."""
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch
from PIL import Image

from labkit.day0 import TinyVLM, make_image_tasks, small_config
from labkit.day0.images import to_pixels
from labkit.day0.release import INDEX, ReleaseError, write_release
from labkit.day0.loading import placed_sizes
from labkit.day0.serve import ReleaseTokenizer, build_engine, check_release, encoder_model, kv_shape, rank_model
from labkit.paths import ROOT
from labkit.serving import SamplingParams
from labkit.serving.launch import start_service
from tests.processes import alive, descendants
from tests.refusals import assert_refused

MAX_TOKENS = 8
SCALE = 4.0
"""The random model's matrices are scaled up 4x so that its greedy tokens depend on the image and the text (at
PyTorch's default init a random TinyVLM repeats one token whatever it is shown: a test that could not fail)."""


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = TinyVLM(small_config()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(SCALE if p.dim() == 2 else 1.0)
    return m


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "tinyvlm"
    write_release(model.state_dict(), model.config, out, max_shard_size="20KB")  # several shards
    return out


@pytest.fixture(scope="module")
def images():
    return [t.image for t in make_image_tasks("colour", 3, "test", 0)]


def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(image) if isinstance(image, Image.Image) else image}}


def ask(image, question: str = "colour=") -> list[dict]:
    return [{"role": "user", "content": [image_part(image), {"type": "text", "text": question}]}]


@torch.no_grad()
def reference_text(model, tokens: list[int], images=(), stop: str | None = "\n") -> str:
    """Greedy text of the single-process TinyVLM (its own forward, pixels in), cut at the chat's stop."""
    pixels = to_pixels(list(images)) if images else None
    out = []
    for _ in range(MAX_TOKENS):
        logits = model(torch.tensor([tokens + out]), pixels=pixels)[0, -1]
        out.append(int(logits.argmax()))
    text = ReleaseTokenizer().decode(out)
    return text.split(stop)[0] if stop else text


def image_tokens(model, question: str = "colour=") -> list[int]:
    return [model.config.image_token_id] * model.config.tokens_per_image + list(question.encode())


@pytest.fixture(scope="module")
def services(folder):
    """The release served twice: one process (tp 1) and over two gloo ranks (tp 2)."""
    with start_service(folder, args=["--num-blocks", "64"], timeout=120) as one, \
            start_service(folder, args=["--tp", "2", "--num-blocks", "64"], timeout=120) as two:
        yield {1: one, 2: two}


def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=service.url, api_key="any", max_retries=0, timeout=60)


def chat(service, messages, **kw):
    return client(service).chat.completions.create(model="tinyvlm", messages=messages, max_tokens=MAX_TOKENS,
                                                   temperature=0, **kw)


# --- in this process ----------------------------------------------------------------------------------------

def test_build_engine_answers_as_the_reference(model, folder, images):
    pixels = to_pixels(images)
    with torch.no_grad():  # the encoder holds the release's weights
        assert torch.equal(encoder_model(folder, model.config).encode_images(pixels), model.encode_images(pixels))
    engine, processor, tokenizer = build_engine(folder, 1, num_blocks=32)
    engine.warmup()
    for image in images[:2]:
        prompt = processor.chat(ask(image))
        assert prompt.token_ids == image_tokens(model) and prompt.num_image_tokens == 4
        rid = engine.add_request(prompt.token_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), mm=prompt.mm)
        engine.run_until_done()
        got = tokenizer.decode(engine.get(rid).output)
        assert got == reference_text(model, prompt.token_ids, [image], stop=None)
    assert processor.cache.stats()["misses"] == 2
    processor.chat(ask(data_url(images[0], "BMP")))  # the same picture in another file format: a cache hit
    assert (processor.cache.stats()["misses"], processor.cache.stats()["hits"]) == (2, 1)


def inside(buffer: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether t's bytes lie within buffer's (data pointers: independent of labkit's Arena.holds)."""
    start, first = buffer.data_ptr(), t.data_ptr()
    return start <= first and first + t.numel() * t.element_size() <= start + buffer.numel() * buffer.element_size()


def test_the_service_s_weights_and_kv_pools_live_in_one_planned_buffer(model, folder):
    """tp 1 (the engine built here) and a rank of tp 2 (its builder, as TPRunner.from_builder runs it on the
    rank): every decoder weight and both KV pools are views of the rank's one arena buffer, in the planned
    regions."""
    engine, _, _ = build_engine(folder, 1, num_blocks=32, block_size=8, max_num_seqs=4)
    local = engine.runner.model
    buffer, plan = local.arena.buffer, local.arena.plan
    params = dict(local.named_parameters())
    assert params and all(inside(buffer, p) for p in params.values())
    assert {r.name for r in plan.weights} == set(placed_sizes(folder, 0, 1))
    kv = buffer[plan.kv.offset:plan.kv.end]
    assert inside(kv, engine.runner.k) and inside(kv, engine.runner.v)
    assert tuple(engine.runner.k.shape) == kv_shape(model.config, 1, 32, 8) and plan.kv.nbytes == engine.runner.nbytes()
    assert plan.activations.nbytes > 0 and plan.total == buffer.numel()
    from labkit.serving import tp as serving_tp  # rank 1 of 2's setup, as TPRunner.from_builder runs it there
    serving_tp.setup_worker(1, 2, "planned-buffer-test", rank_model, (str(folder), "bfloat16", 16, 8, 4),
                            model.config.text_config, 16, 8)
    runner = serving_tp._RUNNERS.pop("planned-buffer-test")
    shard = runner.model
    buffer = shard.local.arena.buffer
    assert all(inside(buffer, p) and p.dtype == torch.bfloat16 for _, p in shard.local.named_parameters())
    assert inside(buffer, runner.k) and inside(buffer, runner.v)
    assert runner.k.shape[1] == model.config.text_config.n_kv_heads // 2


def test_special_ids_decode_to_no_text():
    assert ReleaseTokenizer().decode_bytes([104, 256, 105, 263]) == b"hi"
    assert ReleaseTokenizer().encode("hi") == [104, 105]


def test_check_release_refuses_what_would_not_start(model, folder, tmp_path):
    assert check_release(folder, 2) == model.config
    with pytest.raises(ValueError, match="^tp must be a divisor of n_heads=4"):
        check_release(folder, 3)
    with pytest.raises(ReleaseError, match="config.json is missing"):
        check_release(tmp_path, 1)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ReleaseError, match="config.json: not valid JSON"):
        check_release(tmp_path, 1)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ReleaseError, match=f"neither {INDEX}"):
        check_release(tmp_path, 1)
    assert_refused(lambda: check_release(3, 1), TypeError, "folder", 3, "a release folder")
    assert_refused(lambda: build_engine(folder, 1, "int8"), ValueError, "dtype", "int8", "one of")
    assert_refused(lambda: build_engine(folder, 1, timeout=0), ValueError, "timeout", 0, "")


# --- the service as a learner starts it ---------------------------------------------------------------------

@pytest.mark.timeout(240)
@pytest.mark.parametrize("tp", [1, 2])
def test_image_chat_is_answered_and_counts_image_tokens(services, model, images, tp):
    reply = chat(services[tp], ask(images[0]))
    assert reply.choices[0].message.content == reference_text(model, image_tokens(model), [images[0]])
    assert reply.usage.prompt_tokens == model.config.tokens_per_image + len("colour=")


@pytest.mark.timeout(240)
def test_tp2_gives_the_same_greedy_text_as_tp1(services, model, images):
    for image in images:
        for question in ("colour=", "count="):
            texts = [chat(services[tp], ask(image, question)).choices[0].message.content for tp in (1, 2)]
            assert texts[0] == texts[1] == reference_text(model, image_tokens(model, question), [image])


@pytest.mark.timeout(240)
def test_streaming_gives_the_same_text_and_usage(services, model, images):
    messages = [{"role": "user", "content": [{"type": "text", "text": "count="}, image_part(images[1])]}]
    chunks = list(chat(services[2], messages, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = list(b"count=") + [model.config.image_token_id] * model.config.tokens_per_image
    assert text == reference_text(model, tokens, [images[1]])
    assert chunks[-1].usage.prompt_tokens == len(tokens)


@pytest.mark.timeout(240)
def test_text_only_requests(services, model):
    reply = chat(services[2], [{"role": "user", "content": "12+7="}])
    assert reply.choices[0].message.content == reference_text(model, list(b"12+7="))
    assert reply.usage.prompt_tokens == 5
    done = client(services[2]).completions.create(model="tinyvlm", prompt="ab", max_tokens=MAX_TOKENS, temperature=0)
    assert done.choices[0].text == reference_text(model, list(b"ab"), stop=None)


@pytest.mark.timeout(240)
def test_the_same_picture_in_another_format_gets_the_same_answer(services, images):
    """The same pixels as PNG and as BMP: the same answer (in-process, the cache hit is counted above)."""
    service = services[1]
    before = chat(service, ask(images[2])).choices[0].message.content
    again = chat(service, ask(data_url(images[2], "BMP"))).choices[0].message.content
    assert before == again


BAD_IMAGES = [  # (content parts, the param the 400 names)
    ([image_part("https://example.com/cat.png")], "messages[0].content[0].image_url.url"),  # never fetched
    ([image_part("data:image/png;base64," + base64.b64encode(b"not a png").decode())],
     "messages[0].content[0].image_url.url"),
    ([image_part("data:image/png;base64,@@@")], "messages[0].content[0].image_url.url"),
    ([{"type": "text", "text": "a"}, image_part(Image.new("RGB", (1100, 1000)))],  # over 2**20 pixels
     "messages[0].content[1].image_url.url"),
    ([image_part(Image.new("RGB", (32, 32)))] * 3, "messages[0].content[2]"),  # small_config: 2 images at most
    ([{"type": "image_url", "image_url": {"link": "x"}}], "messages[0].content[0].image_url.url"),  # missing
]


@pytest.mark.timeout(240)
def test_bad_images_get_400_naming_the_field_and_the_service_keeps_serving(services, model, images):
    for content, param in BAD_IMAGES:
        r = httpx.post(services[2].url + "/chat/completions", timeout=60,
                       json={"model": "tinyvlm", "messages": [{"role": "user", "content": content}], "max_tokens": 2})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), error
        says = " is a required field" if error["code"] == "missing_required_parameter" else " must be "
        assert error["message"].startswith(param + says), error
    with pytest.raises(openai.BadRequestError):
        chat(services[2], ask("http://example.com/a.png"))
    assert chat(services[2], ask(images[0])).choices[0].message.content == \
        reference_text(model, image_tokens(model), [images[0]])
    assert httpx.get(services[2].root + "/health").status_code == 200


# --- start-up failures ----------------------------------------------------------------------------------------

def serve(folder, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "labkit.serving", "--model", str(folder), "--port", "0", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.timeout(120)
def test_health_is_503_until_every_rank_loaded_then_200(folder):
    """The command a learner types: the HTTP server answers at once, /health is 503 "loading" while the two
    ranks start and load (seconds: each rank is a new process importing torch) and 200 "ready" after the
    warm-up forward, never 503 again. Start to 200 is printed (the goal, <= 15 s, is the benchmark's)."""
    t0 = time.monotonic()
    proc = serve(folder, "--tp", "2")
    try:
        url = proc.stdout.readline().rsplit(" on ", 1)[1].strip().removesuffix("/v1")
        seen = []
        while not seen or seen[-1][0] != 200:
            assert proc.poll() is None and time.monotonic() - t0 < 100, proc.stderr.read() if proc.poll() else seen
            r = httpx.get(url + "/health", timeout=10)
            seen.append((r.status_code, r.json()["status"]))
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        assert seen[0] == (503, "loading") and set(seen[:-1]) == {(503, "loading")}, seen
        assert all(httpx.get(url + "/health", timeout=10).status_code == 200 for _ in range(3))
        engine = httpx.get(url + "/health", timeout=10).json()["engine"]  # the engine core in its own process,
        assert engine["alive"] and engine["pid"] in descendants(proc.pid), engine  # the ranks its children
        assert len(descendants(engine["pid"])) >= 2, descendants(engine["pid"])
        print(f"\nstart to 200 on /health with --tp 2: {ready_s:.1f} s (noisy; goal <= 15 s)")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_load_ends_the_service_naming_it(folder, tmp_path):
    broken = shutil.copytree(folder, tmp_path / "tinyvlm")
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    victim = index["language_model.layers.1.mlp.w_down.weight"]  # a shard every rank reads a slice of
    data = (broken / victim).read_bytes()
    (broken / victim).write_bytes(data[:len(data) - 100])  # truncated
    t0 = time.monotonic()
    proc = serve(broken, "--tp", "2")
    seen: set[int] = set()

    def watch():  # every process the service ever had below it
        while proc.poll() is None:
            seen.update(descendants(proc.pid))
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    watcher.join(5)
    assert proc.returncode == 1, err
    assert re.search(r"rank \d failed with ReleaseError: " + victim, err), err
    assert seen, "the ranks were never seen running"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in seen if alive(p)], "processes outlived the service"
    print(f"\nfailed start-up reported in {time.monotonic() - t0:.1f} s")


@pytest.mark.timeout(60)
def test_options_are_checked_against_the_release_at_start(folder, capsys):
    from labkit.serving.__main__ import parse_args
    assert parse_args(["--model", str(folder), "--served-model-name", "x"]).name == "x"
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", str(folder), "--tp", "3"])
    assert info.value.code == 2 and "tp must be a divisor of n_heads=4" in capsys.readouterr().err
