"""Dense features (vitkit.explain.dense, vitkit.viz.dense, `vitkit dense`): the patch tokens
equal timm's; the PCA picture equals scikit-learn's PCA applied by hand, finds a planted object
whatever sign the PCA gives, and a shared basis colours the same features alike in every image;
the similarity map equals torch's cosine_similarity (the patch itself 1); a planted high-norm
token is marked and circled; the command as a process, with a bad image among good ones."""

import subprocess
import sys

import matplotlib.patches as mpatches
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import small_vit
from PIL import Image
from sklearn.decomposition import PCA

import vitkit
from vitkit import cli
from vitkit.data.images import load_image
from vitkit.errors import ExplainError
from vitkit.explain import dense, stats
from vitkit.models.cnn import create_cnn
from vitkit.viz.dense import figure_pca

PLANTED = (2, 5)  # the patch whose position row is made huge: a high-norm token


def timm_twin(model):
    cfg = model.cfg
    twin = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        num_classes=cfg.num_classes, reg_tokens=cfg.num_reg_tokens)
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.eval()


def features(seed=0, b=2):
    model = small_vit(scale=0.3)
    x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return dense.patch_features(model, x)[0]  # (B, 8, 8, 48)


def planted(model):
    gw = model.cfg.grid_size[1]
    model.pos_embed.data[0, model.num_prefix_tokens + PLANTED[0] * gw + PLANTED[1]] += 30.0
    return model


def pca_by_hand(x: np.ndarray, border: np.ndarray, threshold=0.5):
    """The DINOv2 recipe written out with scikit-learn: x (n, D), border (n,)."""
    c = PCA(n_components=1, svd_solver="full").fit_transform(x)[:, 0]
    s = (c - c.min()) / (c.max() - c.min())
    kept, flipped = (s[border] > threshold).sum(), ((1 - s[border]) > threshold).sum()
    if flipped < kept or (flipped == kept and s[border].mean() > 0.5):
        s = 1 - s  # the sign that leaves the border background (ties: its lower mean)
    fg = s > threshold
    second = PCA(n_components=3, svd_solver="full").fit(x[fg])
    proj = second.transform(x[fg])
    rgb = np.zeros((len(x), 3))
    rgb[fg] = (proj - proj.min(0)) / (proj.max(0) - proj.min(0))
    return rgb, fg, second.explained_variance_ratio_


# ------------------------------------------------------------------------------ features
def test_patch_features_are_timms_final_tokens_laid_on_the_grid():
    model = small_vit(scale=0.3, num_reg_tokens=2, img_size=(32, 48))
    x = torch.randn(2, 3, 32, 48)
    patches, prefix = dense.patch_features(model, x)
    with torch.no_grad():
        (theirs, their_prefix), = timm_twin(model).forward_intermediates(
            x, indices=[-1], norm=True, return_prefix_tokens=True, intermediates_only=True)
    assert patches.shape == (2, 8, 12, 48) and prefix.shape == (2, 3, 48)
    torch.testing.assert_close(patches, theirs.permute(0, 2, 3, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(prefix, their_prefix, atol=1e-5, rtol=0)


def test_a_cnn_has_no_patch_tokens():
    cnn = create_cnn("resnet18", 3, 32)
    with pytest.raises(ExplainError, match="CNN .*give a ViT checkpoint"):
        dense.patch_features(cnn, torch.randn(1, 3, 32, 32))


# ----------------------------------------------------------------------------------- PCA
def test_the_pca_picture_equals_scikit_learns_pca_applied_by_hand():
    f = features()
    got = dense.feature_pca(f, shared=True)
    x = f.reshape(-1, 48).double().numpy()
    border = np.tile(dense.border_mask((8, 8)).ravel(), 2)
    rgb, fg, explained = pca_by_hand(x, border)
    np.testing.assert_array_equal(got.foreground.reshape(-1), fg)
    np.testing.assert_allclose(got.rgb.reshape(-1, 3), rgb, atol=1e-5)
    np.testing.assert_allclose(got.explained, np.tile(explained, (2, 1)), rtol=1e-5)
    assert 0 < fg.mean() < 1 and got.rgb[~got.foreground].max() == 0  # background black
    assert got.rgb.min() == 0 and got.rgb.max() == pytest.approx(1)


def test_the_foreground_is_the_planted_object_whatever_sign_the_pca_gives():
    """Patches of a centred 4x4 "object" around one direction, the rest around another: the
    object is the foreground, for the features and for their negation (which flips the
    first component's sign)."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=32), rng.normal(size=32)
    obj = np.zeros((8, 8), bool)
    obj[2:6, 2:6] = True
    f = np.where(obj[..., None], a, b) + 0.05 * rng.normal(size=(8, 8, 32))
    for sign in (1, -1):
        got = dense.feature_pca(sign * f[None])
        np.testing.assert_array_equal(got.foreground[0], obj)
        assert got.first[0][obj].min() > 0.9 and got.first[0][~obj].max() < 0.1


def test_a_shared_basis_colours_the_same_features_alike_in_every_image():
    f = features(seed=1, b=1)[0]
    mirrored = f.flip(1)  # the same patches, columns reversed
    shared = dense.feature_pca(torch.stack([f, mirrored]), shared=True)
    alone = dense.feature_pca(f[None], shared=False)
    # the union is the same patches twice: the basis of one image alone, mirrored colours
    np.testing.assert_allclose(shared.rgb[1], shared.rgb[0][:, ::-1], atol=1e-5)
    np.testing.assert_allclose(shared.rgb[0], alone.rgb[0], atol=1e-5)
    other = features(seed=2, b=1)[0]
    together = dense.feature_pca(torch.stack([f, other]), shared=True)
    apart = dense.feature_pca(torch.stack([f, other]), shared=False)
    np.testing.assert_allclose(apart.rgb[0], alone.rgb[0], atol=1e-6)  # per image = alone
    np.testing.assert_allclose(apart.rgb[1], dense.feature_pca(other[None]).rgb[0], atol=1e-6)
    assert np.abs(together.rgb[0] - apart.rgb[0]).max() > 0.05  # another basis
    np.testing.assert_array_equal(together.explained[0], together.explained[1])
    assert not np.allclose(apart.explained[0], apart.explained[1])


def test_pca_options_and_their_errors():
    f = features(b=1)
    every = dense.feature_pca(f, threshold=None)
    assert every.foreground.all() and every.threshold is None
    x = f.reshape(-1, 48).double().numpy()
    proj = PCA(n_components=3, svd_solver="full").fit_transform(x)
    np.testing.assert_allclose(every.rgb.reshape(-1, 3),
                               (proj - proj.min(0)) / (proj.max(0) - proj.min(0)), atol=1e-5)
    with pytest.raises(ExplainError, match=r"threshold must be in \[0, 1\).*got 1.5"):
        dense.feature_pca(f, threshold=1.5)
    with pytest.raises(ExplainError, match=r"\(B, gh, gw, D\), got shape \(8, 8, 48\)"):
        dense.feature_pca(f[0])


# ---------------------------------------------------------------------------- similarity
def test_the_similarity_map_is_torchs_cosine_similarity_and_the_patch_itself_is_one():
    f = features()
    for row, col in [(0, 0), (3, 6), (7, 7)]:
        got = dense.patch_similarity(f, row, col)
        want = F.cosine_similarity(f[:, row, col][:, None, None, :], f, dim=-1)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(got[:, row, col], torch.ones(2), atol=1e-6, rtol=0)
    across = dense.patch_similarity(f[:1], 3, 6, other=f[1:])  # patch of image A over image B
    torch.testing.assert_close(across[0], F.cosine_similarity(f[0, 3, 6], f[1], dim=-1),
                               atol=1e-6, rtol=0)


def test_best_matches_are_the_argmax_of_the_cosine_between_every_pair():
    f = features()
    m = dense.best_matches(f[0], f[1])
    pairs = F.cosine_similarity(f[0].reshape(-1, 1, 48), f[1].reshape(1, -1, 48), dim=-1)
    score, j = pairs.max(dim=1)
    torch.testing.assert_close(m.similarity.reshape(-1), score, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(m.index.reshape(-1, 2).numpy(),
                                  np.stack([j // 8, j % 8], -1))
    back = pairs.argmax(dim=0)
    np.testing.assert_array_equal(m.mutual.reshape(-1).numpy(),
                                  (back[j] == torch.arange(64)).numpy())
    same = dense.best_matches(f[0], f[0])  # every patch matches itself, mutually
    assert same.mutual.all() and (same.index.reshape(-1, 2)[:, 0] * 8 +
                                  same.index.reshape(-1, 2)[:, 1] == torch.arange(64)).all()


def test_a_patch_outside_the_grid_is_refused_naming_the_grid():
    with pytest.raises(ExplainError, match=r"\(row 8, column 0\) is outside the 8x8 patch grid: "
                                           r"rows 0..7, columns 0..7"):
        dense.patch_similarity(features(), 8, 0)


# ----------------------------------------------------------------------------- artifacts
def test_a_planted_high_norm_token_is_marked_and_circled():
    clean = small_vit(scale=0.3)
    x = torch.randn(2, 3, 32, 32)
    assert not dense.artifact_mask(clean, x).any()
    model = planted(small_vit(scale=0.3))
    mask = dense.artifact_mask(model, x)
    assert mask.shape == (2, 8, 8) and mask.sum() == 2 and mask[:, PLANTED[0], PLANTED[1]].all()
    norms = stats.token_norms(model, x)[-1]  # what the doctor and the explorer read
    for b in range(2):
        assert stats.outlier_tokens(norms[b, 1:]).tolist() == [PLANTED[0] * 8 + PLANTED[1]]
    picture = np.zeros((32, 32, 3))
    fig = figure_pca(picture, np.zeros((8, 8, 3)), mask[0])
    for ax in fig.axes:  # circled on the image and on the PCA picture, at the patch's centre
        (circle,) = [p for p in ax.patches if isinstance(p, mpatches.Circle)]
        assert circle.center == pytest.approx((PLANTED[1] * 4 + 1.5, PLANTED[0] * 4 + 1.5))


# ------------------------------------------------------------------------------- command
def photo(path, seed, size=(40, 48)):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


def test_the_command_as_a_process(tmp_path):
    model = planted(small_vit(scale=0.3))
    ckpt = vitkit.save_model(model, tmp_path / "m.safetensors")
    a, b = photo(tmp_path / "a.png", 0), photo(tmp_path / "b.png", 1)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    bad = tmp_path / "bad.png"
    done = subprocess.run([sys.executable, "-m", "vitkit", "dense", str(a), str(bad), str(b),
                           "--checkpoint", str(ckpt), "--out", str(out), "--pca",
                           "--shared-basis", "--similar", "3,4", "--match", str(b)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bad.png: skipped: cannot read image" in done.stderr
    assert f"high-norm artifact tokens: 1: {PLANTED}" in done.stdout
    assert "(shared basis)" in done.stdout
    x = torch.stack([load_image(p, (32, 32))[0] for p in (a, b)])
    tokens = dense.patch_features(model, x)[0]
    want_pca = dense.feature_pca(tokens, shared=True)
    for k, stem in enumerate("ab"):
        def arr(name, stem=stem):
            return np.load(out / f"{stem}_{name}.npy")
        np.testing.assert_allclose(arr("tokens"), tokens[k], atol=1e-5)
        assert arr("prefix").shape == (1, 48)
        np.testing.assert_array_equal(np.argwhere(arr("artifacts")), [PLANTED])
        np.testing.assert_allclose(arr("pca"), want_pca.rgb[k], atol=1e-5)
        np.testing.assert_array_equal(arr("foreground"), want_pca.foreground[k])
        sim = F.cosine_similarity(tokens[k, 3, 4], tokens[k], dim=-1)
        np.testing.assert_allclose(arr("similar"), sim, atol=1e-5)
        assert arr("similar")[3, 4] == pytest.approx(1, abs=1e-5)
        np.testing.assert_allclose(arr("similar_match"),
                                   F.cosine_similarity(tokens[k, 3, 4], tokens[1], dim=-1),
                                   atol=1e-5)
        assert arr("match").shape == (8, 8, 2) and arr("match_similarity").shape == (8, 8)
        for picture in ("pca", "similar", "match"):
            with Image.open(out / f"{stem}_{picture}.png") as im:
                assert im.size[0] > 200 and im.getextrema() != ((255, 255),) * 3
    np.testing.assert_allclose(np.load(out / "b_match_similarity.npy"), 1, atol=1e-5)
    assert not list(out.glob("bad*"))


def test_img_size_moves_a_table_and_runs_a_rotary_model_natively(tmp_path, capsys):
    a = photo(tmp_path / "a.png", 0, size=(64, 64))
    for name, model, size in [("abs", small_vit(scale=0.3), 64),
                              ("rope", small_vit(scale=0.3, rope="axial", abs_pos=False), 48)]:
        ckpt = vitkit.save_model(model, tmp_path / f"{name}.safetensors")
        assert cli.main(["dense", str(a), "--checkpoint", str(ckpt), "--out",
                         str(tmp_path / name), "--img-size", str(size)]) == 0
        moved = vitkit.load_model(ckpt, img_size=size, verbose=False)
        want = dense.patch_features(moved, load_image(a, (size, size))[0][None])[0][0]
        got = np.load(tmp_path / name / "a_tokens.npy")
        assert got.shape == (size // 4, size // 4, 48)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert (tmp_path / name / "a_pca.png").exists()  # --pca implied
    # the rotary model has no table: its features at 48 are its own forward at 48, unchanged
    rope = vitkit.load_model(tmp_path / "rope.safetensors", verbose=False)
    with torch.no_grad():
        native = rope.forward_features(load_image(a, (48, 48))[0][None])[0, 1:]
    np.testing.assert_allclose(np.load(tmp_path / "rope" / "a_tokens.npy").reshape(-1, 48),
                               native, atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--similar", "8,0"], "outside the 8x8 patch grid"),
    (["--match", "missing.png"], "missing.png"),
    (["--img-size", "30"], "not divisible by patch size 4"),
])
def test_the_commands_mistakes_are_one_message_and_exit_2(tmp_path, capsys, args, message):
    ckpt = vitkit.save_model(small_vit(scale=0.3), tmp_path / "m.safetensors")
    a = photo(tmp_path / "a.png", 0)
    code = cli.main(["dense", str(a), "--checkpoint", str(ckpt), "--out", str(tmp_path / "o"),
                     *[str(tmp_path / w) if w.endswith(".png") else w for w in args]])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "a_tokens.npy").exists()


def test_no_readable_image_is_exit_2(tmp_path, capsys):
    ckpt = vitkit.save_model(small_vit(scale=0.3), tmp_path / "m.safetensors")
    (tmp_path / "bad.png").write_bytes(b"")
    assert cli.main(["dense", str(tmp_path / "bad.png"), "--checkpoint", str(ckpt), "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.png: skipped" in err and "none of the 1 images could be read" in err
    with pytest.raises(SystemExit):
        cli.main(["dense", "x.png", "--checkpoint", str(ckpt), "--out", "o", "--similar", "3"])
    assert "expected a patch as ROW,COL" in capsys.readouterr().err
