"""The audit library (vitkit.audit) on a planted shortcut: a nano ViT trained on the cluttered
digits with a mark stamped on 90% of class 3's training images
(tests/data/audit/marked.safetensors) and the same recipe on the clean data (clean.safetensors);
tests/data/audit/make_models.py makes both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.audit import audit
from vitkit.audit.flags import region
from vitkit.audit.regions import corner_masks, entropy, image_stats, shares
from vitkit.audit.spray import cluster
from vitkit.data.datasets import load_split
from vitkit.data.shortcut import mark_box

DATA = Path(__file__).parent / "data" / "audit"


@pytest.fixture(scope="module")
def marked_audit():
    model = vitkit.load_model(DATA / "marked.safetensors")
    split = load_split("cluttered-digits+mark:3", "train", 32, size=1000)
    return split, audit(model, split, method="cp-lrp", batch_size=128)


def test_region_shares_and_entropy_on_known_maps():
    one = torch.zeros(1, 8, 8)
    one[0, 0, 7] = 5.0
    stats = image_stats(one)
    assert stats["top_right"].item() == 1.0 and stats["border"].item() == 1.0
    assert stats["entropy"].item() == pytest.approx(0.0)
    even = torch.ones(1, 8, 8)
    assert entropy(even).item() == pytest.approx(1.0)
    assert image_stats(even)["border"].item() == pytest.approx(28 / 64)
    assert shares(-even).sum().item() == pytest.approx(1.0)  # no evidence: spread evenly
    assert corner_masks((8, 8))["bottom_left"].sum().item() == 4


def test_region_is_the_fewest_patches_holding_half():
    m = torch.tensor([[0.4, 0.2], [0.3, 0.1]])
    assert region(m).tolist() == [[True, False], [True, False]]


def test_spray_separates_two_strategies_and_keeps_one_together():
    g = torch.Generator().manual_seed(0)
    corner = torch.rand(30, 8, 8, generator=g) * 0.1
    corner[:, 0, 7] += 3
    centre = torch.rand(30, 8, 8, generator=g) * 0.1
    centre[:, 3:5, 3:5] += 1
    two = cluster(torch.cat([corner, centre]))
    assert two.k == 2
    assert len(set(two.labels[:30])) == 1 and len(set(two.labels[30:])) == 1
    assert two.labels[0] != two.labels[30]
    assert cluster(centre).k == 1


def test_the_audit_ranks_the_marked_images_first_and_confirms_the_mark(marked_audit):
    split, result = marked_audit
    confirmed = [f for f in result.flags if f.confirmed]
    # the mark: a fixed region, and (it sits outside the digit's box) relevance outside the box
    assert {(f.kind, f.cls) for f in confirmed} == {("region", 3), ("outside-box", 3)}, [
        f.to_dict() for f in result.flags]
    outside = next(f for f in confirmed if f.kind == "outside-box")
    own, control = outside.effect["context_removed"], outside.effect["control"]
    assert own["confidence_before"] - own["confidence_after"] > 0.1 + (
        control["confidence_before"] - control["confidence_after"])
    flag = next(f for f in confirmed if f.kind == "region")
    # the flagged region covers the mark's patches
    x0, y0, x1, y1 = mark_box(32, 32)
    assert flag.region[y0 // 4:(y1 - 1) // 4 + 1, x0 // 4:(x1 - 1) // 4 + 1].any()
    assert flag.confirmed and flag.effect["pixel_variation"] < 0.25  # 10% of 3s lack the mark
    assert flag.effect["added"]["to_class_control"] <= 0.05  # pasted from other digits: none
    assert flag.effect["added"]["to_class_after"] >= 0.5  # the mark alone makes a 3
    removed = flag.effect["removed"]
    assert removed["confidence_before"] - removed["confidence_after"] >= 0.1
    ranked = sorted(result.rows, key=lambda r: -r["suspicion"])
    top = [r["index"] for r in ranked[:50]]
    precision = np.isin(top, split.marked).mean()
    assert precision >= 0.9, precision
    assert {"prediction", "confidence", "cluster", "suspicion", "border",
            "top_right", "entropy", "high_norm_tokens"} <= set(result.rows[0])


def test_the_same_recipe_without_the_mark_raises_no_flag():
    model = vitkit.load_model(DATA / "clean.safetensors")
    result = audit(model, load_split("cluttered-digits", "train", 32, size=1000), method="cp-lrp",
                   batch_size=128)
    assert [f.to_dict() for f in result.flags if f.confirmed] == []
    # a cluster of digits sitting in one place can pass both masking tests; its pixels differ
    # from image to image, so it stays unsettled
    assert all(f.effect["pixel_variation"] > 0.25 for f in result.flags
               if f.kind == "region" and f.effect["removed"]["needed"]
               and f.effect["added"]["enough"])
    assert max(r["suspicion"] for r in result.rows) <= 0.25


def test_a_method_the_model_refuses_is_named():
    model = vitkit.load_model(DATA / "clean.safetensors")
    with pytest.raises(ValueError, match="methods that apply"):
        audit(model, load_split("cluttered-digits", "val", 32), method="map")


def test_an_unreadable_image_is_a_row_with_its_error(tmp_path):
    from vitkit.data.datasets import Split

    model = vitkit.load_model(DATA / "clean.safetensors")
    base = load_split("cluttered-digits", "val", 32)
    images = [base[i][0] for i in range(5)] + [str(tmp_path / "missing.png")]
    result = audit(model, Split(images, base.labels[:6], base.classes), batch_size=4)
    assert "missing.png" in result.rows[5]["error"] and np.isnan(result.maps[5]).all()
    assert all(not r["error"] and r["confidence"] > 0 for r in result.rows[:5])


def test_outside_box_flags_a_class_that_looks_outside_and_leaves_a_healthy_one():
    from vitkit.audit.flags import box_pixels, outside_box_flag

    assert outside_box_flag(1, np.array([0.7, 0.8, 0.3, 0.9])) is None  # one image of four
    flag = outside_box_flag(3, np.array([0.2, 0.3, 0.35, 0.8]))
    assert flag.kind == "outside-box" and flag.cls == 3 and "75%" in flag.evidence
    px = box_pixels(torch.tensor([[1, 2, 3, 5]]), (6, 6))[0, 0]
    assert px.sum().item() == 2 * 3 and px[2:5, 1:3].all()


@pytest.mark.parametrize(("name", "kind"), [("stripe", "region"), ("cast", "colour")])
def test_shortcuts_of_other_kinds_are_found_and_their_carriers_ranked_first(name, kind):
    """A stripe along a whole border (12% of the patches: the old audit's size threshold missed
    it) and a colour cast, which is not a place at all."""
    from vitkit.audit.store import _first

    model = vitkit.load_model(DATA / f"{name}.safetensors")
    split = _first(load_split(f"cluttered-digits+{name}:3:0.9:1", "train", 32, size=3000), 600)
    result = audit(model, split, method="cp-lrp", batch_size=128)
    findings = [f for f in result.flags if f.confirmed]
    assert {f.cls for f in findings} == {3}, [f.to_dict() for f in findings]
    assert kind in {f.kind for f in findings}, [f.to_dict() for f in findings]
    flag = next(f for f in findings if f.kind == kind)
    if kind == "region":  # the left column of patches, and nothing far from it
        assert flag.region[:, 0].sum() >= 6 and not flag.region[:, 2:].any()
        assert flag.effect["pixel_variation"] < 0.25
    else:  # the class's colour, imposed on other digits, makes 3s of them
        assert flag.effect["added"]["to_class_after"] - flag.effect["added"][
            "to_class_control"] >= 0.5
    rows = sorted(result.rows, key=lambda r: (-r["suspicion"], r["index"]))
    carriers = set(split.planted[f"{name}:3"])
    assert np.mean([r["index"] in carriers for r in rows[:20]]) >= 0.8
