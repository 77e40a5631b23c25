"""Trust checks a random map cannot pass (vitkit.explain.trust): deletion and insertion under
three baselines and both orders, the floor of many random maps, the model-randomisation test and
class sensitivity. Each is shown to fail a map that should fail and to pass one that should."""

from __future__ import annotations

import pytest
import torch
from doctor_catalogue import TRAINED
from known_object import OBJECTS, object_detector, object_images

import vitkit
from vitkit.explain import METHODS, perturb, registry, trust
from vitkit.explain.gradients import targets
from vitkit.explain.perturb import auc


def _perfect_maps() -> torch.Tensor:
    """The known answer: the model's class-0 logit follows the brightest patch [CLS] can attend
    to, so patches matter in order of brightness, the object patch first (1.0 against clutter
    below 0.2)."""
    maps = object_images().mean(1).unfold(1, 4, 4).unfold(2, 4, 4).mean((-1, -2))  # (2, 8, 8)
    for b, (r, c) in enumerate(OBJECTS):
        assert maps[b].argmax() == 8 * r + c
    return maps


def test_noisy_linear_imputation_fills_a_hole_in_a_ramp_exactly():
    """ROAD's linear imputation solves the Laplace equation over the removed pixels: on a linear
    ramp its answer is the ramp itself, and the kept pixels are untouched."""
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    ramp = (0.1 * ys + 0.05 * xs)[None, None].repeat(1, 3, 1, 1)
    removed = torch.zeros(1, 1, 16, 16, dtype=torch.bool)
    removed[..., 5:10, 4:11] = True
    filled = perturb.noisy_linear_fill(ramp, removed, noise=0.0, iterations=400)
    torch.testing.assert_close(filled, ramp, atol=1e-3, rtol=0)
    noisy = perturb.noisy_linear_fill(ramp, removed, noise=0.01)
    assert torch.equal(noisy[~removed.expand_as(noisy)], ramp[~removed.expand_as(ramp)])
    assert 0.003 < (noisy - ramp)[removed.expand_as(noisy)].std() < 0.03
    everything = torch.ones(1, 1, 16, 16, dtype=torch.bool)
    assert torch.equal(perturb.noisy_linear_fill(ramp, everything), torch.zeros_like(ramp))


@pytest.mark.parametrize("baseline", perturb.BASELINES)
def test_every_baseline_and_order_ranks_the_known_answer_first(baseline):
    """On the hand-built model whose answer is one patch, removing that patch first drops the
    class at the first step under every baseline, removing it last keeps it until the end, and
    revealing it first brings the class back sooner than revealing it last."""
    model, x, perfect = object_detector(), object_images(), _perfect_maps()
    target = torch.zeros(2, dtype=torch.long)

    def curve(mode, order):
        return perturb.perturbation_curves(model, x, perfect, target, mode=mode,
                                         baseline=baseline, order=order, steps=8)

    most, least = curve("deletion", "most"), curve("deletion", "least")
    assert (most[:, 1] < most[:, 0] - 0.05).all() and (least[:, 1:-1] > most[:, 0:1] - 1e-2).all()
    assert (auc(most) < auc(least)).all()
    assert (auc(curve("insertion", "most")) > auc(curve("insertion", "least"))).all()


def test_a_random_map_does_not_beat_the_floor_and_the_answer_does():
    model, x = object_detector(), object_images()
    target = torch.zeros(2, dtype=torch.long)
    perfect = trust.random_floor(model, x, _perfect_maps(), target, steps=8,
                                 baseline="constant")
    assert (perfect.percentile == 1.0).all() and (perfect.p_value <= 1 / 21 + 1e-6).all()
    g = torch.Generator().manual_seed(7)
    floors = [trust.random_floor(model, x, torch.rand(2, 8, 8, generator=g), target, steps=8,
                                 baseline="constant", seed=s + 1) for s in range(8)]
    percentiles = torch.cat([f.percentile for f in floors])
    significant = sum(int((f.p_value <= 0.05).sum()) for f in floors)
    assert 0.25 < percentiles.mean().item() < 0.75 and significant <= 2, percentiles
    insertion = trust.random_floor(model, x, _perfect_maps(), target, mode="insertion", steps=8,
                                   baseline="noisy-linear")
    assert (insertion.percentile >= 0.9).all()


def test_options_are_checked():
    model, x = object_detector(), object_images()
    t = torch.zeros(2, dtype=torch.long)
    for kw, words in ((dict(baseline="mean"), "baseline must be one of constant, blur"),
                      (dict(order="first"), "order must be one of most, least"),
                      (dict(mode="both"), "mode must be 'deletion' or 'insertion'")):
        with pytest.raises(ValueError, match=words):
            perturb.perturbation_curves(model, x, _perfect_maps(), t,
                                        **{"mode": "deletion", "baseline": "constant", **kw})


@pytest.fixture(scope="module")
def trained():
    """The doctor catalogue's trained ViT (300 steps on the digits) and 4 of its inputs."""
    model = vitkit.load_model(TRAINED, verbose=False)
    g = torch.Generator().manual_seed(0)
    return model, torch.rand(4, 3, 32, 32, generator=g)


def _copy_the_input(model, x, target, options, outputs):
    """A 'method' that returns each patch's brightness: it ignores the model entirely."""
    grid = x.mean(1).unfold(1, 4, 4).unfold(2, 4, 4).mean((-1, -2))  # (B, 8, 8)
    with torch.no_grad():
        logits = model(x)
    return grid, logits, targets(logits, target)


@pytest.fixture
def input_copy(monkeypatch):
    monkeypatch.setitem(METHODS, "input-copy", registry.Method(
        "input-copy", "the input's brightness (a planted failure)", (), needs_cls=False,
        gradients=False, compute=_copy_the_input))
    return "input-copy"


@pytest.mark.parametrize("method", [m.name for m in METHODS.values() if m.gradients])
def test_every_gradient_method_passes_the_randomisation_check(trained, method):
    model, x = trained
    result = trust.randomisation_check(model, x, method)
    assert result.stages[0] == "head" and result.stages[-1] == "block 0"
    assert len(result.stages) == 2 + len(model.blocks)  # head, final norm, every block
    assert result.passes, (method, dict(zip(result.stages, result.correlation, strict=True)))


def test_a_map_that_copies_the_input_fails_the_randomisation_check(trained, input_copy):
    model, x = trained
    result = trust.randomisation_check(model, x, input_copy)
    assert not result.passes and min(result.correlation) > 0.99 and min(result.ssim) > 0.99


def test_class_sensitivity_tells_a_class_map_from_a_class_blind_one(trained):
    model, x = trained
    assert trust.class_sensitivity(model, x, "chefer").passes
    blind = trust.class_sensitivity(model, x, "rollout")  # attention only: the same map
    assert not blind.passes and torch.allclose(blind.correlation, torch.ones(4))


def test_rank_correlation_and_ssim():
    a = torch.arange(16.0).reshape(1, 4, 4)
    assert trust.rank_correlation(a, a).item() == pytest.approx(1.0)
    assert trust.rank_correlation(a, -a).item() == pytest.approx(-1.0)
    assert trust.rank_correlation(a, 3 * a + 1).item() == pytest.approx(1.0)
    assert trust.ssim(a, a).item() == pytest.approx(1.0)
    # ties take their mean rank, as scipy's Spearman: two maps that agree only on where the
    # background's zeros are must not correlate through the zeros' positions
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 64, generator=g)
    y = torch.rand(3, 64, generator=g)
    x[:, :40] = 0.0
    y[:, :40] = 0.0
    y[1, 10:20] = 0.5  # ties of another value
    got = trust.rank_correlation(x, y)
    for i in range(3):
        assert got[i].item() == pytest.approx(spearmanr(x[i], y[i]).statistic, abs=1e-6)
    assert trust.average_ranks(torch.tensor([[3.0, 1.0, 3.0, 2.0]])).tolist() == [
        [2.5, 0.0, 2.5, 1.0]]
    assert trust.ssim(a, a.flip(-1).flip(-2)).item() < 0


@pytest.mark.parametrize("percentile, randomised, sensitive, fails", [
    (0.9, True, True, []),
    (1.0, True, True, []),
    (0.85, True, True, ["random maps"]),
    (0.95, False, True, ["model randomisation"]),
    (0.5, True, False, ["random maps", "class sensitivity"]),
])
def test_the_verdict_needs_the_floor_and_both_checks(percentile, randomised, sensitive, fails):
    said = trust.verdict(percentile, randomised, sensitive)
    assert said.trusted == (not fails) and said.fails == fails
    assert said.text.startswith("Trust it for" if not fails else "Trust it less")
    assert all(name in said.text for name in fails)
