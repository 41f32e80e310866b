"""Text rendered with Pillow and the fonts matplotlib ships, for the PP-OCR rows of the sweep."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .data import IMAGENET_MEAN, IMAGENET_STD

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf",
          "DejaVuSerif-Italic.ttf", "DejaVuSans-Oblique.ttf")


@dataclass
class TextSample:
    """A rendered line of text and its ground truth."""

    text: str
    image: np.ndarray  # uint8 RGB


def font_paths() -> list[str]:
    """The TrueType fonts bundled with matplotlib that the renderer uses."""
    import matplotlib

    directory = os.path.join(matplotlib.get_data_path(), "fonts", "ttf")
    paths = [os.path.join(directory, name) for name in _FONTS]
    return [p for p in paths if os.path.exists(p)]


def render_lines(count: int, height: int = 48, width: int = 320, seed: int = 0,
                 flips: bool = False) -> list[TextSample]:
    """``count`` lines of random text in varied fonts, sizes, rotations, noise and lengths.

    With ``flips``, every other line is rotated 180 degrees (the text-direction classifier's job).
    """
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    fonts = font_paths()
    samples = []
    for index in range(count):
        length = int(rng.integers(4, 17))
        text = "".join(rng.choice(list(_ALPHABET), size=length))
        font = ImageFont.truetype(fonts[index % len(fonts)], int(rng.integers(22, 40)))
        left, top, right, bottom = font.getbbox(text)
        canvas = Image.new("RGB", (right - left + 16, bottom - top + 12), (255, 255, 255))
        ink = tuple(int(v) for v in rng.integers(0, 90, size=3))
        ImageDraw.Draw(canvas).text((8 - left, 6 - top), text, font=font, fill=ink)
        canvas = canvas.rotate(float(rng.uniform(-4, 4)), expand=True, fillcolor=(255, 255, 255))
        if flips and index % 2:
            canvas = canvas.rotate(180)
        image = np.asarray(canvas).astype(np.float32)
        image += rng.normal(0, float(rng.uniform(0, 28)), size=image.shape)
        samples.append(TextSample(text, np.clip(image, 0, 255).astype(np.uint8)))
    return samples


def render_pages(count: int, size: int = 320, seed: int = 1) -> list[np.ndarray]:
    """Square pages with a few lines of text each, for the detector."""
    from PIL import Image

    pages = []
    for index in range(count):
        page = Image.new("RGB", (size, size), (250, 250, 245))
        lines = render_lines(5, seed=seed * 100 + index)
        y = 8
        for sample in lines:
            line = Image.fromarray(sample.image)
            if line.width > size - 16:
                line = line.resize((size - 16, max(1, line.height * (size - 16) // line.width)))
            page.paste(line, (8, y))
            y += line.height + 10
            if y > size - 40:
                break
        pages.append(np.asarray(page))
    return pages


def rec_preprocess(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """PP-OCR recognition input: resize to ``height`` keeping the aspect, pad right to ``width``,
    scale to [-1, 1], NCHW float32."""
    from PIL import Image

    h, w = image.shape[:2]
    new_width = min(width, max(1, int(round(w * height / h))))
    resized = np.asarray(Image.fromarray(image).resize((new_width, height), Image.BILINEAR))
    canvas = np.zeros((height, width, 3), np.float32)
    canvas[:, :new_width] = resized.astype(np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(canvas.transpose(2, 0, 1)[None])


def det_preprocess(page: np.ndarray) -> np.ndarray:
    """PP-OCR detection input: ImageNet-normalized NCHW float32."""
    scaled = (page.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(scaled.transpose(2, 0, 1)[None].astype(np.float32))


def ctc_decode(probabilities: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC decoding of a ``(1, T, C)`` recognizer output: index 0 is the blank, the
    model's dictionary follows, and the last class is a space."""
    table = [""] + list(characters) + [" "]
    best = probabilities.reshape(-1, probabilities.shape[-1]).argmax(axis=-1)
    text, previous = [], 0
    for index in best:
        if index != previous and index != 0:
            text.append(table[index] if index < len(table) else "")
        previous = index
    return "".join(text)
