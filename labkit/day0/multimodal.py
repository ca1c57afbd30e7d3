"""Text and images through one API (notebook 07, section 6): from an OpenAI chat request with `image_url` parts
to what the engine runs for TinyVLM, a labkit.serving Prompt (token ids with image placeholders, and one
MultiModalInput per image carrying its features).

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
        decode_image_url   base64 data: URLs only (nothing is fetched), Pillow, at most max_bytes / max_pixels
        image_hash         sha256 of the decoded pixels: the image's identity for the caches
        EncoderCache       hash -> features [tokens_per_image, d_model]; the vision encoder runs once per image
    VLMProcessor.chat      the chat template below -> Prompt(token_ids, mm, num_image_tokens)

Chat template (TinyVLM). Within a message the content parts are concatenated in order with no separator: a
text part is its UTF-8 bytes, an image part tokens_per_image copies of image_token_id (ids >= 256, so no text
can forge them); messages are joined by a newline, as lab 06's TinyLM template. This is exactly the training
format (labkit.day0.images): image tokens + b"colour=" -> "red\\n". At most cfg.max_images_per_prompt images.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import struct
from collections import OrderedDict
from typing import Callable, Sequence

import torch
from PIL import Image

from .._checks import check_positive_int, check_type, fail
from ..serving import mm as serving_mm, processor
from .config import TinyVLMConfig
from .images import to_pixels

MAX_IMAGE_BYTES = 1 << 19
"""Decoded bytes of one image (512 KiB). Tied to labkit.serving.api.MAX_BODY_BYTES (1,000,000): base64 makes an
image 4/3 larger, so one image at this limit is a 699,052-character data URL that fits in a request body with
room for the rest, and an image over it reaches decode_image_url and gets its 400 naming the image's
messages[i].content[j].image_url.url (a limit above ~740 KB would be cut first by the body's 413, which names
no field). tests/day0/test_http_limits.py checks the relation over HTTP."""
MAX_IMAGE_PIXELS = 1 << 20       # width x height of one image (a 1024 x 1024 image at most)
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")  # what Pillow may decode: never a format that runs a program (EPS)
DATA_URL = re.compile(r"data:image/([A-Za-z0-9.+-]+);base64,(.*)", re.DOTALL)


def image_hash(image: Image.Image) -> str:
    """Hex sha256 of the image's decoded RGB pixels and size. The content, not the file bytes: the same picture
    saved as another file (other PNG compression level, metadata, or a GIF of the same pixels) gives the same
    features, so it must get the same hash and hit the caches, and no file trick can make two different
    pictures share one (vLLM's MultiModalHasher also hashes a PIL image's pixel data, vllm/multimodal/hasher.py)."""
    check_type("image", image, Image.Image, "a PIL image")
    rgb = image.convert("RGB")
    return hashlib.sha256(b"RGB" + struct.pack("<II", *rgb.size) + rgb.tobytes()).hexdigest()


def decode_image_url(url: str, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS,
                     name: str = "url") -> Image.Image:
    """The RGB PIL image of a `data:image/<type>;base64,<data>` URL; anything else (http(s) included: nothing is
    fetched) is refused, as are data that is not base64 or not an image, and an image over `max_bytes` decoded
    bytes or `max_pixels` pixels (checked from the header, before the pixels are decoded). Errors name `name`,
    e.g. "messages[0].content[1].image_url.url"."""
    max_bytes, max_pixels = check_positive_int("max_bytes", max_bytes), check_positive_int("max_pixels", max_pixels)
    if not isinstance(url, str):
        fail(name, type(url).__name__, "a str: a data:image/...;base64,... URL", TypeError)
    match = DATA_URL.fullmatch(url.strip())
    if match is None:
        fail(name, url[:40] + ("..." if len(url) > 40 else ""),
             "a base64 data URL, data:image/<type>;base64,<data> (other URLs, http(s) too, are not fetched)")
    payload = re.sub(r"\s", "", match.group(2))
    if len(payload) // 4 * 3 > max_bytes + 2:
        fail(name, f"about {len(payload) // 4 * 3} bytes of image data", f"at most {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        fail(name, f"{len(payload)} characters after base64,", "valid base64 image data")
    if len(data) > max_bytes:
        fail(name, f"{len(data)} bytes of image data", f"at most {max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data), formats=list(FORMATS))
        w, h = image.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        fail(name, f"{len(data)} bytes of data:image/{match.group(1)}",
             f"an image Pillow decodes ({', '.join(FORMATS)})")
    if w * h > max_pixels:
        fail(name, f"a {w} x {h} image ({w * h} pixels)", f"at most {max_pixels} pixels")
    try:
        return image.convert("RGB")  # decodes the pixels
    except (OSError, ValueError, SyntaxError) as e:
        fail(name, f"a truncated or corrupt {image.format} image ({e})", "an image Pillow decodes")


class EncoderCache:
    """The vision encoder behind an LRU cache keyed by image_hash: `encode` maps pixels float32 [n, 3, S, S]
    in [0, 1] (S = image_size) to features [n, tokens_per_image, d_model] (TinyVLM.encode_images); at most
    `capacity` images' features are kept. `hits` and `misses` count images looked up; the encoder runs once
    per miss (all the misses of one call in one batch)."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], capacity: int = 64, image_size: int = 32):
        if not callable(encode):
            fail("encode", type(encode).__name__, "a function pixels [n, 3, S, S] -> features [n, T, d]", TypeError)
        self.encode = encode
        self.capacity = check_positive_int("capacity", capacity, "images")
        self.image_size = check_positive_int("image_size", image_size, "pixels")
        self._store: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: str) -> bool:
        return key in self._store

    def features(self, images: Sequence[Image.Image], hashes: Sequence[str] | None = None) -> list[torch.Tensor]:
        """Features [tokens_per_image, d_model] of each image (`hashes`: their image_hash, computed if None)."""
        if not isinstance(images, (list, tuple)) or not all(isinstance(i, Image.Image) for i in images):
            fail("images", type(images).__name__, "a list of PIL images", TypeError)
        hashes = [image_hash(i) for i in images] if hashes is None else list(hashes)
        if len(hashes) != len(images):
            fail("hashes", f"{len(hashes)} hashes", f"one per image ({len(images)})")
        todo = {h: img for h, img in zip(hashes, images) if h not in self._store}  # distinct misses, in order
        if todo:
            with torch.no_grad():
                out = self.encode(to_pixels(list(todo.values()), self.image_size))  # [n, T, d]
            if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[0] != len(todo):
                fail("encode", f"output {getattr(out, 'shape', type(out).__name__)}", f"[{len(todo)}, T, d_model]")
            new = dict(zip(todo, out.detach()))
        else:
            new = {}
        result = []
        for h in hashes:
            if h in self._store:
                self._store.move_to_end(h)
                result.append(self._store[h])
                self.hits += 1
            else:
                self.misses += 1
                result.append(new[h])
                self._store[h] = new[h]  # a second copy of h in this call is then a hit
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)  # the least recently used
        return result

    def stats(self) -> dict:
        return {"images": len(self._store), "capacity": self.capacity, "hits": self.hits, "misses": self.misses}


class VLMProcessor:
    """TinyVLM's Processor (labkit.serving.processor): `chat(messages)` and `completion(prompt)` -> Prompt.
    `model_or_encoder`: a TinyVLM (its encode_images is the encoder) or a function pixels -> features; `cache`:
    an EncoderCache to share (None: a new one of 64 images over that encoder; when a cache is given,
    model_or_encoder is not used). `max_bytes` / `max_pixels`: the limits of decode_image_url."""

    def __init__(self, model_or_encoder, cfg: TinyVLMConfig, cache: EncoderCache | None = None,
                 max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS):
        self.cfg = check_type("cfg", cfg, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")
        if cache is None:
            encode = getattr(model_or_encoder, "encode_images", model_or_encoder)
            if not callable(encode):
                fail("model_or_encoder", type(model_or_encoder).__name__,
                     "a TinyVLM or a function pixels -> features (or give an EncoderCache)", TypeError)
            cache = EncoderCache(encode, 64, cfg.vision_config.image_size)
        self.cache = check_type("cache", cache, EncoderCache, "a labkit.day0.EncoderCache or None")
        self.max_bytes = check_positive_int("max_bytes", max_bytes)
        self.max_pixels = check_positive_int("max_pixels", max_pixels)

    def chat(self, messages) -> processor.Prompt:
        """The chat template (module docstring) over OpenAI `messages`; every image is decoded and checked
        before the encoder runs on any."""
        cfg, per = self.cfg, self.cfg.tokens_per_image
        tokens: list[int] = []
        images: list[tuple[int, Image.Image]] = []  # (offset, image)
        for i, (_, parts) in enumerate(processor.message_parts(messages)):
            if i:
                tokens.append(ord("\n"))  # messages one per line, as lab 06
            for p in parts:
                if p.kind == "text":
                    tokens += self._text(p.param, p.value)
                    continue
                if len(images) == cfg.max_images_per_prompt:
                    fail(p.param.removesuffix(".url").removesuffix(".image_url"), "one image more",
                         f"at most {cfg.max_images_per_prompt} images per prompt (max_images_per_prompt)")
                images.append((len(tokens), decode_image_url(p.value, self.max_bytes, self.max_pixels, p.param)))
                tokens += [cfg.image_token_id] * per
        if not tokens:
            fail("messages", messages, "a conversation with at least one token of text or one image")
        hashes = [image_hash(img) for _, img in images]
        feats = self.cache.features([img for _, img in images], hashes) if images else []
        mm = tuple(serving_mm.MultiModalInput(off, per, h, f) for (off, _), h, f in zip(images, hashes, feats))
        return processor.Prompt(tokens, mm, per * len(images))

    def completion(self, prompt) -> processor.Prompt:
        """A completion's text prompt: its UTF-8 bytes (a completion carries no images)."""
        return processor.Prompt(self._text("prompt", processor.prompt_text("prompt", prompt)))

    @staticmethod
    def _text(name: str, text: str) -> list[int]:
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as e:  # a lone surrogate
            fail(name, text[:40], f"text that encodes as UTF-8 ({e.reason})")

    def __repr__(self) -> str:
        return f"VLMProcessor({self.cfg.tokens_per_image} tokens per image, cache {self.cache.stats()})"
