"""``vitkit features`` and ``vitkit.backbone.extract``: the stored arrays equal timm's model on
the same weights (pooled pre-logits, [CLS], prefix and patch tokens, intermediate layers, at
another resolution), the shards round-trip (a strided [CLS] view included), a resume redoes
only the missing shard, a folder of another model, preprocessing or --what is refused, a
folder a live process writes is refused, and two torchrun ranks equal one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

import vitkit
from vitkit.backbone import extract, read_features
from vitkit.backbone import shards as shards_module
from vitkit.backbone.features import parse_layers
from vitkit.backbone.shards import LOCK, run, write_shard
from vitkit.cli import main
from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess
from vitkit.errors import ConfigError, DataError

from peers import perturb

VITKIT = str(Path(sys.executable).with_name("vitkit"))


def cli(*args, env=None):
    return subprocess.run([VITKIT, "features", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    """A tiny random 10-class ViT with perturbed weights, saved; and a second one."""
    folder = tmp_path_factory.mktemp("nano")
    torch.manual_seed(0)
    model = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10))
    vitkit.save_model(model, folder / "a.safetensors")
    other = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10), scale=0.03)
    vitkit.save_model(other, folder / "b.safetensors")
    return folder / "a.safetensors", folder / "b.safetensors"


def timm_peer(model, img_size=32):
    """timm's VisionTransformer with ``model``'s weights (its position table resampled by
    timm's own resampler for another size)."""
    import timm.models.vision_transformer as tv
    from timm.layers import resample_abs_pos_embed

    c = model.cfg
    peer = tv.VisionTransformer(img_size=img_size, patch_size=c.patch_size,
                                embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads,
                                mlp_ratio=c.mlp_dim / c.embed_dim, num_classes=c.num_classes,
                                reg_tokens=c.num_reg_tokens, class_token=c.class_token,
                                global_pool="token" if c.pool == "cls" else "avg")
    state = dict(model.state_dict())
    if img_size != c.img_size[0]:
        state["pos_embed"] = resample_abs_pos_embed(
            state["pos_embed"], (img_size // c.patch_size,) * 2,
            num_prefix_tokens=c.num_prefix_tokens, antialias=c.pos_antialias)
    peer.load_state_dict(state)
    return peer.eval()


def _pixels(split, size):
    pre = Preprocess(size)
    return torch.stack([pre(split[i][0]) for i in range(len(split))])


def test_every_array_equals_timm_on_the_same_weights():
    torch.manual_seed(1)
    model = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10, num_reg_tokens=2))
    split = load_split("digits", "val", 32)
    split.images, split.labels = split.images[:24], split.labels[:24]
    got = extract(model, split, what="cls,prefix,patch", batch_size=10)
    peer = timm_peer(model)
    with torch.no_grad():
        tokens = peer.forward_features(_pixels(split, 32))
        pooled = peer.forward_head(tokens, pre_logits=True)
    want = {"pooled": pooled, "cls": tokens[:, 0], "prefix": tokens[:, :3],
            "patch": tokens[:, 3:]}
    assert sorted(got) == sorted([*want, "index", "label"])
    for key, value in want.items():
        torch.testing.assert_close(torch.from_numpy(got[key]), value, atol=2e-5, rtol=0)
    assert got["index"].tolist() == list(range(24)) and got["label"].tolist() == split.labels
    # a loader of preprocessed batches gives the same
    batches = [(_pixels(split, 32)[i:i + 8], torch.tensor(split.labels[i:i + 8]))
               for i in range(0, 24, 8)]
    again = extract(model, batches)
    np.testing.assert_allclose(again["pooled"], got["pooled"], atol=1e-6)


def test_layers_are_stored_in_block_order_and_equal_the_blocks_outputs(tmp_path):
    torch.manual_seed(2)
    model = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10))
    assert parse_layers("2,0,-4,-1", 4) == (0, 2, 3)  # sorted, -4 is block 0: each once
    split = load_split("digits", "val", 32)
    split.images, split.labels = split.images[:12], split.labels[:12]
    got = extract(model, split, layers="2,0,-4,-1")
    assert sorted(k for k in got if k.startswith("layer")) == ["layer0", "layer2", "layer3"]
    peer, x = timm_peer(model), _pixels(split, 32)
    outputs = {}  # each timm block's own output (B, T, D), caught by a hook
    hooks = [peer.blocks[i].register_forward_hook(
        lambda m, args, out, i=i: outputs.__setitem__(i, out)) for i in (0, 2, 3)]
    with torch.no_grad():
        pooled = peer.forward_head(peer.forward_features(x), pre_logits=True)
        want = peer.forward_intermediates(x, indices=[0, 2, 3], output_fmt="NLC",
                                          intermediates_only=True)
    for h in hooks:
        h.remove()
    for i, value in zip((0, 2, 3), want, strict=True):
        block = outputs[i][:, 1:]  # the patch tokens, [CLS] split off
        torch.testing.assert_close(torch.from_numpy(got[f"layer{i}"]), block, atol=2e-5, rtol=0)
        torch.testing.assert_close(value, block, atol=1e-6, rtol=0)
    assert (outputs[0] - outputs[2]).abs().max() > 0.1  # a swapped label would show
    torch.testing.assert_close(torch.from_numpy(got["pooled"]), pooled, atol=2e-5, rtol=0)
    path = tmp_path / "m.safetensors"
    vitkit.save_model(model, path)
    manifest = run(path, "digits", tmp_path / "f", layers="2,0,-4,-1", limit=12,
                   say=lambda line: None)
    assert manifest["layers"] == [0, 2, 3]
    assert manifest["stored"]["layer0"]["shape"] == manifest["stored"]["layer3"]["shape"] == [
        12, 64, 64]
    stored, _ = read_features(tmp_path / "f", ["layer0", "layer2"])
    np.testing.assert_allclose(stored["layer0"], got["layer0"], atol=1e-6)
    np.testing.assert_allclose(stored["layer2"], got["layer2"], atol=1e-6)


def test_a_rotary_model_runs_natively_at_another_size(tmp_path):
    """DINOv3 (RoPE, no position table) at 96 pixels though built for 64: timm's numbers
    there, with attention peaked so that a wrong rotary table would show."""
    import timm

    torch.manual_seed(3)
    peer = perturb(timm.create_model("vit_small_patch16_dinov3", depth=2, embed_dim=128,
                                     num_heads=4, img_size=64, dynamic_img_size=True))
    with torch.no_grad():
        for name, p in peer.named_parameters():
            if name.endswith("attn.qkv.weight"):
                p[: 2 * p.shape[1]].mul_(8.0)
    peer.eval()
    hub = tmp_path / "hub"
    hub.mkdir()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps({
        "architecture": "vit_small_patch16_dinov3", "num_classes": peer.num_classes,
        "model_args": {"depth": 2, "embed_dim": 128, "num_heads": 4, "img_size": 64,
                       "dynamic_img_size": True},
        "pretrained_cfg": {"input_size": [3, 64, 64]}}))
    manifest = run(hub, "digits", tmp_path / "f", img_size=96, what="patch,prefix", limit=6,
                   say=lambda line: None)
    assert manifest["preprocessing"]["img_size"] == [96, 96]
    assert vitkit.load_model(hub, verbose=False).pos_embed is None  # nothing to interpolate
    arrays, _ = read_features(tmp_path / "f")
    split = load_split("digits", "val", 96)
    pre = manifest["preprocessing"]
    x = torch.stack([Preprocess(96, pre["mean"], pre["std"])(split[i][0]) for i in range(6)])
    with torch.no_grad():
        tokens = peer.forward_features(x)  # (6, 5 + 36, 128)
        pooled = peer.forward_head(tokens, pre_logits=True)
    assert arrays["patch"].shape == (6, 36, 128) and arrays["prefix"].shape == (6, 5, 128)
    torch.testing.assert_close(torch.from_numpy(arrays["patch"]), tokens[:, 5:], atol=1e-4,
                               rtol=0)
    torch.testing.assert_close(torch.from_numpy(arrays["prefix"]), tokens[:, :5], atol=1e-4,
                               rtol=0)
    torch.testing.assert_close(torch.from_numpy(arrays["pooled"]), pooled, atol=1e-4, rtol=0)


def test_another_resolution_interpolates_the_table_as_timm_does(nano, tmp_path):
    out = tmp_path / "f48"
    manifest = run(nano[0], "digits", out, img_size=48, what="patch", limit=16,
                   say=lambda line: None)
    assert manifest["preprocessing"]["img_size"] == [48, 48]
    arrays, _ = read_features(out)
    assert arrays["patch"].shape == (16, 144, 64)
    split = load_split("digits", "val", 48)
    split.images, split.labels = split.images[:16], split.labels[:16]
    model = vitkit.load_model(nano[0], verbose=False)
    with torch.no_grad():
        pooled = timm_peer(model, 48).forward_head(
            timm_peer(model, 48).forward_features(_pixels(split, 48)), pre_logits=True)
    torch.testing.assert_close(torch.from_numpy(arrays["pooled"]), pooled, atol=2e-5, rtol=0)
    # a dynamic-size model takes the size as it is: the same numbers as its own forward
    dyn = vitkit.create_model("vit_nano_patch4_32", num_classes=10, dynamic_img_size=True)
    got = extract(dyn, split, img_size=48)
    with torch.no_grad():
        want = dyn.forward_head(dyn.forward_features(_pixels(split, 48)), pre_logits=True)
    torch.testing.assert_close(torch.from_numpy(got["pooled"]), want, atol=1e-6, rtol=0)
    assert dyn.cfg.img_size == (32, 32)


def test_a_strided_cls_view_round_trips_through_a_shard(tmp_path):
    tokens = np.random.default_rng(0).standard_normal((5, 7, 4)).astype(np.float32)
    view = tokens[:, 0]  # not contiguous: safetensors' numpy writer would scramble it
    assert not view.flags["C_CONTIGUOUS"]
    write_shard(tmp_path, 0, {"cls": view, "patch": tokens[:, 1:],
                              "index": np.arange(5), "label": np.zeros(5, np.int64)}, {})
    back = load_file(str(tmp_path / "features-00000.safetensors"))
    np.testing.assert_array_equal(back["cls"], tokens[:, 0])
    np.testing.assert_array_equal(back["patch"], tokens[:, 1:])


def test_what_a_model_cannot_give_is_refused():
    gap = vitkit.create_model("vit_nano_patch4_32", num_classes=10, class_token=False,
                              pool="avg")
    split = load_split("digits", "val", 32)
    with pytest.raises(ConfigError, match=r"no \[CLS\] token .* ask for pooled"):
        extract(gap, split, what="cls")
    with pytest.raises(ConfigError, match="no prefix token"):
        extract(gap, split, what="prefix")
    with pytest.raises(ConfigError, match="valid: -4..3"):
        extract(gap, split, layers="4")
    with pytest.raises(ConfigError, match="--what takes"):
        extract(gap, split, what="cls,tokens")


def _arrays(folder):
    arrays, manifest = read_features(folder)
    return arrays, manifest


ARGS = ["--data", "digits", "--split", "train", "--limit", "200", "--shard-size", "64",
        "--batch-size", "32", "--what", "cls"]


@pytest.fixture(scope="module")
def written(nano, tmp_path_factory):
    """The same features written by one process (in this one, through the CLI's entry point)
    and by two torchrun ranks (gloo)."""
    folder = tmp_path_factory.mktemp("written")
    assert main(["features", str(nano[0]), *ARGS, "--out", str(folder / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "-m", "vitkit.cli", "features", str(nano[0]), *ARGS, "--out",
                          str(folder / "two")], capture_output=True, text=True, env=env)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("wrote ") == 1  # rank 0 writes, once
    assert "features: 200/200 images (100%)" in two.stderr and "images/s, ETA" in two.stderr
    return folder / "one", folder / "two"


def test_two_torchrun_ranks_equal_one_process(written):
    (a, ma), (b, mb) = _arrays(written[0]), _arrays(written[1])
    assert sorted(a) == ["cls", "index", "label", "pooled"]
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, rtol=0)
    assert ma["paths"] == mb["paths"] and ma["stored"] == mb["stored"]


def test_the_manifest_says_what_was_stored(written):
    arrays, manifest = _arrays(written[0])
    assert sorted(p.name for p in written[0].glob("features-*")) == [
        f"features-{s:05d}.safetensors" for s in range(4)]
    assert manifest["count"] == 200 and manifest["complete"] and manifest["shards"] == 4
    assert manifest["stored"] == {"pooled": {"shape": [200, 64], "dtype": "float32"},
                                  "cls": {"shape": [200, 64], "dtype": "float32"}}
    assert manifest["classes"] == [str(i) for i in range(10)]
    assert manifest["paths"][:2] == ["digits[train]#0", "digits[train]#1"]
    assert manifest["labels"] == arrays["label"].tolist() == load_split(
        "digits", "train", 32).labels[:200]
    assert manifest["model"]["name"] == "vit_nano_patch4_32"
    assert len(manifest["model"]["weights_sha256"]) == 64
    assert manifest["preprocessing"] == {"img_size": [32, 32], "mean": [0.5] * 3,
                                         "std": [0.5] * 3, "resize": manifest[
                                             "preprocessing"]["resize"]}
    np.testing.assert_array_equal(arrays["cls"], arrays["pooled"])  # a [CLS] model's pooling


def test_a_resume_redoes_only_the_missing_shard_and_other_options_are_refused(
        nano, written, capsys):
    out = written[1]
    before, _ = _arrays(out)
    # interrupted during the second shard: the manifest unfinished, the shard not there
    (out / "features-00001.safetensors").unlink()
    record = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**record, "complete": False}))
    with pytest.raises(DataError, match="unfinished"):
        read_features(out)
    args = [str(nano[0]), *ARGS, "--out", str(out)]
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming, 136 of 200 images already embedded" in again.stderr
    after, _ = _arrays(out)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    # another model, other options: refused through the command's entry point (exit 2)
    for extra, said in ((["CHECKPOINT", str(nano[1])], "another model (weights sha256"),
                        (["--what", "patch"], "other --what (['pooled', 'cls'] -> "
                                              "['pooled', 'patch'])"),
                        (["--img-size", "48"], "img_size [32, 32] -> [48, 48]"),
                        (["--limit", "100"], "images 200 -> 100")):
        changed = [*args]
        if extra[0] == "CHECKPOINT":
            changed[0] = extra[1]
        elif extra[0] in changed:
            changed[changed.index(extra[0]) + 1] = extra[1]
        else:
            changed += extra
        assert main(["features", *changed]) == 2
        err = capsys.readouterr().err
        assert said in err and "another --out" in err and "Traceback" not in err
    # a folder another live process writes: refused at once, naming it
    (out / LOCK).write_text(f"{os.getppid()} {os.uname().nodename}\n")
    assert main(["features", *args]) == 2
    err = capsys.readouterr().err
    assert "being written by another vitkit features" in err and str(os.getppid()) in err
    (out / LOCK).unlink()
    np.testing.assert_array_equal(_arrays(out)[0]["pooled"], before["pooled"])


def test_a_run_interrupted_mid_way_resumes_to_the_uninterrupted_arrays(
        nano, written, tmp_path, monkeypatch):
    """Ctrl-C while the third of four shards is embedded; the process then dies without
    releasing its lock (as a kill leaves it). The rerun takes the stale lock over, embeds the
    two missing shards only, and the folder equals the uninterrupted run's."""
    out = tmp_path / "f"
    options = dict(split="train", limit=200, shard_size=64, batch_size=32, what="cls",
                   say=lambda line: None)
    real, calls = shards_module.embed_rows, []

    def interrupted(*args, **kwargs):
        calls.append(kwargs)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(shards_module, "embed_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(nano[0], "digits", out, **options)
    assert sorted(p.name for p in out.glob("features-*")) == [
        "features-00000.safetensors", "features-00001.safetensors"]
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    with pytest.raises(DataError, match="unfinished"):
        read_features(out)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID whose process is gone: the lock a killed run leaves
    (out / LOCK).write_text(f"{gone.pid} {os.uname().nodename}\n")
    said, calls[:] = [], []
    monkeypatch.setattr(shards_module, "embed_rows", lambda *a, **k: calls.append(k) or real(
        *a, **k))
    manifest = run(nano[0], "digits", out, **{**options, "say": said.append})
    assert said[0] == f"features: resuming, 128 of 200 images already embedded in {out}"
    assert len(calls) == 2 and manifest["complete"] and not (out / LOCK).exists()
    resumed, whole = _arrays(out)[0], _arrays(written[0])[0]
    assert sorted(resumed) == sorted(whole)
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key])


def test_a_folder_of_images_with_a_broken_file(nano, tmp_path):
    split = load_split("digits", "val", 32)
    for i in range(6):
        folder = tmp_path / "imgs" / ("even" if i % 2 == 0 else "odd")
        folder.mkdir(parents=True, exist_ok=True)
        split[i][0].save(folder / f"{i}.png")
    (tmp_path / "imgs" / "odd" / "broken.png").write_bytes(b"\x89PNG not really")
    manifest = run(nano[0], str(tmp_path / "imgs"), tmp_path / "f", say=lambda line: None)
    assert manifest["count"] == 6 and manifest["classes"] == ["even", "odd"]
    assert [Path(s["path"]).name for s in manifest["skipped"]] == ["broken.png"]
    assert "cannot read" in manifest["skipped"][0]["error"]
    assert manifest["labels"] == [0, 0, 0, 1, 1, 1]


def test_a_bare_state_dict_named_by_model_runs_at_its_own_size(tmp_path):
    """A bare timm DINOv2-S state dict whose table is for 56 pixels (4x4 patches), named with
    --model and run at --img-size 56: timm's pooled embedding on timm's preprocessing (the
    name's ImageNet mean and std, which the bare file cannot say)."""
    import timm

    torch.manual_seed(4)
    peer = perturb(timm.create_model("vit_small_patch14_dinov2", img_size=56)).eval()
    torch.save(peer.state_dict(), tmp_path / "dinov2_s.pth")
    manifest = run(tmp_path / "dinov2_s.pth", "digits", tmp_path / "f", img_size=56, limit=4,
                   model_name="vit_small_patch14_dinov2", say=lambda line: None)
    pre = manifest["preprocessing"]
    assert pre["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert pre["std"] == pytest.approx([0.229, 0.224, 0.225])
    arrays, _ = read_features(tmp_path / "f")
    split = load_split("digits", "val", 56)
    x = torch.stack([Preprocess(56, pre["mean"], pre["std"])(split[i][0]) for i in range(4)])
    with torch.no_grad():
        pooled = peer.forward_head(peer.forward_features(x), pre_logits=True)
    torch.testing.assert_close(torch.from_numpy(arrays["pooled"]), pooled, atol=1e-4, rtol=0)
