"""Deletion, insertion and localisation on hand-built cases where the answer is known."""

import pytest
import torch
from torch import nn

from vitkit.explain import localisation, perturb


class OnePatchModel(nn.Module):
    """Class 0's logit is 10 x the mean of patch (0, 0) (4x4 pixels); class 1's is 0. Only that
    patch matters, so a faithful map ranks it first."""

    def forward(self, x):
        signal = x[:, :, :4, :4].mean((1, 2, 3)) * 10
        return torch.stack([signal, torch.zeros_like(signal)], dim=1)


def test_deletion_and_insertion_reward_the_faithful_map():
    model = OnePatchModel()
    images = torch.ones(2, 3, 16, 16)  # a 4x4 grid of 4x4 patches
    faithful = torch.zeros(2, 4, 4)
    faithful[:, 0, 0] = 1.0
    unfaithful = torch.ones(2, 4, 4)
    unfaithful[:, 0, 0] = -1.0  # the one patch that matters is ranked last
    target = torch.zeros(2, dtype=torch.long)
    good = perturb.deletion_insertion(model, images, faithful, target, steps=16,
                                      baseline="constant")
    bad = perturb.deletion_insertion(model, images, unfaithful, target, steps=16,
                                     baseline="constant")
    p_on, p_off = torch.sigmoid(torch.tensor(10.0)).item(), 0.5
    # deletion: patch (0, 0) goes first -> [p_on, p_off x 16]; last -> [p_on x 16, p_off]
    assert good.deletion[0].tolist() == pytest.approx([p_on] + [p_off] * 16)
    assert good.deletion_auc[0] == pytest.approx((p_on + p_off) / 32 + p_off * 15 / 16)
    assert bad.deletion_auc[0] == pytest.approx(p_on * 15 / 16 + (p_on + p_off) / 32)
    assert good.insertion_auc[0] == pytest.approx(float(bad.deletion_auc[0]))
    assert good.insertion_auc[0] > bad.insertion_auc[0]
    assert good.fractions.tolist() == pytest.approx([i / 16 for i in range(17)])


def test_random_floor_sits_between_faithful_and_adversarial():
    model = OnePatchModel()
    images = torch.ones(1, 3, 16, 16)
    target = torch.zeros(1, dtype=torch.long)
    faithful = torch.zeros(1, 4, 4)
    faithful[0, 0, 0] = 1
    aucs = [perturb.deletion_insertion(model, images, perturb.random_maps(faithful, s), target,
                                       baseline="constant").deletion_auc.item()
            for s in range(20)]
    best = perturb.deletion_insertion(model, images, faithful, target,
                                      baseline="constant").deletion_auc.item()
    assert best < sum(aucs) / len(aucs) < 0.98


def test_auc_of_a_constant_curve_is_the_constant():
    assert perturb.auc(torch.full((3, 9), 0.25)).tolist() == pytest.approx([0.25] * 3)


def test_pointing_game_hits_and_misses():
    maps = torch.zeros(2, 4, 4)
    maps[0, 1, 2] = 1.0  # patch row 1, col 2 -> pixels y 8..15, x 16..23 at 32x32
    maps[1, 3, 3] = 1.0
    boxes = torch.tensor([[16, 8, 24, 16], [0, 0, 8, 8]])
    assert localisation.pointing_game(maps, boxes, (32, 32)).tolist() == [True, False]


def test_mass_in_box_of_uniform_and_concentrated_maps():
    uniform = torch.ones(1, 4, 4)
    quarter = torch.tensor([[0, 0, 16, 16]])
    assert localisation.mass_in_box(uniform, quarter, (32, 32)).item() == pytest.approx(0.25)
    negative = -torch.ones(1, 4, 4)
    negative[0, :2, :2] = 1.0
    assert localisation.mass_in_box(negative, quarter, (32, 32)).item() > 0.9


def test_mismatched_batch_is_an_error():
    with pytest.raises(ValueError, match="3 maps for 2 images"):
        perturb.deletion_insertion(OnePatchModel(), torch.ones(2, 3, 16, 16),
                                   torch.ones(3, 4, 4), torch.zeros(2, dtype=torch.long),
                                   baseline="constant")


def test_every_caller_names_its_baseline():
    """One deletion and insertion with no default fill: leaving the baseline out is a
    TypeError, and the two curves of deletion_insertion are perturbation_curves' own."""
    model, images = OnePatchModel(), torch.rand(2, 3, 16, 16)
    maps, target = torch.rand(2, 4, 4), torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match="baseline"):
        perturb.deletion_insertion(model, images, maps, target)
    with pytest.raises(TypeError, match="baseline"):
        perturb.perturbation_curves(model, images, maps, target, mode="deletion")
    for baseline in perturb.BASELINES:
        both = perturb.deletion_insertion(model, images, maps, target, baseline=baseline)
        for mode in perturb.MODES:
            one = perturb.perturbation_curves(model, images, maps, target, mode=mode,
                                              baseline=baseline)
            torch.testing.assert_close(getattr(both, mode), one)


def test_the_blur_baseline_is_a_blur_of_the_image():
    """Insertion under "blur" starts from the blurred image (nothing revealed) and ends at the
    image; the blur keeps a constant image as it is and smooths a checkerboard to its mean."""
    flat = torch.full((1, 3, 16, 16), 0.3)
    torch.testing.assert_close(perturb.blur(flat), flat)
    checker = ((torch.arange(16)[:, None] + torch.arange(16)[None]) % 2).float()
    smooth = perturb.blur(checker.expand(1, 3, 16, 16))[..., 4:12, 4:12]
    assert (smooth - 0.5).abs().max() < 0.05
    model = OnePatchModel()
    images = torch.rand(1, 3, 16, 16)
    target = torch.zeros(1, dtype=torch.long)
    curve = perturb.perturbation_curves(model, images, torch.rand(1, 4, 4), target,
                                        mode="insertion", baseline="blur", steps=4)
    with torch.no_grad():
        start = model(perturb.blur(images)).softmax(-1)[0, 0]
        end = model(images).softmax(-1)[0, 0]
    assert curve[0, 0].item() == pytest.approx(start.item(), abs=1e-6)
    assert curve[0, -1].item() == pytest.approx(end.item(), abs=1e-6)
