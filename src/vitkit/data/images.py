"""Reading images for a model: any mode PIL opens (grey, palette, RGBA, CMYK, 16-bit) becomes
8-bit RGB, resized to cover the model's input (bicubic, aspect kept), centre-cropped and
normalised with the checkpoint's mean/std. :func:`preprocess` is the one preprocessing every
command uses (``predict``, ``attention``, ``eval`` and validation during training)."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit.errors import DataError, ImageError

DEFAULT_MEAN = DEFAULT_STD = (0.5, 0.5, 0.5)  # the original ViT / JAX preprocessing
# ImageNet statistics: DeiT, torchvision, DINOv2 and the ResNets normalise with them
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DECODED_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP", "PPM")  # what uploads may be
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm"}


def image_files(folder: str | os.PathLike) -> list[Path]:
    """The files under ``folder``, at any depth, whose suffix names an image, sorted."""
    return sorted(f for f in Path(folder).rglob("*")
                  if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL image -> 8-bit RGB. 16-bit greyscale is scaled, alpha is composited on white."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0, 0, 255).astype(np.uint8))
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, img)
    return img.convert("RGB")


def resize_and_crop(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Scale (bicubic) so the image covers ``size`` (H, W) keeping its aspect, then centre-crop.

    The side that sets the scale becomes exactly its target; the other is truncated to an
    integer (``int(target * long / short)``), as torchvision's ``Resize``, timm and Hugging
    Face's processors compute it. The crop's offset is floored (``(new - side) // 2``) as Hugging
    Face's processors floor it, so a model exported ``to="hf"`` sees the same pixels in
    ``transformers.pipeline``. torchvision's ``CenterCrop`` (timm's eval transform) rounds a
    half-pixel offset half to even instead: where ``new - side`` is 3, 7, 11, ... pixels, timm's
    crop sits one pixel further right or down.
    """
    h, w = size
    _, new_h, new_w, left, top = cover(img.size, size)
    img = img.resize((new_w, new_h), Image.Resampling.BICUBIC)
    return img.crop((left, top, left + w, top + h))


def cover(original: tuple[int, int], size: tuple[int, int]) -> tuple[float, int, int, int, int]:
    """How :func:`resize_and_crop` maps an image of ``original`` (W, H) to ``size`` (H, W):
    (scale, resized H, resized W, left and top of the centre crop in the resized image, floored
    as Hugging Face's processors floor them)."""
    (ow, oh), (h, w) = original, size
    if h / oh >= w / ow:  # the height sets the scale
        scale, new_h, new_w = h / oh, h, max(w, int(h * ow / oh))
    else:
        scale, new_h, new_w = w / ow, max(h, int(w * oh / ow)), w
    return scale, new_h, new_w, (new_w - w) // 2, (new_h - h) // 2


def crop_box(box, original: tuple[int, int], size: tuple[int, int]):
    """A pixel box (x0, y0, x1, y1) of an image of ``original`` (W, H) -> the same box after
    :func:`resize_and_crop` to ``size`` (H, W), clipped to the crop."""
    scale, _, _, left, top = cover(original, size)
    th, tw = size
    x0, y0, x1, y1 = box
    return (max(0, round(x0 * scale) - left), max(0, round(y0 * scale) - top),
            min(tw, round(x1 * scale) - left), min(th, round(y1 * scale) - top))


def preprocessing(model) -> tuple[tuple[int, int], tuple, tuple]:
    """(input size (H, W), mean, std) a model was trained with, from its config and metadata
    (ViT configs hold (H, W), CNN configs one side; mean/std default to the original ViT's)."""
    size = model.cfg.img_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    return size, model.cfg.extra.get("mean", DEFAULT_MEAN), model.cfg.extra.get("std", DEFAULT_STD)


def preprocess(rgb: Image.Image, size: tuple[int, int], mean=DEFAULT_MEAN,
               std=DEFAULT_STD) -> tuple[torch.Tensor, np.ndarray]:
    """RGB image -> (normalised tensor (3, H, W), the picture the model sees (H, W, 3) in
    [0, 1]): resized to cover ``size`` and centre-cropped (the aspect ratio is kept)."""
    rgb = resize_and_crop(rgb, size)
    picture = np.asarray(rgb, dtype=np.float32) / 255.0  # (H, W, 3)
    tensor = torch.from_numpy(picture).permute(2, 0, 1)
    tensor = (tensor - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return tensor, picture


class Preprocess:
    """:func:`preprocess` as a transform: PIL RGB image -> normalised (3, H, W) tensor."""

    def __init__(self, size: int | tuple[int, int], mean=DEFAULT_MEAN, std=DEFAULT_STD) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        rgb = img if img.mode == "RGB" else to_rgb(img)  # datasets yield RGB: no copy per item
        return preprocess(rgb, self.size, self.mean, self.std)[0]


def load_image(path: str | os.PathLike, size: tuple[int, int],
               mean=DEFAULT_MEAN, std=DEFAULT_STD) -> tuple[torch.Tensor, np.ndarray]:
    """Image file -> (normalised tensor (3, H, W), the RGB picture (H, W, 3) in [0, 1]), resized
    to cover ``size`` and centre-cropped (the aspect ratio is kept).

    Raises :class:`~vitkit.errors.ImageError` naming the file when it cannot be read: not an
    image, truncated, a folder, or larger than Pillow's decompression-bomb limit
    (``Image.MAX_IMAGE_PIXELS``; the warning Pillow gives below twice that is an error here).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.load()
                rgb = to_rgb(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageError(f"refused image {path}: it is too large to decode safely ({err})") \
            from err
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot read image {path}: {err}") from err
    return preprocess(rgb, size, mean, std)


def decode_image(data: bytes, max_pixels: int = 40_000_000, name: str = "the image"
                 ) -> Image.Image:
    """Encoded bytes -> an 8-bit RGB PIL image, decoded in memory (never from a path).

    Refused with an :class:`~vitkit.errors.ImageError` naming ``name``: bytes that are not a
    PNG, JPEG, BMP, GIF, TIFF, WebP or PPM image, a truncated file, or more pixels than
    ``max_pixels`` or Pillow's decompression-bomb limit (where Pillow would warn), both checked
    from the header before any pixel is decoded.
    """
    if not data:
        raise ImageError(f"{name} is empty: expected the bytes of an image file (PNG, JPEG, ...)")
    try:
        # only the formats vitkit names (never EPS, which Pillow hands to Ghostscript); the
        # size is checked against both limits here rather than through the bomb warning,
        # whose filter is process-wide state that threads would race on
        limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
        with Image.open(io.BytesIO(data), formats=DECODED_FORMATS) as img:
            w, h = img.size
            if w * h > limit:
                raise ImageError(
                    f"{name} is {w}x{h} = {w * h / 1e6:.2f} megapixels, more than the "
                    f"{limit / 1e6:g} allowed: too large to decode safely; scale it down first")
            img.load()
            return to_rgb(img)
    except Image.DecompressionBombError as err:
        raise ImageError(f"refused {name}: it is too large to decode safely ({err})") from err
    except Image.UnidentifiedImageError as err:
        raise ImageError(f"{name} is not an image Pillow recognises: expected a PNG, JPEG, "
                         "BMP, GIF, TIFF or WebP file") from err
    except (OSError, SyntaxError, ValueError) as err:
        if isinstance(err, ImageError):
            raise
        raise ImageError(f"cannot read {name} as an image ({err}): it may be truncated or "
                         "damaged; expected a whole PNG, JPEG, BMP, GIF, TIFF or WebP file") \
            from err


def find_images(inputs: list[str | os.PathLike]) -> list[Path]:
    """The files named in ``inputs`` and the images inside the folders named (recursively,
    sorted). A name that does not exist stays in the list: reading it reports the error for that
    name alone, so one bad name never spoils a batch. Nothing at all to read is a
    :class:`~vitkit.errors.DataError`."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += image_files(p)
        else:
            files.append(p)
    if not files:
        raise DataError(f"no images found in {', '.join(map(str, inputs))}: expected image "
                        f"files or folders holding them ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files
