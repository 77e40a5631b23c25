"""The audit's rules on cases whose answer is known by construction: regions of any shape derived
from synthetic maps, the bounded pixel measure, and the tests by intervention run on hand-written
models that use exactly one thing (a place, a colour, a brightness, a texture) or nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitkit.audit.analysis import Audit, _suspicion
from vitkit.audit.flags import SAME_PIXELS, Flag, candidate_region, examine_region, pixel_variation
from vitkit.audit.statistics import STATISTICS, examine_statistic, power_shares
from vitkit.data.shortcut_kinds import apply_kind


def _maps(n: int, excess: torch.Tensor | None, seed: int) -> torch.Tensor:
    """(n, 8, 8) shares: noise, plus 60% of the relevance spread over ``excess`` (bool)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(n, 8, 8, generator=g)
    m = m / m.flatten(1).sum(1)[:, None, None]
    if excess is not None:
        m = 0.4 * m + 0.6 * excess.float() / excess.sum()
    return m


def _region(name: str) -> torch.Tensor:
    r = torch.zeros(8, 8, dtype=torch.bool)
    if name == "corner":
        r[0, 7] = True
    elif name == "stripe":
        r[:, 0] = True
    elif name == "frame":
        r[0], r[-1], r[:, 0], r[:, -1] = True, True, True, True
    elif name == "two parts":
        r[1:3, 1:3] = True
        r[5:7, 5:7] = True
    elif name == "half":
        r[:, :4] = True
    return r


@pytest.mark.parametrize("shape", ["corner", "stripe", "frame", "two parts", "half"])
def test_the_region_is_where_the_class_puts_more_whatever_its_shape_and_size(shape):
    truth = _region(shape)
    found = candidate_region(_maps(80, truth, 0), _maps(300, None, 1))
    assert found is not None and torch.equal(found, truth)


def test_no_region_where_the_class_puts_what_the_others_put():
    assert candidate_region(_maps(80, None, 0), _maps(300, None, 1)) is None


def test_pixel_variation_is_bounded_zero_for_a_stamp_and_one_for_varied_content():
    g = torch.Generator().manual_seed(0)
    region = torch.zeros(8, 8, dtype=torch.bool)
    region[:, 0] = True  # a column of patches, 4 pixels wide
    dark = torch.rand(50, 3, 32, 32, generator=g) * 0.01  # near-constant there elsewhere
    stamped = torch.rand(50, 3, 32, 32, generator=g)
    stamped[:, :, :, :4] = 1.0  # a solid white stripe: no contrast of its own (the old ratio
    assert pixel_variation(stamped, dark, region) == pytest.approx(0.0, abs=1e-4)  # blew up)
    half = torch.rand(50, 3, 32, 32, generator=g) * 0.3  # a textured background
    half[:, :, :, :2] = 1.0  # a stripe 2 pixels wide, half the patches' width
    assert pixel_variation(half, torch.rand(50, 3, 32, 32, generator=g) * 0.3, region) < 0.15
    varied = torch.rand(50, 3, 32, 32, generator=g)
    assert pixel_variation(varied, torch.rand(50, 3, 32, 32, generator=g), region) > 0.8
    assert 0.0 <= pixel_variation(varied, dark, region) <= 1.0
    assert pixel_variation(dark, dark.flip(0), region) > 0.8  # nothing there, anywhere


class _Rule(nn.Module):
    """Two classes: logit of class 1 = gain x (score(x) - threshold)."""

    def __init__(self, score, threshold: float, gain: float = 40.0):
        super().__init__()
        self.score, self.threshold, self.gain = score, threshold, gain

    def forward(self, x):
        z = self.gain * (self.score(x) - self.threshold)
        return torch.stack([-z / 2, z / 2], -1)


def _images(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=g) * 0.6


def _planted(kind: str, x: torch.Tensor) -> torch.Tensor:
    out = [torch.from_numpy(apply_kind(kind, (img.permute(1, 2, 0).numpy() * 255).round()
                                       .astype("uint8"), 1.0, seed=i)).permute(2, 0, 1) / 255
           for i, img in enumerate(x)]
    return torch.stack(out).float()


def test_a_stripe_the_model_uses_is_a_finding_and_one_it_ignores_is_refuted():
    own, others = _planted("stripe", _images(60, 0)), _images(120, 1)
    region = torch.zeros(8, 8, dtype=torch.bool)
    region[:, 0] = True
    uses = _Rule(lambda x: x[:, :, :, :2].mean((1, 2, 3)), 0.8)  # the left border's brightness
    verdict, effect = examine_region(uses, 1, own, own[:8], others, region)
    assert verdict == "finding", effect
    assert effect["removed"]["flipped"] > 0.9 and effect["added"]["to_class_after"] > 0.9
    assert effect["added"]["to_class_control"] < 0.1 and effect["pixel_variation"] < SAME_PIXELS
    ignores = _Rule(lambda x: x[:, :, 12:20, 12:20].mean((1, 2, 3)), 0.0)  # always class 1
    verdict, effect = examine_region(ignores, 1, own, own[:8], others, region)
    assert verdict == "refuted", effect


def test_an_object_part_the_model_uses_but_that_differs_between_images_is_unsettled():
    g = torch.Generator().manual_seed(3)
    own, others = _images(60, 0), _images(120, 1)
    strokes = (torch.rand(60, 1, 8, 8, generator=g) > 0.4).float()  # bright, shaped differently
    own[:, :, 8:16, 8:16] = strokes.expand(-1, 3, -1, -1)
    region = torch.zeros(8, 8, dtype=torch.bool)
    region[2:4, 2:4] = True
    uses = _Rule(lambda x: x[:, :, 8:16, 8:16].mean((1, 2, 3)), 0.45)
    verdict, effect = examine_region(uses, 1, own, own[:8], others, region)
    assert verdict == "unsettled" and effect["removed"]["needed"] and effect["added"]["enough"]
    assert effect["pixel_variation"] > 0.5


def _red(x):
    return x[:, 0].mean((1, 2)) - x[:, 2].mean((1, 2))


def _grating_power(x):
    return power_shares(x)[:, 8, 8]  # the planted grating: period 4 pixels along x + y


@pytest.mark.parametrize(("name", "kind", "score", "threshold"), [
    ("colour", "cast", _red, 0.05),
    ("texture", "texture", _grating_power, 0.05),
])
def test_a_statistic_the_model_uses_is_a_finding_of_its_kind(name, kind, score, threshold):
    own, others = _planted(kind, _images(60, 0)), _images(120, 1)
    model = _Rule(score, threshold)
    assert (model(own).argmax(-1) == 1).all() and (model(others).argmax(-1) == 0).all()
    tested = examine_statistic(model, name, 1, own, others)
    assert tested is not None and tested[0] == "finding", tested
    for other in STATISTICS:  # the one it does not use is not a finding
        if other != name:
            result = examine_statistic(model, other, 1, own, others)
            assert result is None or result[0] != "finding", (other, result)


@pytest.mark.parametrize("shift", ["brighter", "more contrast"])
def test_brightness_or_contrast_the_model_uses_is_a_colour_finding(shift):
    own, others = _images(60, 0), _images(120, 1)
    if shift == "brighter":
        own, model = own + 0.3, _Rule(lambda x: x.mean((1, 2, 3)), 0.45)
    else:
        own, model = (own - 0.3) * 2 + 0.3, _Rule(lambda x: x.std((1, 2, 3)), 0.26)
    assert (model(own).argmax(-1) == 1).all() and (model(others).argmax(-1) == 0).all()
    verdict, effect, _ = examine_statistic(model, "colour", 1, own, others)
    assert verdict == "finding", effect


def test_nothing_to_test_where_no_frequency_stands_out():
    assert examine_statistic(_Rule(_red, 0.0), "texture", 1, _images(60, 0),
                             _images(120, 1)) is None


def test_a_share_counts_only_beyond_its_margin_and_two_standard_errors():
    from vitkit.audit.flags import beyond

    assert not beyond(2 / 26, 26, 2 / 100, 100, 0.05)  # 2 images of 26: noise
    assert beyond(8 / 91, 91, 0.0, 100, 0.05)
    assert not beyond(0.09, 1000, 0.0, 1000, 0.1)  # significant, below the margin
    assert beyond(0.5, 100, 0.0, 100, 0.1)


def test_the_verdicts():
    from vitkit.audit.flags import judge

    # a place with the same pixels: a finding when needed, enough or both
    assert judge(True, True, True) == judge(False, True, True) == judge(True, False, True) \
        == "finding"
    # an object part: its pixels differ, so whatever masking says, not a finding
    assert judge(True, True, False) == judge(True, False, False) == "unsettled"
    assert judge(False, False, True) == judge(False, False, False) == "refuted"
    # a property of the whole image (no pixel test) must be needed and enough
    assert judge(True, True) == "finding"
    assert judge(True, False) == judge(False, True) == "unsettled"
    assert judge(False, False) == "refuted"


def test_a_texture_covers_the_image_and_an_objects_frequencies_do_not():
    from vitkit.audit.statistics import band_spread

    everywhere = _planted("texture", torch.full((20, 3, 32, 32), 0.3))
    in_a_corner = torch.full((20, 3, 32, 32), 0.3)
    in_a_corner[:, :, :12, :12] = everywhere[:, :, :12, :12]  # the same pattern, on an object
    bins = torch.zeros(32, 17, dtype=torch.bool)
    bins[5:12, 5:12] = True  # the grating's frequency and its neighbours (one bin alone is a
    assert band_spread(everywhere, bins) > 0.9  # sinusoid over the whole image, by definition)
    assert band_spread(in_a_corner, bins) < 0.4


def test_suspicion_ranks_the_carriers_of_a_pattern_only_they_lean_on_before_a_pattern_all_do():
    """Class 0 leans on the context outside a small box (0.72 of its relevance) but so does
    every other image (0.70); half of class 1 carries a corner the others leave alone (0.5 of
    their relevance there, 0.05 elsewhere). Counted from the other classes' reliance, the
    carriers come first, though their raw share is below the context's."""
    n, region = 60, torch.zeros(8, 8, dtype=torch.bool)
    region[:2, :2] = True
    every = torch.full((n, 8, 8), 1 / 64)
    rows = []
    for i in range(n):
        cls, carrier = i % 3, i % 3 == 1 and i % 2 == 0
        if carrier:
            every[i] = 0.5 / 60
            every[i, :2, :2] = 0.5 / 4
        rows.append({"index": i, "prediction": cls, "error": None, "suspicion": 0.0,
                     "in_box": 0.28 if cls == 0 else 0.30})
    result = Audit("test", rows, every.numpy(), flags=[
        Flag("outside-box", 0, "", "", verdict="finding"),
        Flag("region", 1, "", "", region=region, verdict="finding")])
    _suspicion(None, None, None, result, every)
    ranked = sorted(rows, key=lambda r: -r["suspicion"])
    carriers = [r["index"] for r in rows if r["prediction"] == 1 and r["index"] % 2 == 0]
    assert {r["index"] for r in ranked[:len(carriers)]} == set(carriers)
    assert result.flags[0].effect["baseline_reliance"] == pytest.approx(0.70)
    assert max(r["suspicion"] for r in rows if r["prediction"] == 0) == pytest.approx(0.02)


# ------------------------------------------------------------ each rule, either side of its line
def _alternating(n: int, mask: torch.Tensor, mean: float, spread: float) -> torch.Tensor:
    """(n, 8, 8): ``mean`` +- ``spread`` in turn on ``mask``, zero elsewhere (the variance known:
    spread^2 n/(n-1))."""
    sign = torch.tensor([1.0, -1.0]).repeat(n // 2)[:, None, None]
    return (mean + spread * sign) * mask.float()


@pytest.mark.parametrize(("k", "found"), [(3.0, False), (5.0, True)])
def test_a_patch_is_in_the_region_only_beyond_four_standard_errors(k, found):
    """8 patches whose excess is k standard errors each (0.12 of the relevance in all, above the
    share rule): a region at 5, none at 3 (the rule is Z = 4, not 2)."""
    where = torch.zeros(8, 8, dtype=torch.bool)
    where[2:4, 2:6] = True
    members = _alternating(100, where, 0.1, 0.05)
    se = (members[:, 2, 2].var() / 100).sqrt().item()
    others = (0.1 - k * se) * where.float().expand(100, 8, 8)
    assert 8 * k * se > 0.1  # the share rule passes on either side
    got = candidate_region(members, others)
    assert (got is not None) == found
    if found:
        assert torch.equal(got, where)


@pytest.mark.parametrize(("excess", "found"), [(0.05, False), (0.15, True)])
def test_a_region_must_hold_a_tenth_more_of_the_relevance(excess, found):
    """One patch hundreds of standard errors above the others' maps: a region when it holds 0.15
    more of the relevance, none at 0.05 (the rule is 10%, not 1%)."""
    where = torch.zeros(8, 8, dtype=torch.bool)
    where[0, 7] = True
    members = _alternating(100, where, 0.3, 0.001)
    others = (0.3 - excess) * where.float().expand(100, 8, 8)
    assert (candidate_region(members, others) is not None) == found


def test_needed_compares_the_class_s_loss_with_the_control_s_in_that_direction():
    """A change that costs the class its images (brightness gone) and leaves the others alone is
    needed; the same numbers the other way round (the class untouched, the others dimmed out of
    their class) are not: the class must lose more than the control, not less."""
    from vitkit.audit.flags import needed_effect

    model = _Rule(lambda x: x.mean((1, 2, 3)), 0.45)
    own, others = _images(60, 0) + 0.3, _images(120, 1)  # class 1 by brightness, class 0
    assert (model(own).argmax(-1) == 1).all() and (model(others).argmax(-1) == 0).all()
    dark = own - 0.3
    costs_the_class = needed_effect(model, 1, own, dark, others, others)
    assert costs_the_class["needed"] and costs_the_class["flipped"] > 0.9
    # the control loses what the class kept: brightening the others turns them away from class 0
    costs_the_control = needed_effect(model, 1, own, own, others, others + 0.3)
    assert costs_the_control["control_flipped"] > 0.9 and costs_the_control["flipped"] == 0
    assert not costs_the_control["needed"]


def test_a_band_on_half_of_each_image_is_an_object_not_a_texture():
    """The grating the model uses, on the left half of each image only (an object's texture,
    spread about 0.5): needed and enough, but not a texture finding, because the band does not
    cover three quarters of the image (the rule is 0.75, not 0.25); on the whole image, it is."""
    base = _images(60, 0) * 0.5 + 0.2  # a quieter background: the half's band stands out
    planted = _planted("texture", base)
    own = base.clone()
    own[:, :, :, :16] = planted[:, :, :, :16]
    others = _images(120, 1) * 0.5 + 0.2
    model = _Rule(_grating_power, 0.05)
    assert (model(own).argmax(-1) == 1).all() and (model(others).argmax(-1) == 0).all()
    verdict, effect, _ = examine_statistic(model, "texture", 1, own, others)
    assert effect["removed"]["needed"] and effect["added"]["enough"], effect
    assert 0.3 < effect["band_spread"] < 0.7, effect
    assert verdict == "unsettled", effect
