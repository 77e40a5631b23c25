"""Writing checkpoints: vitkit's own format, exports that the peers read back, `vitkit convert`
and `vitkit resize`."""

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision
import transformers
from safetensors import safe_open
from timm.models.vision_transformer import _load_weights

import vitkit
from vitkit import CheckpointError
from vitkit.cli import main
from vitkit.data.images import load_image

from peers import logits, max_diff, perturb


@pytest.fixture
def tiny():
    model = perturb(vitkit.create_model("vit_tiny_patch16_224", depth=3, num_classes=5))
    model.cfg.extra.update(mean=[0.1, 0.2, 0.3], std=[0.4, 0.5, 0.6],
                           class_names=["a", "b", "c", "d", "e"])
    return model




def test_vitkit_format_rebuilds_from_one_file(tiny, tmp_path, x224):
    path = vitkit.save_model(tiny, tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["vitkit_config"])
    assert meta["embed_dim"] == 192 and meta["depth"] == 3 and meta["patch_size"] == 16
    assert meta["extra"]["class_names"] == ["a", "b", "c", "d", "e"]
    loaded = vitkit.load_model(path)
    assert loaded.cfg.to_dict() == tiny.cfg.to_dict()
    assert max_diff(logits(loaded, x224), logits(tiny, x224)) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temp files left


@pytest.mark.parametrize(
    "kw", [dict(pool="avg", fc_norm=True), dict(num_reg_tokens=2, no_embed_class=True),
           dict(distilled=True), dict(representation_size=64, img_size=(224, 160))],
    ids=["gap", "registers", "distilled", "pre-logits-rect"],
)
def test_vitkit_format_keeps_every_architecture_option(kw, tmp_path):
    model = perturb(vitkit.create_model("vit_tiny_patch16_224", depth=2, **kw))
    loaded = vitkit.load_model(vitkit.save_model(model, tmp_path / "m.safetensors"))
    assert loaded.cfg.to_dict() == model.cfg.to_dict()
    xx = torch.randn(1, 3, *model.cfg.img_size)
    assert max_diff(logits(loaded, xx), logits(model, xx)) == 0


def test_save_refuses_other_suffixes_and_leaves_nothing_behind(tiny, tmp_path):
    with pytest.raises(CheckpointError, match="ending in .safetensors"):
        vitkit.save_model(tiny, tmp_path / "m.pth")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file(tiny, tmp_path, monkeypatch):
    path = vitkit.save_model(tiny, tmp_path / "m.safetensors")
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        vitkit.save_model(tiny, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


@pytest.mark.parametrize("dst", ["t.safetensors", "t.pth", "hub"])
def test_timm_export_loads_in_timm_and_round_trips(tiny, tmp_path, x224, dst):
    out = vitkit.export(tiny, tmp_path / dst, to="timm")
    peer = timm.create_model("vit_tiny_patch16_224", depth=3, num_classes=5).eval()
    if dst == "hub":
        config = json.loads((out / "config.json").read_text())
        assert config["model_args"]["depth"] == 3 and config["label_names"][0] == "a"
        peer = timm.create_model(config["architecture"], num_classes=config["num_classes"],
                                 **config["model_args"])
        timm.models.load_checkpoint(peer, str(out / "model.safetensors"))  # timm's own reader
    else:
        peer.load_state_dict(vitkit.checkpoints.read_checkpoint(out).state)
    assert max_diff(logits(peer.eval(), x224), logits(tiny, x224)) < 1e-5
    back = vitkit.load_model(out)
    for k, v in tiny.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_hf_export_loads_in_transformers_and_round_trips(tiny, tmp_path, x224):
    out = vitkit.export(tiny, tmp_path / "hf", to="hf")
    peer = transformers.ViTForImageClassification.from_pretrained(out).eval()
    assert peer.config.id2label[4] == "e"
    assert max_diff(logits(peer, x224), logits(tiny, x224)) < 1e-4
    back = vitkit.load_model(out)
    for k, v in tiny.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_hf_export_refuses_what_hf_vit_cannot_hold(tmp_path):
    model = vitkit.create_model("vit_nano_patch4_32", pool="avg")
    with pytest.raises(CheckpointError, match=r"cannot export to hf: the model pools by "
                                              r"average.*Formats that can hold it: vitkit, timm"):
        vitkit.export(model, tmp_path / "hf", to="hf")


def test_jax_export_is_read_by_timms_npz_loader(tiny, tmp_path, x224):
    out = vitkit.export(tiny, tmp_path / "m.npz", to="jax")
    peer = timm.create_model("vit_tiny_patch16_224", depth=3, num_classes=5).eval()
    _load_weights(peer, str(out))
    assert max_diff(logits(peer, x224), logits(tiny, x224)) < 1e-5


def test_hf_to_jax_keeps_the_layernorm_eps(tmp_path, x224):
    peer = perturb(transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        num_labels=3)))
    peer.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "m.npz"), "--to", "jax"]) == 0
    model = vitkit.load_model(tmp_path / "m.npz")
    assert model.cfg.norm_eps == 1e-12
    assert max_diff(logits(model, x224), logits(peer, x224)) < 1e-4


def test_torchvision_export_loads_in_torchvision(tiny, tmp_path, x224):
    out = vitkit.export(tiny, tmp_path / "tv.pth", to="torchvision")
    peer = torchvision.models.VisionTransformer(224, 16, 3, 3, 192, 768, num_classes=5).eval()
    peer.load_state_dict(torch.load(out, weights_only=True))
    assert max_diff(logits(peer, x224), logits(tiny, x224)) < 1e-4


def test_cli_convert_timm_to_hf_with_new_classes(tmp_path, capsys, x224):
    peer = perturb(timm.create_model("vit_tiny_patch16_224", depth=2))
    torch.save(peer.state_dict(), tmp_path / "t.pth")
    assert main(["convert", str(tmp_path / "t.pth"), str(tmp_path / "hf"), "--to", "hf",
                 "--num-classes", "3"]) == 0
    err = capsys.readouterr().err
    assert "head replaced" in err and "(hf)" in err
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        feats_peer = peer.forward_features(x224)[:, 0]
        feats_hf = hf.vit(x224).last_hidden_state[:, 0]
    assert hf.config.num_labels == 3 and max_diff(feats_hf, feats_peer) < 1e-4


def test_cli_resize_keeps_the_source_format(tmp_path, capsys):
    peer = perturb(timm.create_model("vit_tiny_patch16_224", depth=2))
    torch.save(peer.state_dict(), tmp_path / "t224.pth")
    assert main(["resize", str(tmp_path / "t224.pth"), str(tmp_path / "t384.pth"),
                 "--img-size", "384"]) == 0
    assert "14x14 grid (224x224) to 24x24 (384x384)" in capsys.readouterr().err
    state = torch.load(tmp_path / "t384.pth", weights_only=True)
    assert state["pos_embed"].shape == (1, 577, 192)
    peer384 = timm.create_model("vit_tiny_patch16_384", depth=2)
    peer384.load_state_dict(state)  # timm takes it as its own


def test_cli_resize_to_a_rectangle_and_errors(tmp_path, capsys):
    model = vitkit.create_model("vit_nano_patch4_32")
    vitkit.save_model(model, tmp_path / "n.safetensors")
    assert main(["resize", str(tmp_path / "n.safetensors"), str(tmp_path / "r.safetensors"),
                 "--img-size", "48x64"]) == 0
    assert vitkit.load_model(tmp_path / "r.safetensors").grid_size == (12, 16)
    assert main(["resize", str(tmp_path / "n.safetensors"), str(tmp_path / "bad.safetensors"),
                 "--img-size", "50"]) == 2
    assert "50x50 is not divisible by patch size 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["resize", "a", "b", "--img-size", "big"])
    assert np.all([not (tmp_path / "bad.safetensors").exists()])


# ------------------------------------------------------------------- what a layout cannot hold
@pytest.mark.parametrize(("to", "dst", "kw", "reason"), [
    ("jax", "m.npz", dict(qkv_bias=False), "has no qkv bias"),
    ("jax", "m.npz", dict(img_size=(32, 48)), "rectangular 32x48"),
    ("torchvision", "m.pth", dict(img_size=(32, 48)), "rectangular 32x48"),
    ("torchvision", "m.pth", dict(qkv_bias=False), "has no qkv bias"),
    ("torchvision", "m.pth", dict(norm_eps=1e-12), "eps 1e-12"),
    ("hf", "hf", dict(num_reg_tokens=2), "has register tokens"),
])
def test_every_exporter_states_its_refusals_and_writes_nothing(tmp_path, to, dst, kw, reason):
    model = vitkit.create_model("vit_nano_patch4_32", **kw)
    with pytest.raises(CheckpointError, match=rf"cannot export to {to}: the model .*{reason}.*"
                                              r"Formats that can hold it: vitkit, timm"):
        vitkit.export(model, tmp_path / dst, to=to)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("to", ["timm", "hf", "jax", "torchvision"])
def test_a_cnn_is_refused_by_every_vit_layout_with_what_it_can_be(tmp_path, to, capsys):
    from vitkit.models.cnn import create_cnn

    vitkit.save_model(create_cnn("resnet18", 3, 32), tmp_path / "cnn.safetensors")
    assert main(["convert", str(tmp_path / "cnn.safetensors"), str(tmp_path / "out"),
                 "--to", to]) == 2
    err = capsys.readouterr().err
    assert "is a CNN (resnet18); a CNN can be written as vitkit (.safetensors) only" in err
    assert "Formats that can hold it: vitkit." in err
    assert not (tmp_path / "out").exists()


def test_hf_pipeline_classifies_a_photo_like_vitkit(tmp_path):
    """A folder from --to hf is a complete Hugging Face model: pipeline() reads its
    preprocessor_config.json and gives vitkit's top-1 and probabilities on a real photograph."""
    import sklearn.datasets
    from PIL import Image

    photo = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"
    model = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=5), scale=0.3)
    model.cfg.extra.update(class_names=["a", "b", "c", "d", "e"], mean=[0.48, 0.46, 0.41],
                           std=[0.27, 0.26, 0.28])
    vitkit.export(model, tmp_path / "hf", to="hf")
    pipe = transformers.pipeline("image-classification", model=str(tmp_path / "hf"))
    theirs = pipe(Image.open(photo), top_k=5)
    x, _ = load_image(photo, (32, 32), model.cfg.extra["mean"], model.cfg.extra["std"])
    probs = logits(model, x[None]).softmax(-1)[0]
    ours = {model.cfg.extra["class_names"][i]: float(p) for i, p in enumerate(probs)}
    assert theirs[0]["label"] == max(ours, key=ours.get)
    for entry in theirs:
        assert abs(entry["score"] - ours[entry["label"]]) < 5e-3  # torchvision backend


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 708864 vs 708752"),
])
def test_a_full_disk_is_named_and_the_old_file_kept(tiny, tmp_path, monkeypatch, failure):
    path = vitkit.export(tiny, tmp_path / "m.pth", to="timm")
    before = path.read_bytes()

    def full(*args, **kwargs):
        raise failure

    monkeypatch.setattr("torch.save", full)
    with pytest.raises(vitkit.StorageError, match=r"no space left on the device while writing "
                                                  r".*m.pth; m.pth keeps its previous content"):
        vitkit.export(tiny, path, to="timm")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.pth"]
