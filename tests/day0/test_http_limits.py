"""TinyVLM's service over real HTTP (uvicorn on a loopback port, in this process, as labkit.day0.serve builds it):
the per-image byte limit is reachable through the body limit and answered with a 400 naming the image's url;
a chat prompt that is too long is refused naming "messages" and counting its image tokens; the same picture in
another file format is an EncoderCache hit (the encoder is not run again) with the same answer."""
import base64
import io
import math

import httpx
import pytest
import torch
from PIL import Image

from labkit.day0 import TinyVLM, make_image_tasks, small_config
from labkit.day0.multimodal import MAX_IMAGE_BYTES, EncoderCache, VLMProcessor
from labkit.day0.release import write_release
from labkit.day0.serve import build_engine, encoder_model
from labkit.serving.api import MAX_BODY_BYTES, ServerThread, make_app
from labkit.serving.service import Service

pytestmark = pytest.mark.timeout(120)
URL = "messages[0].content[0].image_url.url"


class Counting:
    """An encoder that counts its calls and the images it encoded."""

    def __init__(self, encode):
        self.encode, self.calls, self.images = encode, 0, 0

    def __call__(self, pixels):
        self.calls, self.images = self.calls + 1, self.images + pixels.shape[0]
        return self.encode(pixels)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base url, the processor's EncoderCache, its counting encoder) of a random TinyVLM's release served."""
    torch.manual_seed(0)
    model = TinyVLM(small_config()).eval()
    folder = tmp_path_factory.mktemp("limits") / "tinyvlm"
    write_release(model.state_dict(), model.config, folder)
    encoder = Counting(encoder_model(folder, model.config).encode_images)
    cache = EncoderCache(encoder, 8, model.config.vision_config.image_size)

    def load():
        engine, _, tokenizer = build_engine(folder, 1, num_blocks=32)
        return engine, VLMProcessor(None, model.config, cache), tokenizer

    svc = Service(load).start()
    srv = ServerThread(make_app(svc, "tinyvlm")).start()
    try:
        assert svc.wait_ready(60), svc.error
        yield srv.url + "/v1", cache, encoder
    finally:
        srv.stop()
        svc.stop()


def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def body(*content, max_tokens: int = 4) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": c}} if c.startswith("data:") else {"type": "text", "text": c}
             for c in content]
    return {"model": "tinyvlm", "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens,
            "temperature": 0}


def post(url: str, payload: dict) -> httpx.Response:
    return httpx.post(url + "/chat/completions", json=payload, timeout=60)


def picture() -> Image.Image:
    return make_image_tasks("colour", 1, "test", 0)[0].image


def test_one_image_at_the_byte_limit_fits_in_a_body():
    """The relation of the two constants (multimodal.MAX_IMAGE_BYTES, api.MAX_BODY_BYTES): base64 of one image
    at the limit, in a chat body, is under the body limit with room to spare."""
    url = "data:image/png;base64," + base64.b64encode(bytes(MAX_IMAGE_BYTES)).decode()
    assert len(url) == 22 + 4 * math.ceil(MAX_IMAGE_BYTES / 3)
    assert len(httpx.Request("POST", "http://x", json=body(url, "colour=")).content) < 0.8 * MAX_BODY_BYTES


def test_an_image_over_the_byte_limit_gets_a_400_naming_its_url_and_serving_goes_on(served):
    base, _, _ = served
    rng = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (420, 420, 3), dtype=torch.uint8, generator=rng).numpy()
    big = data_url(Image.fromarray(noise, "RGB"), "BMP")  # a real image, under the pixel limit
    raw = base64.b64decode(big.split(",", 1)[1])
    payload = body(big, "colour=")
    assert MAX_IMAGE_BYTES < len(raw) and len(httpx.Request("POST", "http://x", json=payload).content) < MAX_BODY_BYTES
    r = post(base, payload)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (URL, "invalid_value"), error
    assert error["message"].startswith(f"{URL} must be at most {MAX_IMAGE_BYTES} bytes, got ") and \
        f"{len(raw)} bytes of image data" in error["message"], error
    at_limit = "data:image/png;base64," + base64.b64encode(bytes(MAX_IMAGE_BYTES)).decode()  # not an image
    r = post(base, body(at_limit, "colour="))
    assert r.status_code == 400 and r.json()["error"]["param"] == URL, r.text  # past the byte limits, to Pillow
    assert "an image Pillow decodes" in r.json()["error"]["message"]
    ok = post(base, body(data_url(picture()), "colour="))
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 4 + len("colour="), ok.text
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 200


def test_a_chat_prompt_too_long_names_messages_and_its_image_tokens(served):
    base, _, _ = served
    cfg = small_config()
    image = data_url(picture())
    text = "x" * (cfg.text_config.max_seq_len - cfg.tokens_per_image)  # the two images push it past the context
    n = 2 * cfg.tokens_per_image + len(text)
    r = post(base, body(image, image, text))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("messages", "invalid_value"), error
    assert error["message"].startswith(f"messages must be at most {cfg.text_config.max_seq_len - 1} tokens"), error
    assert error["message"].endswith(f"got '{n} tokens' ({2 * cfg.tokens_per_image} of its {n} tokens are image "
                                     "tokens)"), error
    text_only = post(base, body("y" * cfg.text_config.max_seq_len)).json()["error"]
    assert text_only["param"] == "messages" and "image tokens" not in text_only["message"], text_only
    done = httpx.post(base + "/completions", json={"model": "tinyvlm", "prompt": "z" * 80, "max_tokens": 2},
                      timeout=60).json()["error"]
    assert done["param"] == "prompt" and done["message"].startswith("prompt must be at most"), done


def test_the_same_picture_in_another_format_is_a_cache_hit_with_the_same_answer(served):
    base, cache, encoder = served
    image = make_image_tasks("colour", 2, "test", 5)[1].image  # a picture no other test sends
    counts = lambda: (cache.hits, cache.misses, encoder.calls, encoder.images)  # noqa: E731
    hits, misses, calls, images = counts()
    first = post(base, body(data_url(image), "colour="))
    assert counts() == (hits, misses + 1, calls + 1, images + 1)  # a miss: the encoder ran once, on one image
    again = post(base, body(data_url(image, "BMP"), "colour="))
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert counts() == (hits + 1, misses + 1, calls + 1, images + 1)  # a hit: the encoder did not run again
