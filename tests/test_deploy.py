"""ONNX export (vitkit.deploy), checked by onnxruntime: one file per model for every batch size
and resolution, the attention maps as an output, the metadata eval and predict read back."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.deploy import export_onnx
from vitkit.deploy.onnx_export import ExportGraph

from peers import perturb

SMALL = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5)
# name -> (registered model, options): every family vitkit builds, at a test's size
FAMILIES = {
    "vit, [CLS]": ("vit_micro_patch4_32", dict(img_size=16)),
    "vit, average pool": ("vit_micro_patch4_32", dict(img_size=16, pool="avg",
                                                       class_token=False, fc_norm=True)),
    "deit, distillation token": ("vit_micro_patch4_32", dict(img_size=16, distilled=True)),
    "dinov2": ("vit_small_patch14_dinov2", dict(img_size=56)),
    "dinov2, registers": ("vit_small_patch14_reg4_dinov2", dict(img_size=56)),
    "clip": ("vit_base_patch32_clip_quickgelu_224", dict(img_size=64)),
    "siglip, MAP head": ("vit_base_patch16_siglip_224", dict(img_size=32)),
}
TOL = 1e-4


def _model(family):
    name, options = FAMILIES[family]
    model = vitkit.create_model(name, **{**SMALL, **options})
    return perturb(model, scale=0.05)


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each family exported once, with its attention outputs."""
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for family in FAMILIES:
        model = _model(family)
        out[family] = (model, export_onnx(model, root / f"{len(out)}.onnx", attention=True))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_onnxruntime_gives_vitkits_logits_and_maps_at_any_batch_and_size(exported, family):
    model, path = exported[family]
    session = _session(path)
    p = model.cfg.patch_size
    h, w = model.cfg.img_size
    model.cfg.dynamic_img_size = True  # vitkit's own forward at the other sizes
    for batch, size in ((1, (h, w)), (3, (h, w)), (2, (h + 2 * p, w + p))):
        x = torch.randn(batch, 3, *size)
        with torch.no_grad():
            want, maps = model(x, return_attn=True)
        logits, attentions = session.run(None, {"pixel_values": x.numpy()})
        assert logits.shape == (batch, 5)
        assert np.abs(logits - want.numpy()).max() < TOL, (family, batch, size)
        grid = (size[0] // p) * (size[1] // p)
        assert attentions.shape == (batch, 2, 4, model.cfg.num_prefix_tokens + grid,
                                    model.cfg.num_prefix_tokens + grid)
        for layer, m in enumerate(maps):
            assert np.abs(attentions[:, layer] - m.numpy()).max() < 1e-5


def test_the_position_table_is_interpolated_inside_the_graph(exported):
    """No shape is fixed: the file has symbolic batch, height and width, and its Resize is
    the antialiased bicubic of DINOv2 with registers (pos_antialias) or plain bicubic."""
    for family, antialias in (("dinov2, registers", 1), ("vit, [CLS]", 0)):
        model, path = exported[family]
        assert model.cfg.pos_antialias == bool(antialias)
        proto = onnx.load(str(path))
        dims = [d.dim_param or d.dim_value for d in
                proto.graph.input[0].type.tensor_type.shape.dim]
        assert isinstance(dims[0], str) and isinstance(dims[2], str) and isinstance(dims[3], str)
        resize = [n for n in proto.graph.node if n.op_type == "Resize"]
        assert resize, family
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in resize[0].attribute}
        assert attrs["mode"] == b"cubic" and attrs.get("antialias", 0) == antialias


def test_the_graph_is_vitkits_forward(exported):
    """ExportGraph (what is traced) equals the model's forward, in torch, at another size."""
    model, _ = exported["dinov2, registers"]
    x = torch.randn(2, 3, 70, 42)
    with torch.no_grad():
        assert (ExportGraph(model)(x) - model(x)).abs().max() < 1e-5


def test_the_metadata_says_how_to_preprocess(tmp_path):
    model = vitkit.create_model("vit_micro_patch4_32", img_size=16, num_classes=3)
    model.cfg.extra.update(class_names=["ant", "bee", "cat"], mean=[0.1, 0.2, 0.3],
                           std=[0.4, 0.5, 0.6])
    path = vitkit.export(model, tmp_path / "m.onnx", to="onnx")
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(meta["vitkit.class_names"]) == ["ant", "bee", "cat"]
    assert json.loads(meta["vitkit.mean"]) == [0.1, 0.2, 0.3]
    assert json.loads(meta["vitkit.std"]) == [0.4, 0.5, 0.6]
    assert json.loads(meta["vitkit.img_size"]) == [16, 16] and meta["vitkit.patch_size"] == "4"
    assert json.loads(meta["vitkit.outputs"]) == ["logits"]
    assert len(_session(path).get_outputs()) == 1
    assert json.loads(meta["vitkit.config"])["embed_dim"] == model.cfg.embed_dim


def test_a_cnn_exports_and_attention_is_refused_for_it(tmp_path, capsys):
    from vitkit.models.cnn import create_cnn
    cnn = perturb(create_cnn("resnet18_w16", 4, 32))
    path = export_onnx(cnn, tmp_path / "cnn.onnx")
    x = torch.randn(2, 3, 40, 48)
    with torch.no_grad():
        want = cnn(x)
    (got,) = _session(path).run(None, {"pixel_values": x.numpy()})
    assert np.abs(got - want.numpy()).max() < TOL
    vitkit.save_model(cnn, tmp_path / "cnn.safetensors")
    dst = tmp_path / "a.onnx"
    assert main(["convert", str(tmp_path / "cnn.safetensors"), str(dst), "--to", "onnx",
                 "--attention"]) == 2
    assert "no attention maps" in capsys.readouterr().err and not dst.exists()


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    model = perturb(vitkit.create_model("vit_micro_patch4_32", img_size=16, num_classes=10),
                    scale=0.05)
    model.cfg.extra.update(class_names=[str(i) for i in range(10)])
    ckpt = vitkit.save_model(model, root / "m.safetensors")
    assert main(["convert", str(ckpt), str(root / "m.onnx"), "--to", "onnx"]) == 0
    return root


def test_eval_and_predict_read_the_onnx_file_as_they_read_the_checkpoint(digits_model,
                                                                           tmp_path):
    from PIL import Image
    from sklearn.datasets import load_digits

    from vitkit.train.evaluate import evaluate_checkpoint, predict
    a = evaluate_checkpoint(digits_model / "m.safetensors", "digits")
    b = evaluate_checkpoint(digits_model / "m.onnx", "digits")
    assert a["images"] == b["images"] and a["top1"] == pytest.approx(b["top1"], abs=1e-9)
    assert a["confusion"] == b["confusion"]
    images = load_digits().images[:5]
    for i, img in enumerate(images):
        Image.fromarray((img * 255 / 16).astype("uint8")).save(tmp_path / f"{i}.png")
    ours = predict(digits_model / "m.safetensors", [tmp_path], top_k=3)
    theirs = predict(digits_model / "m.onnx", [tmp_path], top_k=3)
    for r, s in zip(ours, theirs, strict=True):
        assert [t["class"] for t in r["top"]] == [t["class"] for t in s["top"]]
        for t, u in zip(r["top"], s["top"], strict=True):
            assert t["probability"] == pytest.approx(u["probability"], abs=1e-5)


def test_an_onnx_file_that_is_not_one_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a graph")
    assert main(["eval", str(bad), "--data", "digits"]) == 2
    assert "is not an ONNX model" in capsys.readouterr().err
    # a valid graph without vitkit's metadata: its preprocessing is unknown
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 10])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])])
    plain = tmp_path / "plain.onnx"
    onnx.save(onnx.helper.make_model(graph, ir_version=10,
                                     opset_imports=[onnx.helper.make_opsetid("", 18)]),
              str(plain))
    assert main(["eval", str(plain), "--data", "digits"]) == 2
    assert "no vitkit metadata" in capsys.readouterr().err
    future = tmp_path / "future.onnx"  # an opset this onnxruntime does not know
    onnx.save(onnx.helper.make_model(graph, ir_version=10,
                                     opset_imports=[onnx.helper.make_opsetid("", 99)]),
              str(future))
    assert main(["eval", str(future), "--data", "digits"]) == 2
    assert "cannot run" in capsys.readouterr().err


def test_onnx_only_options_are_refused_for_checkpoint_layouts(digits_model, tmp_path, capsys):
    dst = tmp_path / "x.safetensors"
    assert main(["convert", str(digits_model / "m.safetensors"), str(dst), "--attention"]) == 2
    assert "apply to --to onnx only" in capsys.readouterr().err and not dst.exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_quantizes_and_keeps_its_function(exported, family, tmp_path):
    """Each family's file through `vitkit quantize`'s library (static, calibrated on digits):
    the int8 file runs in onnxruntime and its logits stay close to the float ones (its
    attention output is carried along in float)."""
    from vitkit.data.datasets import load_split
    from vitkit.deploy.quantize import _loader, quantize
    from vitkit.deploy.runtime import OnnxModel

    src = exported[family][1]
    report = quantize(src, tmp_path / "q.onnx", "digits:0-4", eval_images=40,
                      calibration_images=16, budget=0.99, say=lambda _: None)
    assert report.written and report.quantized > 0
    cfg = OnnxModel(src).cfg  # images as calibrated: digits, preprocessed from the metadata
    x = next(iter(_loader(load_split("digits:0-4", "val", cfg.img_size[0]), cfg.img_size,
                          cfg.extra["mean"], cfg.extra["std"], 8)))[0]
    ref, int8 = OnnxModel(src)(x), OnnxModel(tmp_path / "q.onnx")(x)
    assert int8.shape == ref.shape
    assert (int8 - ref).norm() / ref.norm() < 0.1  # int8 rounding, not another function
