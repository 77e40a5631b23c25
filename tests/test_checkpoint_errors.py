"""Bad checkpoints: each gets a clear message, nothing is executed, nothing loads misaligned."""

import argparse
import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit import CheckpointError


@pytest.fixture
def state():
    return vitkit.create_model("vit_nano_patch4_32").state_dict()


def test_mis_shaped_missing_and_unexpected_keys_are_all_listed(state, tmp_path):
    state = dict(state)
    state["blocks.2.attn.proj.weight"] = torch.zeros(64, 32)
    del state["blocks.1.norm2.weight"]
    state["blocks.0.adapter.weight"] = torch.ones(64)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as err:
        vitkit.load_model(tmp_path / "bad.pth")
    msg = str(err.value)
    assert "blocks.2.attn.proj.weight: checkpoint (64, 32) vs model (64, 64)" in msg
    assert "missing keys:\n  blocks.1.norm2.weight" in msg
    assert "unexpected keys:\n  blocks.0.adapter.weight" in msg


def test_non_strict_still_refuses_shapes_but_lists_the_rest(state, tmp_path, vitkit_log):
    state = dict(state)
    del state["blocks.1.norm2.weight"]
    state["extra.thing"] = torch.ones(3)
    torch.save(state, tmp_path / "loose.pth")
    model = vitkit.load_model(tmp_path / "loose.pth", strict=False)
    err = vitkit_log.text
    assert all(r.levelname == "WARNING" for r in vitkit_log.records)
    assert "1 missing keys keep their initial values: blocks.1.norm2.weight" in err
    assert "1 unexpected keys ignored: extra.thing" in err
    assert torch.equal(model.blocks[1].norm2.weight, torch.ones(64))  # initial value
    state["blocks.0.mlp.fc2.weight"] = torch.zeros(64, 3)
    torch.save(state, tmp_path / "loose.pth")
    with pytest.raises(CheckpointError, match="mis-shaped"):
        vitkit.load_model(tmp_path / "loose.pth", strict=False)


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/vitkit-pwned",))


def test_pickled_code_is_refused_and_never_run(state, tmp_path):
    if os.path.exists("/tmp/vitkit-pwned"):
        os.remove("/tmp/vitkit-pwned")
    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump({"model": state, "hook": Exploit()}, f)
    with pytest.raises(CheckpointError, match="would execute code stored in the file"):
        vitkit.load_model(tmp_path / "evil.pth")
    assert not os.path.exists("/tmp/vitkit-pwned")


def test_training_checkpoint_with_python_objects_is_refused(state, tmp_path):
    torch.save({"model": state, "args": argparse.Namespace(lr=1e-3)}, tmp_path / "train.pth")
    with pytest.raises(CheckpointError, match=r"weights_only=True.*safetensors.torch.save_file"):
        vitkit.load_model(tmp_path / "train.pth")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".npz"])
def test_truncated_files_say_so(state, tmp_path, suffix):
    path = tmp_path / f"cut{suffix}"
    if suffix == ".pth":
        torch.save(state, path)
    elif suffix == ".safetensors":
        save_file(state, path)
    else:
        np.savez(path, **{k: v.numpy() for k, v in state.items()})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        vitkit.load_model(path)


def test_npz_with_pickled_objects_is_refused(tmp_path):
    np.savez(tmp_path / "obj.npz", thing=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        vitkit.load_model(tmp_path / "obj.npz")


def test_unknown_layout_lists_what_is_supported(tmp_path):
    torch.save({"conv1.weight": torch.zeros(3)}, tmp_path / "resnet.pth")
    with pytest.raises(CheckpointError, match=r"not a checkpoint vitkit knows.*keys start: "
                                              r"conv1.weight.*Supported: .*timm"):
        vitkit.load_model(tmp_path / "resnet.pth")


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder"):
        vitkit.load_model(tmp_path / "nope.pth")
    with pytest.raises(CheckpointError, match="has no weight files"):
        vitkit.load_model(tmp_path)


def test_hf_weights_without_their_config(tmp_path):
    import transformers

    peer = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="needs its config.json"):
        vitkit.load_model(tmp_path / "w.safetensors")


def test_non_square_table_without_size_asks_for_img_size(tmp_path):
    model = vitkit.create_model("vit_nano_patch4_32", img_size=(32, 48))
    torch.save(model.state_dict(), tmp_path / "rect.pth")
    with pytest.raises(CheckpointError, match=r"Pass img_size=\(H, W\)"):
        vitkit.load_model(tmp_path / "rect.pth")


def test_dropping_pre_logits_under_a_head_needs_a_new_head(tmp_path):
    import torchvision

    tv = torchvision.models.VisionTransformer(32, 8, 1, 2, 32, 64, num_classes=4,
                                              representation_size=16)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    with pytest.raises(CheckpointError, match=r"width 32 .* pass num_heads="):
        vitkit.load_model(tmp_path / "tv.pth")  # torchvision weights do not store heads
    with pytest.raises(CheckpointError, match="pass num_classes=N as well"):
        vitkit.load_model(tmp_path / "tv.pth", keep_pre_logits=False, num_heads=2)
    model = vitkit.load_model(tmp_path / "tv.pth", keep_pre_logits=False, num_classes=3,
                              num_heads=2)
    assert model.cfg.representation_size == 0 and model.head.weight.shape == (3, 32)


def test_a_missing_weight_keeps_the_models_own_initialisation(state, tmp_path):
    """Loading skips init_weights when the state overwrites every weight; with strict=False a
    weight the state leaves out still gets it (trunc-normal(0.02) for a linear), never the
    uninitialised memory of a skipped init."""
    state = dict(state)
    del state["blocks.1.mlp.fc1.weight"]
    torch.save(state, tmp_path / "loose.pth")
    model = vitkit.load_model(tmp_path / "loose.pth", strict=False, verbose=False)
    w = model.blocks[1].mlp.fc1.weight
    assert torch.isfinite(w).all() and w.abs().max() < 0.2
    assert 0.015 < float(w.std()) < 0.025
    assert torch.equal(model.blocks[0].mlp.fc1.weight, state["blocks.0.mlp.fc1.weight"])
