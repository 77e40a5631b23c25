"""Masked-image pre-training (models/mae.py, ``vitkit train --objective mae``): the loss falls on
a tiny run, the decoder is dropped from the checkpoint, and fine-tuning starts from the encoder."""

import json

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.models.keys import state_keys
from vitkit.models.mae import MaskedAutoencoder, patchify, sincos_table
from vitkit.train.config import resolve
from vitkit.train.trainer import train


def test_patchify_is_unfold_in_row_major_order():
    x = torch.randn(2, 3, 8, 12)
    ours = patchify(x, 4)  # (B, N, P*P*C), each patch's pixels as (P, P, C)
    theirs = F.unfold(x, kernel_size=4, stride=4)  # (B, C*P*P, N), channel-major
    theirs = theirs.view(2, 3, 4, 4, -1).permute(0, 4, 2, 3, 1).reshape(2, -1, 48)
    assert ours.shape == (2, 6, 48) and torch.equal(ours, theirs)


def test_the_decoder_table_codes_rows_and_columns():
    table = sincos_table((3, 5), 16)
    assert table.shape == (15, 16)
    same_row = table.view(3, 5, 16)[1]  # the row half is equal along a row
    assert torch.allclose(same_row[:, :8], same_row[:1, :8].expand(5, -1))
    same_col = table.view(3, 5, 16)[:, 2]  # the column half is equal along a column
    assert torch.allclose(same_col[:, 8:], same_col[:1, 8:].expand(3, -1))
    assert torch.unique(table, dim=0).shape[0] == 15  # every position its own code


def test_the_encoder_sees_a_quarter_of_the_patches_and_only_hidden_ones_are_scored():
    enc = vitkit.create_model("vit_nano_patch4_32", img_size=16, num_classes=5)
    mae = MaskedAutoencoder(enc, mask_ratio=0.75).eval()
    seen = []
    enc.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    x = torch.randn(3, 3, 16, 16)
    first = mae(x)
    assert seen == [1 + 4]  # [CLS] and 4 of the 16 patches
    assert torch.equal(first, mae(x))  # eval masks come from a fixed seed
    # scored on the hidden patches only: with the decoder predicting 0, a patch of one colour
    # (normalised target 0) scores 0 and a varying one (P*P*C - 1)/(P*P*C); the loss is then
    # their share among the hidden patches, which the eval seed's permutation says
    torch.nn.init.zeros_(mae.decoder_pred.weight)
    torch.nn.init.zeros_(mae.decoder_pred.bias)
    varying = torch.zeros(3, 16, dtype=torch.bool)
    varying[:, ::3] = True
    varying[1, 1] = True
    images = torch.zeros(3, 3, 16, 16)
    for b, p in varying.nonzero().tolist():
        r, c = divmod(p, 4)
        images[b, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = torch.randn(3, 4, 4).sign()
    order = torch.rand(3, 16, generator=torch.Generator().manual_seed(0)).argsort(dim=1)
    hidden = torch.zeros(3, 16, dtype=torch.bool).scatter_(1, order[:, 4:], True)
    expected = (hidden & varying).sum() / hidden.sum() * 47 / 48
    assert mae(images).item() == pytest.approx(expected.item(), rel=1e-4)


def test_a_masked_autoencoder_refuses_what_it_cannot_mask():
    rope = vitkit.create_model("vit_small_patch16_dinov3", img_size=32, depth=1)
    with pytest.raises(ConfigError, match="rotary embeddings"):
        MaskedAutoencoder(rope)
    with pytest.raises(ConfigError, match="in \\(0, 1\\)"):
        MaskedAutoencoder(vitkit.create_model("vit_nano_patch4_32"), mask_ratio=1.0)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("mae")
    cfg = resolve(dict(objective="mae", model="vit_nano_patch4_32", data="digits:0-4@both",
                       img_size=16, epochs=4, batch_size=64, lr=2e-3, warmup_epochs=0.5,
                       holdout=0.1, patience=3, out=str(out), name="mae"))
    return train(cfg, progress=False)


def test_the_reconstruction_loss_falls_and_the_checkpoint_is_the_encoder(pretrained):
    history = pretrained.history
    assert history[-1]["train_loss"] < 0.9 * history[0]["train_loss"]
    assert min(r["val_loss"] for r in history) < history[0]["val_loss"]
    assert all(r["val_top1"] != r["val_top1"] for r in history)  # no top-1: NaN
    outcome = json.loads((pretrained.run_dir / "result.json").read_text())
    assert outcome["objective"] == "mae" and "test_top1" not in outcome
    assert outcome["best_val_loss"] == min(r["val_loss"] for r in history)
    from safetensors.torch import load_file

    saved = load_file(pretrained.run_dir / "best.safetensors")
    model = vitkit.load_model(pretrained.run_dir / "best.safetensors", verbose=False)
    assert set(saved) == set(state_keys(model.cfg))  # the encoder alone: no decoder key
    assert not any("decoder" in k or "mask_token" in k for k in saved)
    findings = json.loads((pretrained.run_dir / "doctor.json").read_text())["findings"]
    learning = next(f for f in findings if f["check"] == "run.learning")
    assert learning["level"] == "ok" and "reconstruction loss fell" in learning["summary"]


def test_fine_tuning_starts_from_the_pretrained_encoder(pretrained, tmp_path):
    init = pretrained.run_dir / "best.safetensors"
    encoder = vitkit.load_model(init, verbose=False)
    cfg = resolve(dict(init=str(init), data="digits:5-9", img_size=16, steps=1, epochs=1,
                       batch_size=32, lr=1e-9, warmup_epochs=0.0, out=str(tmp_path),
                       name="ft"))
    result = train(cfg, progress=False)
    tuned = vitkit.load_model(result.run_dir / "last.safetensors", verbose=False)
    # one step at lr 1e-9 leaves the blocks the encoder's: fine-tuning began from them
    for key in ("blocks.0.attn.qkv.weight", "pos_embed", "patch_embed.proj.weight"):
        assert torch.allclose(tuned.state_dict()[key], encoder.state_dict()[key], atol=1e-6)


@pytest.mark.parametrize("flags, message", [
    (["--objective", "mae", "--mixup", "0.8"], "--mixup mix or distil labels"),
    (["--objective", "mae", "--model", "resnet18"], "pre-trains a ViT; resnet18 is a CNN"),
    (["--objective", "contrastive"], "--objective must be classify or mae"),
    (["--objective", "mae", "--mask-ratio", "1.5"], "mask_ratio must be between 0 and 1"),
])
def test_bad_pretraining_options_are_named(tmp_path, capsys, flags, message):
    assert main(["train", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_without_patience_the_best_checkpoint_is_the_lowest_reconstruction_loss(tmp_path):
    """With no early stopping the best checkpoint is the epoch of the lowest validation loss,
    the first evaluation included: a reconstruction loss starts near 1 (per-patch normalised
    pixels), and a rule that began from a top-1 of -1 never saved a loss above 1."""
    cfg = resolve(dict(objective="mae", model="vit_nano_patch4_32", data="digits:0-4",
                       img_size=16, epochs=2, batch_size=64, lr=1e-9, warmup_epochs=0,
                       out=str(tmp_path), name="flat"))
    result = train(cfg, progress=False)
    losses = [r["val_loss"] for r in result.history]
    assert losses[0] > 1  # the case the old rule missed
    assert (tmp_path / "flat" / "best.safetensors").is_file(), losses
    assert result.best_top1 == pytest.approx(-min(losses))
