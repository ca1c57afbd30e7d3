"""The images TinyVLM sees, drawn by the course from a seed with Pillow (no downloads), and the questions
asked about them (notebook 07; the training data of `python -m labkit.day0.train`).

    a shape scene: 1-4 copies of one shape in one colour on a dark background, one per quadrant (jittered)
    a digit scene: one digit 0-9 in one colour (Pillow's built-in font, 18-26 px, jittered)

    question   prompt tokens                                  answer     asked about
    colour     [image] x tokens_per_image + "colour="        "red"      shape scenes   (then "\\n")
    shape      [image] x tokens_per_image + "shape="         "circle"   shape scenes
    count      [image] x tokens_per_image + "count="         "3"        shape scenes
    digit      [image] x tokens_per_image + "digit="         "7"        digit scenes

Splits use different seeds (train, val, test), so a test image is never a training image (a scene may recur:
there are only 6 x 4 x 4 + 6 x 10 = 156 of them; the pixels differ by position, size and background).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image, ImageDraw, ImageFont

from .._checks import check_choice, check_int, check_positive_int, check_type, fail
from ..rng import Rng

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 90, 230), "yellow": (230, 210, 40),
           "purple": (160, 60, 200), "white": (235, 235, 235)}
SHAPES = ("circle", "square", "triangle", "cross")
COUNTS = (1, 2, 3, 4)
DIGITS = tuple(range(10))
QUESTION_KINDS = ("colour", "shape", "count", "digit")
SPLITS = {"train": 101, "val": 202, "test": 303}
SIZE = 32


@dataclass(frozen=True)
class Scene:
    """What an image shows: `count` copies of `shape` in `colour`, or (shape "digit") the digit `digit`."""
    shape: str
    colour: str
    count: int = 1
    digit: int | None = None

    def __post_init__(self):
        check_choice("colour", self.colour, tuple(COLOURS))
        if self.digit is None:
            check_choice("shape", self.shape, SHAPES)
            check_choice("count", self.count, COUNTS)
        else:
            check_choice("digit", self.digit, DIGITS)
            if self.shape != "digit" or self.count != 1:
                fail("shape", self.shape, '"digit" with count 1 for a digit scene')

    def answer(self, kind: str) -> str:
        check_choice("kind", kind, QUESTION_KINDS)
        if (kind == "digit") != (self.digit is not None):
            fail("kind", kind, "digit for a digit scene, colour/shape/count for a shape scene")
        return {"colour": self.colour, "shape": self.shape, "count": str(self.count), "digit": str(self.digit)}[kind]


@dataclass(frozen=True)
class ImageTask:
    """One question about one image: the model sees the image's tokens + `question` and must say `answer`."""
    image: Image.Image
    question: str
    answer: str
    kind: str
    scene: Scene


def _draw_shape(d: ImageDraw.ImageDraw, shape: str, x: int, y: int, s: int, fill) -> None:
    if shape == "circle":
        d.ellipse([x, y, x + s - 1, y + s - 1], fill=fill)
    elif shape == "square":
        d.rectangle([x, y, x + s - 1, y + s - 1], fill=fill)
    elif shape == "triangle":
        d.polygon([(x + (s - 1) / 2, y), (x, y + s - 1), (x + s - 1, y + s - 1)], fill=fill)
    else:  # cross: a horizontal and a vertical bar, a third of the size thick
        t = max(2, s // 3)
        d.rectangle([x, y + (s - t) // 2, x + s - 1, y + (s - t) // 2 + t - 1], fill=fill)
        d.rectangle([x + (s - t) // 2, y, x + (s - t) // 2 + t - 1, y + s - 1], fill=fill)


def draw(scene: Scene, seed: int = 0) -> Image.Image:
    """A 32x32 RGB image of `scene`; `seed` picks the quadrants, sizes, offsets and background."""
    check_type("scene", scene, Scene, "a labkit.day0.images.Scene")
    rng = Rng(check_int("seed", seed, 0))
    bg = tuple(rng.below(48) for _ in range(3))
    img = Image.new("RGB", (SIZE, SIZE), bg)
    d = ImageDraw.Draw(img)
    if scene.digit is not None:  # one glyph, centred near the middle
        size = 18 + rng.below(9)
        x, y = 12 + rng.below(9), 12 + rng.below(9)
        d.text((x, y), str(scene.digit), fill=COLOURS[scene.colour], font=ImageFont.load_default(size), anchor="mm")
        return img
    quadrants = [0, 1, 2, 3]
    for i in range(3, 0, -1):  # Fisher-Yates with the course's generator
        j = rng.below(i + 1)
        quadrants[i], quadrants[j] = quadrants[j], quadrants[i]
    for q in quadrants[:scene.count]:
        s = 8 + rng.below(5)  # 8..12 pixels
        x = (q % 2) * 16 + 1 + rng.below(16 - s - 1)
        y = (q // 2) * 16 + 1 + rng.below(16 - s - 1)
        _draw_shape(d, scene.shape, x, y, s, COLOURS[scene.colour])
    return img


def to_pixels(images, size: int = SIZE) -> torch.Tensor:
    """float32 [n, 3, size, size] in [0, 1] from PIL images (converted to RGB, resized when needed)."""
    if isinstance(images, Image.Image):
        images = [images]
    if not isinstance(images, (list, tuple)) or not images or not all(isinstance(i, Image.Image) for i in images):
        fail("images", type(images).__name__, "a non-empty list of PIL images", TypeError)
    check_positive_int("size", size)
    out = []
    for img in images:
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        out.append(torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(size, size, 3))
    return torch.stack(out).permute(0, 3, 1, 2).float() / 255  # [n, 3, size, size]


def make_image_tasks(kind: str, n: int, split: str = "test", seed: int = 0) -> list[ImageTask]:
    """`n` questions of `kind` about fresh images of `split` (deterministic for a seed)."""
    check_choice("kind", kind, QUESTION_KINDS)
    check_positive_int("n", n)
    check_choice("split", split, tuple(SPLITS))
    rng = Rng(check_int("seed", seed, 0) * 1_000_003 + SPLITS[split] * 7919 + QUESTION_KINDS.index(kind))
    tasks = []
    for _ in range(n):
        if kind == "digit":
            scene = Scene("digit", rng.choice(tuple(COLOURS)), 1, rng.choice(DIGITS))
        else:
            scene = Scene(rng.choice(SHAPES), rng.choice(tuple(COLOURS)), rng.choice(COUNTS))
        img = draw(scene, rng.below(2 ** 31))
        tasks.append(ImageTask(img, f"{kind}=", scene.answer(kind), kind, scene))
    return tasks
