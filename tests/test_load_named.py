"""``load_model(path, model=NAME)`` and ``--model NAME``: a bare timm state dict of any registered
family loads exactly when its name is given (timm's outputs), a name that does not fit is refused
with the mismatch named, every config override reaches the model, and every registered name
with a timm counterpart accepts timm's own state dict."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.layers import resample_abs_pos_embed

import vitkit
from vitkit.checkpoints import io, timm_eva
from vitkit.checkpoints.common import Checkpoint
from vitkit.cli import main
from vitkit.data.images import load_image, preprocessing
from vitkit.errors import CheckpointError, ModelError
from vitkit.models.registry import MODEL_ARGS

from peers import max_diff, perturb

TOL = 1e-5


def sharpened(model, factor: float = 4.0):
    """Perturbed weights with peaked attention (q and k scaled up): near-uniform attention would
    hide a model that dropped its rotary embeddings or read its registers wrong."""
    perturb(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.qkv.weight", "attn.q_proj.weight", "attn.k_proj.weight")):
                p.mul_(factor)
    return model.eval()


def close(ours, theirs) -> bool:
    """Equal to 1e-5 of the output's scale (float32 kernels differ in the last bits)."""
    return ours.shape == theirs.shape and \
        max_diff(ours, theirs) < TOL * max(1.0, theirs.abs().max().item())


def bare(tmp_path, name, **kw):
    """timm's ``name`` (random, sharpened weights) and its state dict saved as timm users do."""
    peer = sharpened(timm.create_model(name, pretrained=False, **kw))
    path = tmp_path / f"{name}.pth"
    torch.save(peer.state_dict(), path)
    return peer, path


def outputs(model, x):
    with torch.no_grad():
        return model(x), model.forward_features(x)


# (timm name, the same shape overrides on both sides, input side)
FAMILIES = [
    ("vit_small_patch16_dinov3", dict(depth=2), 256),
    ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=224), 224),
    ("eva02_tiny_patch14_224", dict(depth=2), 224),
    ("vit_base_patch16_siglip_224", dict(depth=1), 224),
    ("vit_small_patch16_224", dict(depth=2), 224),
]


@pytest.mark.parametrize(("name", "kw", "side"), FAMILIES)
def test_a_bare_timm_state_dict_loads_as_its_name_with_timms_outputs(tmp_path, name, kw, side):
    peer, path = bare(tmp_path, name, **kw)
    model = vitkit.load_model(path, model=name, verbose=False, **kw)
    assert model.cfg.rope == MODEL_ARGS[name].get("rope", "")
    assert model.load_record["model"] == name and model.cfg.extra["name"] == name
    # the file cannot say its preprocessing: the name's pre-trained weights' (timm's)
    assert model.cfg.extra["mean"] == list(peer.pretrained_cfg["mean"])
    x = torch.randn(2, 3, side, side)
    for ours, theirs in zip(outputs(model, x), outputs(peer, x), strict=True):
        assert close(ours, theirs)


def test_without_the_name_the_same_dinov3_file_is_refused(tmp_path):
    _, path = bare(tmp_path, "vit_small_patch16_dinov3", depth=2)
    with pytest.raises(CheckpointError, match="do not say which rotary position embeddings"):
        vitkit.load_model(path)


@pytest.fixture(scope="module")
def dinov3_file(tmp_path_factory):
    _, path = bare(tmp_path_factory.mktemp("d3"), "vit_small_patch16_dinov3", depth=2)
    return path


@pytest.mark.parametrize(("wrong", "said"), [
    # the wrong width: the brief's example, with the name that fits
    ("vit_base_patch16_dinov3", ["vit_base_patch16_dinov3 has embed_dim=768",
                                 "the weights have embed_dim=384", "mlp_dim=1536",
                                 "did you mean vit_small_patch16_dinov3?"]),
    # absolute table vs rotary only, and no registers vs four
    ("vit_small_patch16_224", ["num_reg_tokens=0", "abs_pos=True", "num_reg_tokens=4",
                               "abs_pos=False", "init_values=None"]),
    # the same family with a query/value bias instead of none
    ("vit_small_patch16_dinov3_qkvb", ["qkv_bias=True", "key_bias=False", "qkv_bias=False"]),
    # all there but the depth
    ("vit_small_patch16_dinov3", ["vit_small_patch16_dinov3 has depth=12",
                                  "the weights have depth=2"]),
])
def test_a_name_that_does_not_fit_is_refused_naming_each_mismatch(dinov3_file, wrong, said):
    kw = {} if wrong == "vit_small_patch16_dinov3" else {"depth": 2}
    with pytest.raises(CheckpointError) as err:
        vitkit.load_model(dinov3_file, model=wrong, **kw)
    for part in said:
        assert part in str(err.value)


def test_a_wrong_register_count_is_refused(tmp_path):
    _, path = bare(tmp_path, "vit_small_patch14_reg4_dinov2", depth=2, img_size=224)
    with pytest.raises(CheckpointError, match=r"num_reg_tokens=0.*num_reg_tokens=4.*"
                                              r"did you mean vit_small_patch14_reg4_dinov2"):
        vitkit.load_model(path, model="vit_small_patch14_dinov2", depth=2, img_size=224)


def test_another_grid_than_the_names_is_refused_unless_an_img_size_is_given(tmp_path):
    peer, path = bare(tmp_path, "vit_small_patch16_224", depth=2, img_size=384)
    with pytest.raises(CheckpointError, match=r"built at 224x224 \(a 14x14 position table\), the "
                                              r"weights at 384x384 .*pass img_size=384"):
        vitkit.load_model(path, model="vit_small_patch16_224", depth=2)
    model = vitkit.load_model(path, model="vit_small_patch16_224", depth=2, img_size=384)
    x = torch.randn(1, 3, 384, 384)
    assert close(outputs(model, x)[0], outputs(peer, x)[0])


def test_unknown_names_and_options_are_vitkits_errors(dinov3_file):
    with pytest.raises(ModelError, match="unknown model 'vit_small_patch16_dinov4'.*Did you mean"):
        vitkit.load_model(dinov3_file, model="vit_small_patch16_dinov4")
    with pytest.raises(ModelError, match="unknown option 'drop_path'.*did you mean drop_path_rate"):
        vitkit.load_model(dinov3_file, model="vit_small_patch16_dinov3", drop_path=0.1)


def test_a_file_with_its_own_config_is_checked_against_the_name(tmp_path):
    """vitkit's format states its activation: a name that says otherwise is refused by it; the
    same weights bare take the name's."""
    made = perturb(vitkit.create_model("vit_base_patch32_clip_quickgelu_224", depth=1))
    vitkit.save_model(made, tmp_path / "own.safetensors")
    with pytest.raises(CheckpointError, match="the checkpoint's config says act='quick_gelu'"):
        vitkit.load_model(tmp_path / "own.safetensors", model="vit_base_patch32_clip_224",
                          depth=1)
    same = vitkit.load_model(tmp_path / "own.safetensors", depth=1,
                             model="vit_base_patch32_clip_quickgelu_224")
    x = torch.randn(1, 3, 224, 224)
    assert max_diff(outputs(same, x)[0], outputs(made, x)[0]) == 0
    torch.save(made.state_dict(), tmp_path / "bare.pth")
    gelu = vitkit.load_model(tmp_path / "bare.pth", model="vit_base_patch32_clip_224", depth=1)
    assert (gelu.cfg.act, gelu.num_classes) == ("gelu", 512)  # the weights' head is kept


def test_every_override_reaches_the_model(tmp_path, vitkit_log):
    peer, path = bare(tmp_path, "vit_small_patch16_224", depth=2, num_classes=5)
    model = vitkit.load_model(path, model="vit_small_patch16_224", depth=2, drop_path_rate=0.2,
                              dynamic_img_size=True, pos_antialias=True, attn_drop_rate=0.1)
    assert (model.cfg.drop_path_rate, model.cfg.dynamic_img_size, model.cfg.attn_drop_rate) == \
        (0.2, True, 0.1)
    assert model.blocks[-1].drop_path1.p == pytest.approx(0.2)  # reaches the blocks
    # dynamic_img_size: another input size resamples the table at run time, as timm's does
    dynamic = sharpened(timm.create_model("vit_small_patch16_224", depth=2, num_classes=5,
                                          dynamic_img_size=True))
    dynamic.load_state_dict(peer.state_dict())
    x = torch.randn(1, 3, 288, 320)
    assert close(outputs(model, x)[0], outputs(dynamic, x)[0])
    # img_size interpolates the table as timm's resample_abs_pos_embed (bicubic, no
    # antialias); num_classes re-heads
    moved = vitkit.load_model(path, model="vit_small_patch16_224", depth=2, img_size=288,
                              num_classes=3)
    assert moved.load_record["interpolated"] == [[14, 14], [18, 18]]
    assert moved.load_record["head_replaced"] == [5, 3] and moved.num_classes == 3
    at288 = timm.create_model("vit_small_patch16_224", depth=2, num_classes=5, img_size=288)
    state = dict(peer.state_dict())
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], (18, 18), (14, 14),
                                                num_prefix_tokens=1, antialias=False)
    at288.load_state_dict(state)
    x = torch.randn(1, 3, 288, 288)
    with torch.no_grad():
        assert close(moved.forward_features(x), at288.eval().forward_features(x))
    assert "position table interpolated from a 14x14 grid" in vitkit_log.text


def test_overrides_without_a_name_and_a_contradiction_refused_by_name(tmp_path):
    _, path = bare(tmp_path, "vit_small_patch16_224", depth=2)
    model = vitkit.load_model(path, drop_path_rate=0.1, dynamic_img_size=True, verbose=False)
    assert model.blocks[-1].drop_path2.p == pytest.approx(0.1) and model.cfg.dynamic_img_size
    for bad, said in (({"embed_dim": 768}, "embed_dim=768 contradicts the weights, which have "
                                           "embed_dim=384"),
                      ({"num_reg_tokens": 4}, "num_reg_tokens=4 contradicts the weights")):
        with pytest.raises(CheckpointError, match=said):
            vitkit.load_model(path, **bad)
        with pytest.raises(CheckpointError, match=f"{next(iter(bad))}=.*\\(asked\\)"):
            vitkit.load_model(path, model="vit_small_patch16_224", depth=2, **bad)


# ------------------------------------------------------------------------ every timm name
TIMM_NAMES = [n for n in sorted(MODEL_ARGS) if timm.is_model(n)]


def test_every_registered_name_accepts_timms_own_state_dict():
    """Each name with a timm counterpart (91 of them): timm's state dict, one block deep, read
    as a bare file is loaded into the name's model with every key and shape (on the meta device:
    the keys and shapes, no memory); it is refused without the name where the weights do not say
    the rotary embeddings."""
    assert len(TIMM_NAMES) > 80
    for name in TIMM_NAMES:
        with torch.device("meta"):
            peer = timm.create_model(name, depth=1, pretrained=False)
            ckpt = Checkpoint(dict(peer.state_dict()), None, Path(f"{name}.pth"))
            model = io.from_checkpoint(ckpt, model=name, options={"depth": 1}, verbose=False)
        assert model.load_record["missing"] == model.load_record["unexpected"] == []
        ours = {k: v.shape for k, v in model.state_dict().items()}
        assert ours == {k: v.shape for k, v in timm_eva.to_vitkit_keys(
            peer.state_dict()).items()}, name
        assert model.cfg.rope == MODEL_ARGS[name].get("rope", ""), name


# ------------------------------------------------------------------------ the command line
def vitkit_process(*args, cwd) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "vitkit", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_model_option_through_the_real_cli(tmp_path, capsys):
    name = "vit_tiny_patch16_dinov3_qkvb"  # timm's, full size: the CLI takes no depth option
    peer, path = bare(tmp_path, name, num_classes=3)
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), np.uint8)).save(
        image)
    runs = [vitkit_process("predict", path, image, "--model", name, "--out", "p.json",
                           cwd=tmp_path),
            vitkit_process("convert", path, "d3.safetensors", "--model", name, cwd=tmp_path)]
    for run in runs:  # the two commands side by side, as processes
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    top = json.loads((tmp_path / "p.json").read_text())[0]["top"]
    model = vitkit.load_model(path, model=name, verbose=False)
    x = load_image(image, *preprocessing(model))[0][None]
    with torch.no_grad():
        probs = peer(x).softmax(-1)[0]
    assert [t["probability"] for t in top] == pytest.approx(
        probs.sort(descending=True)[0].tolist(), abs=1e-5)
    again = vitkit.load_model(tmp_path / "d3.safetensors", verbose=False)  # no name needed now
    assert close(outputs(again, x)[0], outputs(peer, x)[0])
    # without the name, and with a wrong one: exit 2, one line, no traceback
    for extra, said in (([], "rotary position embeddings"),
                        (["--model", "vit_small_patch16_dinov3_qkvb"], "embed_dim=384")):
        assert main(["predict", str(path), str(image), *extra]) == 2
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and said in lines[0] and "Traceback" not in err
    assert "where the weights have embed_dim=192" in lines[0]
    assert f"did you mean {name}?" in lines[0]


def test_audit_of_a_backbone_says_to_train_a_probe(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=0),
                      tmp_path / "backbone.safetensors")
    assert main(["audit", "--checkpoint", "backbone.safetensors", "--data",
                 "cluttered-digits", "--out", "audit"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a backbone without a classification head" in err
    assert "vitkit train --init backbone.safetensors --freeze backbone --data cluttered-digits" \
        in err
    assert "vitkit audit --checkpoint runs/probe/best.safetensors" in err
    assert not (tmp_path / "audit").exists()
