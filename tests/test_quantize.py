"""int8 with onnxruntime (vitkit.deploy.quantize, vitkit quantize): a planted activation
outlier that naive int8 breaks is found by the sensitivity search and kept in float; the
command takes a checkpoint, reports both accuracies and writes a file eval reads; an
unmeetable budget and a calibration folder with no image are one message, exit 2, no file.
(Every family through the quantizer: tests/test_deploy.py, on its exported files.)"""

import pytest
import torch
from doctor_catalogue import TRAINED

import vitkit
from vitkit.cli import main
from vitkit.data.datasets import load_split
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
    assert 0 < len(report.kept_float) <= 4 < report.quantized
    assert OnnxModel(tmp_path / "q.onnx").metadata["vitkit.int8"]



def test_the_command_quantizes_a_checkpoint_and_eval_reads_the_result(tmp_path, capsys):
    out = tmp_path / "int8.onnx"
    assert main(["quantize", str(TRAINED), str(out), "--data", "digits"]) == 0
    printed = capsys.readouterr().out
    held = next(t for t in printed.splitlines() if "held-out images" in t)
    chosen = next(t for t in printed.splitlines() if t.startswith("chosen on"))
    n_held, n_chosen = int(held.split()[0]), int(chosen.split()[2])
    float_held = float(held.split("float top-1 ")[1].split(",")[0])
    int8_held = float(held.split("int8 top-1 ")[1].split()[0])
    float_chosen = float(chosen.split("float top-1 ")[1].split(",")[0])
    int8_chosen = float(chosen.split("int8 ")[1].split()[0])
    assert float_held > 0.7 and float_chosen - int8_chosen <= 0.01
    assert f"wrote {out}" in printed
    # the two halves are the whole split: `vitkit eval` of the written file and of the
    # checkpoint on every image is their weighted mean (the command scored what it wrote)
    from vitkit.train.evaluate import evaluate_checkpoint
    whole = n_held + n_chosen
    assert whole == len(load_split("digits", "val", 32))
    for path, on_held, on_chosen in ((out, int8_held, int8_chosen),
                                     (TRAINED, float_held, float_chosen)):
        assert evaluate_checkpoint(path, "digits")["top1"] == pytest.approx(
            (on_held * n_held + on_chosen * n_chosen) / whole, abs=1e-3)


def test_the_reported_top1_is_on_images_no_choice_saw():
    """Selection and held-out images are disjoint halves of the scored images, each with
    every class in about its share; the search scores only the selection half."""
    from vitkit.deploy.quantize import _halves

    split = load_split("digits", "val", 32)
    chosen, held = _halves(split, (32, 32), (0.5,) * 3, (0.5,) * 3, 0)
    a, b = set(chosen.dataset.indices), set(held.dataset.indices)
    assert not a & b and a | b == set(range(len(split))) and abs(len(a) - len(b)) <= 1
    labels = torch.tensor(split.labels)
    for half in (a, b):
        share = torch.bincount(labels[sorted(half)], minlength=10) / len(half)
        overall = torch.bincount(labels, minlength=10) / len(labels)
        assert (share - overall).abs().max() < 0.06
    few, rest = _halves(split, (32, 32), (0.5,) * 3, (0.5,) * 3, 100)
    assert len(few.dataset) + len(rest.dataset) == 100


def test_an_unmeetable_budget_writes_nothing(tmp_path, capsys):
    src = export_onnx(_planted(range(4)), tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    # no product may stay in float: the planted outlier costs more than the budget
    assert main(["quantize", str(src), str(out), "--data", "digits", "--max-float", "0"]) == 2
    err = capsys.readouterr().err
    assert "over the budget of 1" in err and "Nothing was written" in err
    assert not out.exists() and list(tmp_path.iterdir()) == [src]
    from vitkit.deploy.quantize import quantize
    from vitkit.errors import ConfigError, OverBudget

    with pytest.raises(OverBudget) as over:  # its own type, not a configuration mistake
        quantize(src, out, data="digits", max_float=0)
    assert not isinstance(over.value, ConfigError) and not out.exists()
    # told to, it writes the model and says it is over the budget
    assert main(["quantize", str(src), str(out), "--data", "digits", "--max-float", "0",
                 "--force"]) == 0
    assert "written because of --force" in capsys.readouterr().out and out.exists()


def test_a_calibration_folder_without_an_image_is_named(tmp_path, capsys):
    folder = tmp_path / "calib"
    folder.mkdir()
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "notes.txt").write_text("no images here")
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(TRAINED), str(out), "--data", "digits",
                 "--calibration", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no readable image" in err and "broken.png" in err and "Traceback" not in err
    assert not out.exists()
    for flags, said in [(["--calibration", str(tmp_path / "nowhere")], "no such folder"),
                        (["--calibration", str(folder), "--mode", "dynamic"],
                         "applies to --mode static"),
                        (["--calibration-images", "0"], "must be 1 or more")]:
        assert main(["quantize", str(TRAINED), str(out), "--data", "digits", *flags]) == 2
        assert said in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit) as bad:  # points of top-1, not a share
        main(["quantize", str(TRAINED), str(out), "--data", "digits", "--budget", "150"])
    assert bad.value.code == 2 and not out.exists()
    assert "expected points of top-1" in capsys.readouterr().err


def test_a_model_int8_keeps_whole_is_scored_once_per_half_with_one_session(tmp_path,
                                                                           monkeypatch):
    from vitkit.deploy import quantize as q

    sessions, scored = [], []
    real_top1, real_model = q.top1, q.OnnxModel

    def count_top1(model, loader):
        scored.append((model.path.name, len(loader.dataset)))
        return real_top1(model, loader)

    class Counted(real_model):
        def __init__(self, path, *args, **kwargs):
            sessions.append(path.name)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(q, "top1", count_top1)
    monkeypatch.setattr(q, "OnnxModel", Counted)
    src = export_onnx(vitkit.load_model(TRAINED, verbose=False), tmp_path / "m.onnx")
    report = quantize(src, tmp_path / "q.onnx", "digits")
    assert report.kept_float == [] and report.int8_top1 == report.naive_top1
    assert sessions.count("int8.onnx") == 1
    int8 = [n for name, n in scored if name == "int8.onnx"]
    assert sorted(int8) == sorted([report.selection_images, report.images])  # once per half


def test_the_choice_of_images_is_fixed_sorted_and_within_the_limit():
    from vitkit.deploy.quantize import _choice

    assert _choice(10, 0) == list(range(10)) == _choice(10, 10) == _choice(10, 50)
    few = _choice(1000, 64)
    assert few == sorted(set(few)) and len(few) == 64 and few == _choice(1000, 64)
    assert max(few) < 1000 and few != list(range(64))
