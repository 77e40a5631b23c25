"""The kinds of shortcut a data spec can plant (:mod:`vitkit.data.shortcut`), one registry.

Each kind changes one RGB image (H, W, 3) float32 in [0, 1] and returns the changed copy; it
takes ``strength`` (1 the default size or amount, 2 twice it) and a generator seeded per image,
so what varies from image to image (the texture's phase) is deterministic. A kind that sits in
one place says where with ``pixels(H, W, strength)``, bool (H, W); a kind that is everywhere
(a colour cast, a texture) has none. Sizes are shares of the image's shorter side, so a kind
looks alike at 32 and 64 pixels.

==========  ==================================================================================
kind        what is planted (strength 1; strength 2 doubles the side, width or amount)
==========  ==================================================================================
mark        a 2 x 2 white/black checkerboard, 1/8 of the side, in the top-right corner
stripe      a white band 1/16 of the side wide along the whole left border
frame       a white ring 1/32 of the side wide along all four borders
text        the word "TAG" in a 3 x 5 pixel font (scaled with the side), lower left, 80% white
patch       a grey square 1/8 of the side with a white diagonal, off centre (upper middle right)
cast        an orange colour cast: every pixel blended 12% towards (1, 0.6, 0.2)
texture     a diagonal grating of period 1/8 of the side, amplitude 0.12, random phase per image
==========  ==================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# a 3 x 5 pixel font, enough for the watermark
_GLYPHS = {"T": ("111", "010", "010", "010", "010"),
           "A": ("010", "101", "111", "101", "101"),
           "G": ("011", "100", "101", "101", "011")}
WATERMARK = "TAG"


@dataclass(frozen=True)
class Kind:
    """``apply(image, strength, rng) -> image``; ``pixels(h, w, strength) -> bool (H, W)`` for
    a kind that sits in one place (None for one that is everywhere); ``about``: one line."""

    apply: Callable[[np.ndarray, float, np.random.Generator], np.ndarray]
    pixels: Callable[[int, int, float], np.ndarray] | None
    about: str


def _side(h: int, w: int, share: float, strength: float, minimum: int = 1) -> int:
    return max(minimum, round(share * strength * min(h, w)))


def _mark_box(h: int, w: int, strength: float) -> tuple[int, int, int, int]:
    short = min(h, w)
    side = max(2, round(strength * short / 8)) // 2 * 2  # even: the 2 x 2 cells
    inset = max(1, round(short / 32))
    return w - inset - side, inset, w - inset, inset + side


def _box_pixels(box: tuple[int, int, int, int], h: int, w: int) -> np.ndarray:
    x0, y0, x1, y1 = box
    m = np.zeros((h, w), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def _mark(a: np.ndarray, strength: float, rng) -> np.ndarray:
    x0, y0, x1, y1 = _mark_box(*a.shape[:2], strength)
    half = (x1 - x0) // 2
    cell = np.zeros((x1 - x0, x1 - x0), dtype=np.float32)
    cell[:half, :half] = cell[half:, half:] = 1
    a[y0:y1, x0:x1] = cell[..., None]
    return a


def _stripe_pixels(h: int, w: int, strength: float) -> np.ndarray:
    m = np.zeros((h, w), dtype=bool)
    m[:, :_side(h, w, 1 / 16, strength)] = True
    return m


def _frame_pixels(h: int, w: int, strength: float) -> np.ndarray:
    t = _side(h, w, 1 / 32, strength)
    m = np.ones((h, w), dtype=bool)
    m[t:h - t, t:w - t] = False
    return m


def _text_layout(h: int, w: int, strength: float) -> tuple[int, int, int]:
    """The watermark's scale (pixels per font pixel) and its top-left corner."""
    scale = max(1, round(strength * min(h, w) / 32))
    inset = max(1, round(min(h, w) / 32))
    return scale, inset, h - inset - 5 * scale


def _text_pixels(h: int, w: int, strength: float) -> np.ndarray:
    scale, x, y = _text_layout(h, w, strength)
    m = np.zeros((h, w), dtype=bool)
    for letter in WATERMARK:
        glyph = np.array([[c == "1" for c in row] for row in _GLYPHS[letter]])
        big = glyph.repeat(scale, 0).repeat(scale, 1)
        hh, ww = big.shape
        m[y:y + hh, x:x + ww] |= big[:h - y, :w - x]
        x += 4 * scale
        if x >= w:
            break
    return m


def _text(a: np.ndarray, strength: float, rng) -> np.ndarray:
    m = _text_pixels(*a.shape[:2], strength)
    a[m] = 0.2 * a[m] + 0.8
    return a


def _patch_box(h: int, w: int, strength: float) -> tuple[int, int, int, int]:
    side = _side(h, w, 1 / 8, strength, 2)
    x0, y0 = round(0.6 * w) - side // 2, round(0.3 * h) - side // 2
    return x0, y0, x0 + side, y0 + side


def _patch(a: np.ndarray, strength: float, rng) -> np.ndarray:
    x0, y0, x1, y1 = _patch_box(*a.shape[:2], strength)
    square = np.full((y1 - y0, x1 - x0), 0.5, dtype=np.float32)
    np.fill_diagonal(square, 1.0)
    a[y0:y1, x0:x1] = square[..., None]
    return a


def _fill(pixels: Callable[[int, int, float], np.ndarray], value: float):
    def apply(a: np.ndarray, strength: float, rng) -> np.ndarray:
        a[pixels(*a.shape[:2], strength)] = value
        return a
    return apply


CAST_COLOUR = np.array([1.0, 0.6, 0.2], dtype=np.float32)


def _cast(a: np.ndarray, strength: float, rng) -> np.ndarray:
    share = min(1.0, 0.12 * strength)
    return (1 - share) * a + share * CAST_COLOUR


def _texture(a: np.ndarray, strength: float, rng) -> np.ndarray:
    h, w = a.shape[:2]
    period = max(2.0, min(h, w) / 8)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    wave = np.sin(2 * np.pi * (xx + yy) / period + rng.uniform(0, 2 * np.pi))
    return np.clip(a + 0.12 * strength * wave[..., None], 0, 1)


KINDS: dict[str, Kind] = {
    "mark": Kind(_mark, lambda h, w, s: _box_pixels(_mark_box(h, w, s), h, w),
                 "a checkerboard mark in the top-right corner"),
    "stripe": Kind(_fill(_stripe_pixels, 1.0), _stripe_pixels,
                   "a white band along the left border"),
    "frame": Kind(_fill(_frame_pixels, 1.0), _frame_pixels, "a white frame on all four borders"),
    "text": Kind(_text, _text_pixels, "a 'TAG' watermark in the lower-left corner"),
    "patch": Kind(_patch, lambda h, w, s: _box_pixels(_patch_box(h, w, s), h, w),
                  "a grey square with a white diagonal, off centre"),
    "cast": Kind(_cast, None, "an orange colour cast over the whole image"),
    "texture": Kind(_texture, None, "a diagonal grating over the whole image, random phase"),
}


def apply_kind(name: str, img: np.ndarray, strength: float, seed: int) -> np.ndarray:
    """``img`` (H, W, 3) uint8 with the shortcut ``name`` planted, uint8."""
    a = img.astype(np.float32) / 255
    out = KINDS[name].apply(a, strength, np.random.default_rng(seed))
    return (np.clip(out, 0, 1) * 255).round().astype(np.uint8)
