"""int8 with onnxruntime (vitkit.deploy.quantize): a planted activation outlier that naive
int8 breaks is found by the sensitivity search and kept in float; an unmeetable budget writes
nothing (to come: its test and the command)."""

import torch
from doctor_catalogue import TRAINED

import vitkit
from vitkit.deploy import export_onnx
from vitkit.deploy.quantize import quantize
from vitkit.deploy.runtime import OnnxModel


def _planted(blocks):
    """The trained digits ViT with a channel of V scaled 1000x in ``blocks`` and proj's input
    column scaled back: the same function in float, an outlier int8 cannot hold."""
    model = vitkit.load_model(TRAINED, verbose=False).eval()
    d = model.cfg.embed_dim
    with torch.no_grad():
        for k in blocks:
            attn = model.blocks[k].attn
            attn.qkv.weight[2 * d + 5] *= 1000
            attn.qkv.bias[2 * d + 5] *= 1000
            attn.proj.weight[:, 5] /= 1000
    return model


def test_the_sensitivity_search_keeps_the_outlier_in_float(tmp_path):
    plain = vitkit.load_model(TRAINED, verbose=False).eval()
    model = _planted([0])
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - plain(x)).abs().max() < 1e-4  # float: the same model
    src = export_onnx(model, tmp_path / "m.onnx")
    lines = []
    report = quantize(src, tmp_path / "q.onnx", "digits", say=lines.append)
    assert "int8 top-1 0.1" in lines[1] or report.float_top1 - float(
        lines[1].split("int8 top-1 ")[1].split()[0]) > 0.5  # naive int8 breaks it
    assert report.written and report.loss <= 0.01
    assert 0 < len(report.kept_float) <= 4 < report.quantised
    assert OnnxModel(tmp_path / "q.onnx").metadata["vitkit.int8"]

