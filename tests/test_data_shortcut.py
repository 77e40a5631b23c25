"""Planted shortcuts (``SPEC+KIND:CLASS``): which images carry them, where each kind sits, that
the validation split stays clean, and the messages for a malformed spec."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitkit.data.datasets import load_split
from vitkit.data.shortcut import Plant, mark_box, parse_plants, stamp
from vitkit.data.shortcut_kinds import KINDS, apply_kind
from vitkit.errors import DataError


def test_parse_plants_reads_kind_class_share_and_strength():
    assert parse_plants("digits") == ("digits", [])
    assert parse_plants("digits+mark:3") == ("digits", [Plant("mark", 3, 0.9, 1.0)])
    assert parse_plants("imagefolder:/x/y+mark:1:0.5") == ("imagefolder:/x/y",
                                                           [Plant("mark", 1, 0.5)])
    assert parse_plants("cluttered-digits+stripe:3:0.8:2+cast:5") == (
        "cluttered-digits", [Plant("stripe", 3, 0.8, 2.0), Plant("cast", 5)])
    for bad in ("digits+mark:", "digits+mark:x", "digits+mark:3:0", "digits+mark:3:1.5",
                "digits+mark:3:0.5:1:2", "digits+mark:-1", "digits+stripe:3:0.5:0"):
        with pytest.raises(DataError, match=r"SPEC\+KIND:CLASS"):
            parse_plants(bad)
    with pytest.raises(DataError, match="after the planted"):
        parse_plants("digits+mark:3+blur:2")
    with pytest.raises(DataError, match="one class"):
        parse_plants("digits+mark:3+cast:3")


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


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("side", [32, 64])
def test_each_kind_changes_its_own_pixels_only_and_more_at_strength_two(kind, side):
    g = np.random.default_rng(0)
    img = (g.random((side, side, 3)) * 0.6 * 255).astype(np.uint8)  # no pixel is white
    one, two = apply_kind(kind, img, 1.0, seed=4), apply_kind(kind, img, 2.0, seed=4)
    assert np.array_equal(one, apply_kind(kind, img, 1.0, seed=4))  # deterministic
    changed = (one != img).any(-1)
    where = KINDS[kind].pixels
    if where is None:  # everywhere: most pixels change, and twice the strength changes more
        assert changed.mean() > 0.5
        assert np.abs(two.astype(int) - img).mean() > 1.5 * np.abs(one.astype(int) - img).mean()
    else:
        inside = where(side, side, 1.0)
        assert changed.any() and not changed[~inside].any()
        assert 0 < inside.mean() < 0.3
        assert where(side, side, 2.0).sum() > inside.sum()
        assert not ((two != img).any(-1) & ~where(side, side, 2.0)).any()


def test_the_kinds_sit_where_their_names_say():
    px = {k: KINDS[k].pixels(32, 32, 1.0) for k in KINDS if KINDS[k].pixels is not None}
    assert px["stripe"][:, 0].all() and not px["stripe"][:, 16:].any()  # the whole left border
    assert px["frame"][0].all() and px["frame"][-1].all() and px["frame"][:, 0].all()
    assert not px["frame"][2:-2, 2:-2].any()
    assert px["text"][24:].any() and not px["text"][:20].any()  # lower left
    assert not px["text"][:, 20:].any()
    rows, cols = np.nonzero(px["patch"])  # off centre, away from every border
    assert rows.min() > 3 and cols.min() > 16 and rows.max() < 16 and cols.max() < 28
    assert np.array_equal(px["mark"], np.pad(np.ones((4, 4), bool), ((1, 27), (27, 1))))


def test_two_classes_carry_two_kinds_at_once():
    train = load_split("digits+mark:3+cast:5", "train", 32)
    labels = np.asarray(train.labels)
    assert set(train.planted) == {"mark:3", "cast:5"}
    assert (labels[train.planted["mark:3"]] == 3).all()
    assert (labels[train.planted["cast:5"]] == 5).all()
    assert train.marked == sorted(train.planted["mark:3"] + train.planted["cast:5"])
    plain = load_split("digits", "train", 32)
    i = train.planted["cast:5"][0]
    a, b = np.array(train[i][0]).astype(int), np.array(plain[i][0]).astype(int)
    assert (a[..., 0] - a[..., 2]).mean() > 10 and (b[..., 0] == b[..., 2]).all()  # orange
