"""labkit.day0.images: the drawn scenes show what their answers say (counted on the pixels by brute force)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image

from labkit.day0 import QUESTION_KINDS, make_image_tasks
from labkit.day0.images import COLOURS, SHAPES, Scene, draw, to_pixels


def components(img: Image.Image, rgb) -> int:
    """Connected groups (4-neighbour flood fill) of pixels exactly `rgb`."""
    w, h = img.size
    px = img.load()
    seen, n = set(), 0
    for x in range(w):
        for y in range(h):
            if (x, y) in seen or px[x, y] != rgb:
                continue
            n += 1
            stack = [(x, y)]
            while stack:
                p = stack.pop()
                if p in seen or not (0 <= p[0] < w and 0 <= p[1] < h) or px[p] != rgb:
                    continue
                seen.add(p)
                stack += [(p[0] + 1, p[1]), (p[0] - 1, p[1]), (p[0], p[1] + 1), (p[0], p[1] - 1)]
    return n


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(SHAPES), colour=st.sampled_from(sorted(COLOURS)), count=st.integers(1, 4),
       seed=st.integers(0, 2 ** 31))
def test_the_image_shows_count_shapes_of_the_colour(shape, colour, count, seed):
    img = draw(Scene(shape, colour, count), seed)
    assert img.size == (32, 32) and img.mode == "RGB"
    assert components(img, COLOURS[colour]) == count
    assert all(components(img, c) == 0 for name, c in COLOURS.items() if name != colour)


def test_digit_scenes_show_their_digit_in_their_colour():
    tasks = make_image_tasks("digit", 60, "test")
    assert {t.answer for t in tasks} == {str(d) for d in range(10)}
    for t in tasks:
        px = t.image.load()
        colour = COLOURS[t.scene.colour]
        assert any(px[x, y] == colour for x in range(32) for y in range(32))  # the glyph's solid pixels
    red = [draw(Scene("digit", "red", 1, d), seed=5).tobytes() for d in range(10)]
    assert len(set(red)) == 10  # same place and size: only the glyph differs
    assert make_image_tasks("digit", 1)[0].question == "digit="


def test_tasks_are_deterministic_and_splits_differ():
    a, b = make_image_tasks("count", 20, "test"), make_image_tasks("count", 20, "test")
    assert [t.image.tobytes() for t in a] == [t.image.tobytes() for t in b]
    train = {t.image.tobytes() for t in make_image_tasks("count", 200, "train")}
    assert not train & {t.image.tobytes() for t in a}
    for kind in QUESTION_KINDS:
        t = make_image_tasks(kind, 1)[0]
        assert t.question == f"{kind}=" and t.answer == t.scene.answer(kind)


def test_to_pixels_layout_and_resize():
    img = draw(Scene("square", "red", 2), 3)
    px = to_pixels([img])
    assert px.shape == (1, 3, 32, 32) and px.dtype == torch.float32
    assert torch.allclose(px[0, :, 0, 0] * 255, torch.tensor(img.getpixel((0, 0)), dtype=torch.float32))
    big = to_pixels(img.resize((64, 64), Image.NEAREST))
    assert big.shape == (1, 3, 32, 32)
    assert to_pixels(img.convert("L")).shape == (1, 3, 32, 32)


@pytest.mark.parametrize("call, error, word", [
    (lambda: Scene("hexagon", "red", 1), ValueError, "shape"),
    (lambda: Scene("circle", "red", 5), ValueError, "count"),
    (lambda: Scene("digit", "red", 1, 12), ValueError, "digit"),
    (lambda: Scene("circle", "red", 1, 3), ValueError, "shape"),
    (lambda: Scene("circle", "red", 1).answer("digit"), ValueError, "kind"),
    (lambda: make_image_tasks("size", 3), ValueError, "kind"),
    (lambda: make_image_tasks("count", 3, "dev"), ValueError, "split"),
    (lambda: to_pixels([]), TypeError, "images"),
    (lambda: draw("circle"), TypeError, "scene"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_to_pixels_is_the_images_rgb_bytes_channels_first():
    """Every pixel, against numpy's view of the same image (a random one: a transpose or a flip shows)."""
    rgb = torch.randint(0, 256, (32, 32, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    img = Image.fromarray(rgb.numpy(), "RGB")
    assert torch.equal(to_pixels([img])[0], rgb.permute(2, 0, 1).float() / 255)  # [3, H, W]
