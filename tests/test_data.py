"""Built-in data and image reading."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import needs_fashion_mnist
from PIL import Image

from vitkit.data import cluttered_digits, digits_split
from vitkit.data.datasets import load_split
from vitkit.data.images import load_image, resize_and_crop
from vitkit.errors import DataError


def test_cluttered_digits_are_deterministic_and_boxed():
    a = cluttered_digits(40, seed=3)
    b = cluttered_digits(40, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.boxes, b.boxes)
    assert not torch.equal(a.images, cluttered_digits(40, seed=4).images)
    assert a.images.shape == (40, 3, 32, 32) and a.images.min() >= 0 and a.images.max() <= 1
    src, labels = digits_split("train")
    for img, label, (x0, y0, x1, y1) in zip(a.images, a.labels, a.boxes, strict=True):
        patch = img[0, y0:y1, x0:x1]
        matches = (src == patch).flatten(1).all(1)  # the box holds a real digit of that label
        assert matches.any() and (labels[matches] == label).all()
        outside = img[0].clone()
        outside[y0:y1, x0:x1] = 0
        assert outside.sum() > 0  # there is clutter, and it lies outside the box


def test_train_and_val_use_disjoint_source_digits():
    train, _ = digits_split("train")
    val, _ = digits_split("val")
    assert len(train) + len(val) == 1797
    flat_train = {tuple(t.flatten().tolist()) for t in train}
    overlap = sum(tuple(v.flatten().tolist()) in flat_train for v in val)
    assert overlap <= 2  # the raw dataset itself holds a couple of exact duplicates
    with pytest.raises(ValueError, match="split must be"):
        digits_split("test")


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16", "LA", "1"])
def test_any_image_mode_becomes_rgb(tmp_path, mode):
    """Each mode gives the RGB picture it stands for: colour modes their colours, grey modes
    equal channels, 16-bit grey scaled onto 0..255 (not clipped), transparency composited on
    white. Compared after the same resize and crop, with the normalised tensor to match."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))
    if mode == "I;16":
        grey16 = rng.integers(0, 65535, (40, 60), dtype=np.uint16)
        img = Image.fromarray(grey16)
        pixels = np.repeat((grey16 / 65535 * 255).astype(np.uint8)[..., None], 3, axis=-1)
    else:
        img = rgb.convert(mode)
        grey = np.asarray(img.convert("L"))
        pixels = np.asarray(rgb) if mode in ("P", "RGBA", "CMYK") else \
            np.repeat(grey[..., None], 3, axis=-1)
    if mode in ("RGBA", "LA"):  # the left third transparent: white once composited
        alpha = np.full((40, 60), 255, np.uint8)
        alpha[:, :20] = 0
        img.putalpha(Image.fromarray(alpha))
        pixels = pixels.copy()
        pixels[:, :20] = 255
    path = tmp_path / f"img_{mode.replace(';', '')}.{'png' if mode != 'CMYK' else 'tiff'}"
    img.save(path)
    tensor, picture = load_image(path, (32, 32))
    assert tensor.shape == (3, 32, 32) and picture.shape == (32, 32, 3)
    expected = np.asarray(resize_and_crop(Image.fromarray(pixels), (32, 32))) / 255
    error = np.abs(picture - expected)
    if mode == "P":  # a 256-colour palette (dithered) approximates the colours
        assert error.mean() < 0.06
    else:
        assert error.max() < 1e-6
    if mode not in ("P", "RGBA", "CMYK"):
        assert (picture == picture[..., :1]).all()
    torch.testing.assert_close(tensor, torch.from_numpy(picture).permute(2, 0, 1) * 2 - 1)


def test_unreadable_image_names_the_file(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*broken.jpg"):
        load_image(bad, (32, 32))


def test_align_puts_digits_on_whole_patches():
    d = cluttered_digits(30, align=4, seed=5)
    assert (d.boxes[:, :2] % 4 == 0).all()
    assert (d.boxes[:, 2:] - d.boxes[:, :2] == 8).all()


def test_eval_predict_and_attention_see_the_same_pixels(tmp_path):
    """`vitkit eval` (a dataset through eval_transform), `predict` and `attention` (load_image)
    preprocess an image identically, so the same image gets the same logits everywhere."""
    import sklearn.datasets

    from vitkit.data.datasets import load_split
    from vitkit.data.transforms import eval_transform

    photo = Path(sklearn.datasets.__file__).parent / "images" / "flower.jpg"  # 640x427
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.open(photo).save(tmp_path / cls / "flower.png")
    split = load_split(f"imagefolder:{tmp_path}", "val", 48, val_fraction=0.5)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    from_dataset = eval_transform(48, mean, std)(split[0][0])
    from_file, picture = load_image(tmp_path / "a" / "flower.png", (48, 48), mean, std)
    assert torch.equal(from_dataset, from_file)
    assert picture.shape == (48, 48, 3)


@needs_fashion_mnist
def test_fashion_boxes_put_the_item_in_its_box_and_distractors_outside():
    from vitkit.data.boxed import boxed_fashion
    from vitkit.data.idx import load_idx

    d = boxed_fashion(40, "val", canvas=64, object_size=28, distractor_size=14, seed=3)
    again = boxed_fashion(40, "val", canvas=64, object_size=28, distractor_size=14, seed=3)
    assert torch.equal(d.images, again.images) and d.images.shape == (40, 3, 64, 64)
    assert not torch.equal(d.images, boxed_fashion(40, "val", seed=4).images)
    assert d.images.min() >= 0 and d.images.max() <= 1
    assert ((d.boxes[:, 2] - d.boxes[:, 0]) == 28).all() and (d.boxes[:, 2:] <= 64).all()
    assert (d.boxes[:, :2] % 4 == 0).all()  # aligned to 4-pixel patches
    pixels, labels, names = load_idx("fashion-mnist", "val", "data")
    items = torch.from_numpy(pixels.astype("float32") / 255)
    for i in range(10):
        x0, y0, x1, y1 = d.boxes[i].tolist()
        inside = d.images[i, 0, y0:y1, x0:x1]
        # the item at full size is in its box (composited over the texture by maximum), and it
        # is one of the val split's items of the image's label
        matches = (inside[None] >= items - 1e-6).flatten(1).all(1) & (labels == d.labels[i].item())
        assert bool(matches.any()), i
    assert d.classes == list(names)


@needs_fashion_mnist
def test_fashion_boxes_is_a_data_spec_with_boxes():
    split = load_split("fashion-boxes", "val", 64, size=1000)
    assert len(split) == 200 and split.boxes.shape == (200, 4)
    img, label = split[0]
    assert img.size == (64, 64) and 0 <= label < 10 and split.classes[0] == "T-shirt/top"


def test_a_sample_draws_its_augmentation_from_its_own_seed_and_leaves_the_global_rng_alone():
    """Sample i of epoch e is augmented as under ``torch.manual_seed(sample_seed(s, e, i))``
    (the documented rule; seeding only the CPU generator must not change a draw), and
    drawing it does not move the caller's random state."""
    from vitkit.data.transforms import Transformed, sample_seed, train_transform

    rng = np.random.default_rng(0)
    base = [(Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)), k)
            for k in range(4)]
    transform = train_transform(16, (0.5,) * 3, (0.5,) * 3, randaugment=9,
                                random_erasing=0.5)
    data = Transformed(base, transform, seed=7)
    data.set_epoch(3)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    drawn = [data[i][0] for i in range(4)]
    assert torch.equal(torch.rand(1), before)  # the caller's stream is where it was
    for i, x in enumerate(drawn):
        torch.manual_seed(sample_seed(7, 3, i))
        assert torch.equal(x, transform(base[i][0]))
    assert not torch.equal(drawn[0], drawn[1])  # different samples, different draws
    data.set_epoch(4)
    assert not torch.equal(data[0][0], drawn[0])  # a new epoch, a new augmentation


def test_pooled_splits_join_the_validation_images_for_pre_training():
    train, val = load_split("digits:0-4", "train", 8), load_split("digits:0-4", "val", 8)
    both = load_split("digits:0-4@both", "train", 8)
    assert len(both) == len(train) + len(val) and both.classes == train.classes
    assert both.labels == train.labels + val.labels
    assert np.array_equal(np.asarray(both.images[len(train)]), np.asarray(val.images[0]))
    assert load_split("digits:0-4@both", "val", 8).labels == val.labels  # SPEC's own
    every_val = load_split("digits", "val", 8)
    outside = load_split("digits@both-but:5-9", "train", 8)
    kept = [label for label in every_val.labels if label < 5]
    assert len(outside) == len(load_split("digits", "train", 8)) + len(kept)
    assert outside.labels[-len(kept):] == kept  # the validation images of 5-9 left out
    with pytest.raises(DataError, match="SPEC@both or SPEC@both-but:CLASSES"):
        load_split("digits@all", "train", 8)
    with pytest.raises(DataError, match="digits:CLASSES takes class numbers 0-9"):
        load_split("digits@both-but:12", "train", 8)


def test_without_fashion_mnist_its_tests_skip_and_say_why(tmp_path):
    """A fresh machine without Debian's dataset-fashion-mnist: the tests that read it skip with
    the reason (the package hidden by a plugin that points vitkit at an empty folder)."""
    plugin = tmp_path / "hide_fashion.py"
    plugin.write_text("from pathlib import Path\nimport vitkit.data.idx as idx\n"
                      "idx.DEBIAN_FASHION_MNIST = Path('/nonexistent/fashion-mnist')\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "hide_fashion", "-p",
         "no:cacheprovider", str(Path(__file__)), "-k", "fashion_boxes"],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 skipped" in done.stdout and "apt-get install dataset-fashion-mnist" in done.stdout
    assert "failed" not in done.stdout
