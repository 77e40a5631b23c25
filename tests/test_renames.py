"""One meaning per word: the renamed options and attributes, and the old spellings a user may
have in scripts or in files, which keep working with a notice."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.cli import main


def test_a_vitkit_file_written_with_the_old_config_name_loads(tmp_path):
    """Files written before representation_size was renamed (it was pre_logits) still load
    with their pre-logits layer, and the same logits."""
    model = vitkit.create_model("vit_nano_patch4_32", representation_size=24).eval()
    vitkit.save_model(model, tmp_path / "new.safetensors")
    with open(tmp_path / "new.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    config = json.loads(header["__metadata__"]["vitkit_config"])
    config["pre_logits"] = config.pop("representation_size")
    save_file(load_file(tmp_path / "new.safetensors"), tmp_path / "old.safetensors",
              {"format": "pt", "vitkit_config": json.dumps(config)})
    old = vitkit.load_model(tmp_path / "old.safetensors", verbose=False)
    assert old.cfg.representation_size == 24
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(old(x), model(x))


def test_load_models_old_pre_logits_keyword_still_works_with_a_warning(tmp_path):
    model = vitkit.create_model("vit_nano_patch4_32", representation_size=24, num_classes=0)
    vitkit.save_model(model, tmp_path / "m.safetensors")
    with pytest.warns(DeprecationWarning, match="keep_pre_logits"):
        dropped = vitkit.load_model(tmp_path / "m.safetensors", pre_logits=False, verbose=False)
    assert dropped.cfg.representation_size == 0
    assert vitkit.load_model(tmp_path / "m.safetensors", keep_pre_logits=False,
                             verbose=False).cfg.representation_size == 0


def test_the_in_place_path_switch_has_one_name_and_the_old_one_still_works():
    model = vitkit.create_model("vit_nano_patch4_32").eval()
    assert model.inplace_inference is True
    with pytest.warns(DeprecationWarning, match="inplace_inference"):
        model.fused_inference = False
    assert model.inplace_inference is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        model.inplace_inference = True


def test_demo_images_is_now_num_images(tmp_path, capsys, monkeypatch):
    """--images is a folder in `vitkit explore`; in `vitkit demo` the count is --num-images,
    and the old spelling is still taken, with a notice."""
    import vitkit.commands.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda opts: seen.setdefault("opts", opts))
    assert main(["demo", "--images", "3", "--out", str(tmp_path)]) == 0
    assert seen["opts"].num_images == 3
    assert "--num-images" in capsys.readouterr().err
    seen.clear()
    assert main(["demo", "--num-images", "5", "--out", str(tmp_path)]) == 0
    assert seen["opts"].num_images == 5 and "--num-images" not in capsys.readouterr().err
