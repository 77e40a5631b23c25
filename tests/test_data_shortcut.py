"""The planted shortcut (``SPEC+mark:CLASS``): which images carry the mark, where it is, that the
validation split stays clean, and the messages for a malformed mark."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitkit.data.datasets import load_split
from vitkit.data.shortcut import mark_box, parse_mark, stamp
from vitkit.errors import DataError


def test_parse_mark_reads_the_class_and_the_share():
    assert parse_mark("digits") == ("digits", None, 0.0)
    assert parse_mark("digits+mark:3") == ("digits", 3, 0.9)
    assert parse_mark("imagefolder:/x/y+mark:1:0.5") == ("imagefolder:/x/y", 1, 0.5)
    for bad in ("digits+mark:", "digits+mark:x", "digits+mark:3:0", "digits+mark:3:1.5",
                "digits+mark:3:0.5:1", "digits+mark:-1"):
        with pytest.raises(DataError, match=r"SPEC\+mark:CLASS"):
            parse_mark(bad)


def test_the_mark_sits_in_the_top_right_corner_and_changes_nothing_else():
    assert mark_box(32, 32) == (27, 1, 31, 5)
    assert mark_box(224, 160) == (199, 5, 219, 25)
    img = Image.fromarray(np.full((32, 32, 3), 77, dtype=np.uint8))
    a, b = np.array(img), np.array(stamp(img))
    x0, y0, x1, y1 = mark_box(32, 32)
    changed = np.argwhere((a != b).any(-1))
    assert changed[:, 0].min() >= y0 and changed[:, 0].max() < y1
    assert changed[:, 1].min() >= x0 and changed[:, 1].max() < x1
    patch = b[y0:y1, x0:x1, 0]
    assert patch[0, 0] == 255 and patch[0, -1] == 0 and patch[-1, -1] == 255  # a checkerboard


def test_most_of_one_class_is_marked_in_training_and_nothing_in_validation():
    train = load_split("digits+mark:3", "train", 32)
    plain = load_split("digits", "train", 32)
    threes = [i for i, y in enumerate(train.labels) if y == 3]
    assert train.marked and set(train.marked) <= set(threes)
    assert len(train.marked) == round(0.9 * len(threes))
    x0, y0, x1, y1 = mark_box(32, 32)
    for i in (train.marked[0], threes[-1] if threes[-1] not in train.marked else None,
              next(i for i, y in enumerate(train.labels) if y != 3)):
        if i is None:
            continue
        a, b = np.array(train[i][0]), np.array(plain[i][0])
        assert (a[y0:y1, x0:x1] != b[y0:y1, x0:x1]).any() == (i in train.marked)
    assert load_split("digits+mark:3", "train", 32).marked == train.marked  # deterministic
    val = load_split("digits+mark:3", "val", 32)
    assert val.marked == []
    clean = load_split("digits", "val", 32)
    assert all(np.array_equal(np.array(val[i][0]), np.array(clean[i][0])) for i in range(20))


def test_a_mark_on_a_class_the_data_lacks_is_refused():
    with pytest.raises(DataError, match="has 3 classes"):
        load_split("digits:0,1,2+mark:5", "train", 32)
