"""labkit.day0.multimodal on a random TinyVLM(small_config()) and the course's images: the image hash is the
content's (the same pixels in another file hash alike); data URLs decode to the same pixels and everything else
is refused by field name; the encoder runs once per distinct image (counted by a wrapper); the chat template is
the training format (labkit.day0.evaluate.task_tokens); and through the engine every image request's answer is
the model's own greedy forward with its image, for every policy (chunked prefill splitting an image, preemption
by recompute and swap), while the naive prefix cache (hash_mm=False) answers the second image from the first's."""
import base64
import hashlib
import io
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from labkit.day0.config import small_config
from labkit.day0.evaluate import task_tokens
from labkit.day0.images import make_image_tasks, to_pixels
from labkit.day0.model import TinyVLM
from labkit.day0.multimodal import EncoderCache, VLMProcessor, decode_image_url, image_hash
from labkit.serving import Engine, SamplingParams, StepCost
from tests.refusals import assert_refused

CFG = small_config()
GREEDY = SamplingParams(max_tokens=6, temperature=0)
FIELD = "messages[0].content[0].image_url.url"


@pytest.fixture(scope="module")
def vlm():
    """A random TinyVLM whose decoder weights have std 0.3 (at TinyLM's 0.02 init its greedy output ignores the
    image): each image then gets its own answer."""
    torch.manual_seed(0)
    model = TinyVLM(CFG).eval()
    with torch.no_grad():
        for p in model.language_model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def images():
    return [t.image for t in make_image_tasks("colour", 6, seed=1)]


def data_url(image: Image.Image, fmt: str = "PNG", **save) -> str:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def chat(*parts) -> list[dict]:
    """One user message: str parts are text, PIL images become image_url parts (PNG data URLs)."""
    return [{"role": "user", "content": [{"type": "text", "text": p} if isinstance(p, str) else
                                         {"type": "image_url", "image_url": {"url": data_url(p)}} for p in parts]}]


class Counting:
    """The encoder behind a counter of the images it was run on (the test's own wrapper, nothing patched)."""

    def __init__(self, encode):
        self.encode, self.images, self.calls = encode, 0, 0

    def __call__(self, pixels):
        self.images, self.calls = self.images + pixels.shape[0], self.calls + 1
        return self.encode(pixels)


@torch.no_grad()
def reference(vlm, tokens: list[int], pics: list[Image.Image], n: int = GREEDY.max_tokens) -> list[int]:
    """Greedy tokens of full forwards (no cache): TinyVLM.forward(tokens, pixels) for the first, then the language
    model with the image features over the prompt's placeholders (a generated id 256 is then a plain token)."""
    pixels = to_pixels(pics)
    first = int(vlm(torch.tensor([tokens]), pixels=pixels)[0, -1].argmax())
    rows = vlm.image_rows(torch.tensor(tokens))
    embeds = (rows, vlm.encode_images(pixels).reshape(-1, CFG.text_config.d_model))
    out = [first]
    for _ in range(n - 1):
        out.append(int(vlm.language_model(torch.tensor([tokens + out]), embeds=embeds)[0, -1].argmax()))
    return out


# --- hashing and decoding ----------------------------------------------------------------------------------

def test_the_hash_is_of_the_pixels_not_of_the_file(images):
    a, b = images[0], images[1]
    files = [data_url(a, "PNG", compress_level=0), data_url(a, "PNG", compress_level=9), data_url(a, "BMP")]
    assert len(set(files)) == 3  # three different files ...
    decoded = [decode_image_url(u) for u in files]
    assert len({image_hash(d) for d in decoded}) == 1 and image_hash(a) == image_hash(decoded[0])  # ... one image
    pixels = np.asarray(a.convert("RGB"))
    assert image_hash(a) == hashlib.sha256(b"RGB" + struct.pack("<II", *a.size) + pixels.tobytes()).hexdigest()
    assert image_hash(b) != image_hash(a)
    assert all(np.array_equal(np.asarray(d), pixels) and d.mode == "RGB" for d in decoded)


def test_a_palette_or_transparent_image_decodes_to_rgb(images):
    for img in (images[0].convert("P"), images[0].convert("RGBA")):
        out = decode_image_url(data_url(img))
        assert out.mode == "RGB" and out.size == img.size


def test_every_bad_image_url_is_refused_naming_the_field(images):
    png = io.BytesIO()
    images[0].save(png, "PNG")
    raw = png.getvalue()
    b64 = lambda data, kind="png": f"data:image/{kind};base64," + base64.b64encode(data).decode()  # noqa: E731
    big = Image.new("RGB", (64, 64), (9, 9, 9))
    cases = [
        ("https://example.com/cat.png", "https://example.com/cat.png", "a base64 data URL"),  # nothing fetched
        ("data:text/plain;base64,aGk=", "data:text/plain;base64,aGk=", "a base64 data URL"),
        ("data:image/png;base64,@@@@", "4 characters after base64,", "valid base64"),
        (b64(b"hello, world"), "12 bytes of data:image/png", "an image Pillow decodes"),
        (b64(raw[:len(raw) // 2]), None, "an image Pillow decodes"),  # a truncated PNG
        (data_url(images[0], "TIFF"), None, "an image Pillow decodes (PNG, JPEG, GIF, BMP, WEBP)"),  # not allowed
        (data_url(images[0], "EPS"), None, "an image Pillow decodes"),  # a format whose decoder runs a program
        (data_url(big), "a 64 x 64 image (4096 pixels)", "at most 1024 pixels"),
        (b64(b"x" * 9000), None, "at most 8192 bytes"),
    ]
    proc = VLMProcessor(lambda px: torch.zeros(px.shape[0], CFG.tokens_per_image, CFG.text_config.d_model), CFG,
                        max_bytes=8192, max_pixels=1024)
    for url, value, expected in cases:
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
        with pytest.raises(ValueError) as info:
            proc.chat(messages)
        assert str(info.value).startswith(f"{FIELD} must be ") and expected in str(info.value), str(info.value)
        if value is not None:
            assert repr(value) in str(info.value)
    assert proc.cache.misses == 0  # the encoder never ran on a refused image
    assert_refused(lambda: decode_image_url(5), TypeError, "url", "int", "a data:image/...;base64,... URL")
    assert_refused(lambda: decode_image_url("data:,", max_bytes=0), ValueError, "max_bytes", 0, "a positive int")
    assert_refused(lambda: image_hash(b"png"), TypeError, "image", b"png", "a PIL image")


# --- the encoder cache and the chat template ---------------------------------------------------------------

def test_the_encoder_runs_once_per_distinct_image(vlm, images):
    enc = Counting(vlm.encode_images)
    proc = VLMProcessor(enc, CFG)
    a, b = images[0], images[1]
    first = proc.chat(chat(a, "colour="))
    proc.chat(chat(a, "shape="))
    proc.chat(chat(b, a, "count="))
    proc.chat(chat(b, b, "colour="))
    assert enc.images == 2 and enc.calls == 2  # a, then b: every other lookup a hit
    assert (proc.cache.hits, proc.cache.misses) == (4, 2)
    with torch.no_grad():
        want = vlm.encode_images(to_pixels([a]))[0]
    assert torch.allclose(first.mm[0].embeds, want, atol=1e-6)
    same_pixels = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(a, "BMP")}},
                                                {"type": "text", "text": "colour="}]}]
    proc.chat(same_pixels)  # the same picture in another file format: a hit
    assert enc.images == 2 and enc.calls == 2 and (proc.cache.hits, proc.cache.misses) == (5, 2)


def test_the_cache_evicts_the_least_recently_used_image(vlm, images):
    enc = Counting(vlm.encode_images)
    cache = EncoderCache(enc, capacity=2)
    a, b, c = images[:3]
    for img in (a, b, a, c, a, b):  # c evicts b (a was used after b); b then misses again
        cache.features([img])
    assert enc.images == 4 and len(cache) == 2 and image_hash(a) in cache and image_hash(c) not in cache
    assert_refused(lambda: EncoderCache(enc, capacity=0), ValueError, "capacity", 0, "a positive int")
    assert_refused(lambda: EncoderCache("encoder"), TypeError, "encode", "str", "a function pixels")


def test_the_chat_template_is_the_training_format(vlm, images):
    proc = VLMProcessor(vlm, CFG)
    p = proc.chat(chat(images[0], "colour="))
    assert p.token_ids == task_tokens(CFG, "colour=") and p.num_image_tokens == CFG.tokens_per_image
    assert [(m.offset, m.length) for m in p.mm] == [(0, CFG.tokens_per_image)]
    mixed = proc.chat(chat("a", images[0], "bĀ", images[1]) + [{"role": "user", "content": "c"}])
    n, img = CFG.tokens_per_image, CFG.image_token_id
    assert mixed.token_ids == [97] + [img] * n + list("bĀ".encode()) + [img] * n + [10, 99]  # no text forges 256
    assert [m.offset for m in mixed.mm] == [1, 1 + n + 3] and mixed.num_image_tokens == 2 * n
    assert proc.chat([{"role": "user", "content": "copy ab -> "}]).token_ids == list(b"copy ab -> ")
    assert proc.completion("colour=").token_ids == list(b"colour=") and proc.completion("x").mm == ()


def test_bad_chat_requests_are_refused_by_name(vlm, images):
    proc = VLMProcessor(vlm, CFG)
    too_many = chat(*images[:CFG.max_images_per_prompt + 1], "colour=")
    assert_refused(lambda: proc.chat(too_many), ValueError, f"messages[0].content[{CFG.max_images_per_prompt}]",
                   "one image more", f"at most {CFG.max_images_per_prompt} images per prompt")
    assert_refused(lambda: proc.chat([{"role": "user", "content": ""}]), ValueError, "messages",
                   [{"role": "user", "content": ""}], "at least one token")
    assert_refused(lambda: proc.chat([{"role": "user", "content": "\ud800"}]), ValueError, "messages[0].content",
                   "\ud800", "UTF-8")
    assert_refused(lambda: VLMProcessor(None, CFG), TypeError, "model_or_encoder", "NoneType", "a TinyVLM")
    with pytest.raises(TypeError, match="^cfg must be a labkit.day0.TinyVLMConfig, got TextConfig"):
        VLMProcessor(vlm, CFG.text_config)
    assert proc.cache.misses == 0


# --- through the engine ------------------------------------------------------------------------------------

def requests(proc, images):
    """Colour questions on four images (two asked twice), one two-image prompt and one text-only prompt."""
    msgs = [chat(images[i], q) for i, q in ((0, "colour="), (1, "colour="), (2, "shape="), (0, "colour="),
                                            (3, "count="), (1, "shape="))]
    msgs.append(chat(images[4], "and", images[5], "colour="))
    msgs.append([{"role": "user", "content": "copy ab -> "}])
    return [(proc.chat(m), m) for m in msgs]


@pytest.mark.parametrize("policy, preemption, num_blocks, budget", [
    ("static", "recompute", None, None), ("continuous", "recompute", None, None), ("chunked", "recompute", None, 3),
    ("chunked", "swap", 12, 3), ("continuous", "recompute", 12, None), ("continuous", "swap", 12, None)])
def test_each_image_answer_is_the_models_own_forward_with_its_image(vlm, images, policy, preemption, num_blocks,
                                                                     budget):
    proc = VLMProcessor(vlm, CFG)
    reqs = requests(proc, images)
    engine = Engine(vlm.language_model, policy=policy, preemption=preemption, num_blocks=num_blocks, block_size=2,
                    max_num_seqs=3, max_num_batched_tokens=budget, clock=StepCost())
    ids = [engine.add_request(p.token_ids, GREEDY, mm=p.mm) for p, _ in reqs]
    engine.run_until_done()
    pics = [[decode_image_url(part["image_url"]["url"]) for part in m[0]["content"] if isinstance(part, dict)
             and part["type"] == "image_url"] for _, m in reqs]
    for rid, (p, _), ims in zip(ids, reqs, pics):
        want = reference(vlm, p.token_ids, ims) if ims else reference_text(vlm, p.token_ids)
        assert engine.get(rid).output == want, rid
    assert engine.stats()["prefix_cache_hits"] > 0  # the repeated image was served from the cache
    if num_blocks:
        assert engine.stats()["preemptions"] > 0


@torch.no_grad()
def reference_text(vlm, tokens):
    out = []
    for _ in range(GREEDY.max_tokens):
        out.append(int(vlm.language_model(torch.tensor([tokens + out]))[0, -1].argmax()))
    return out


@pytest.mark.parametrize("hash_mm", [True, False])
def test_two_images_share_no_block_and_the_naive_cache_answers_from_the_first(vlm, images, hash_mm):
    proc = VLMProcessor(vlm, CFG)
    a, b = proc.chat(chat(images[0], "colour=")), proc.chat(chat(images[1], "colour="))
    assert a.token_ids == b.token_ids
    want_a, want_b = reference(vlm, a.token_ids, [images[0]]), reference(vlm, b.token_ids, [images[1]])
    assert want_a != want_b
    engine = Engine(vlm.language_model, block_size=2, clock=StepCost(), hash_mm=hash_mm)
    engine.add_request(a.token_ids, GREEDY, "a", mm=a.mm)
    engine.run_until_done()
    image_blocks = {b_ for h, (b_, _, toks) in engine.block_manager.hash_map().items() if CFG.image_token_id in toks}
    engine.add_request(b.token_ids, GREEDY, "b", mm=b.mm)
    engine.step()  # admitted: its blocks are allocated
    shared = image_blocks & set(engine.block_manager.block_table("b"))
    engine.run_until_done()
    if hash_mm:
        assert not shared and engine.get("b").output == want_b
    else:
        assert len(shared) == CFG.tokens_per_image // 2  # every block of the image: the first image's K/V
        assert engine.get("b").output == want_a != want_b
