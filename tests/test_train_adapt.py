"""`vitkit train --freeze` and `--lora-rank`: what stays fixed stays bit for bit, LoRA (Hugging
Face PEFT) is merged into plain checkpoints that equal the adapted model and resume exactly, the
run records what trained, and the doctor judges a probe as a probe."""

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import vitkit
from vitkit.cli import main
from vitkit.diagnose import diagnose, start_of_run
from vitkit.errors import ConfigError
from vitkit.recipe import plan_run
from vitkit.train import adapt, trainer
from vitkit.train.config import resolve
from vitkit.train.trainer import param_groups, train

# a vit_nano_patch4_32 trained on cluttered digits (tests/data/doctor/README.md); digits 0-4 give
# it a new 5-class head
INIT = Path(__file__).parent / "data" / "doctor" / "demo-recipe.safetensors"
BASE = dict(init=str(INIT), data="digits:0-4", img_size=32, batch_size=32, data_fraction=0.5,
            epochs=1)


def run(tmp_path, name, **kw):
    return train(resolve({**BASE, "out": str(tmp_path), "name": name, **kw}), progress=False)


def numel(state, keys):
    return sum(state[k].numel() for k in keys)


# ---------------------------------------------------------------------------------- freezing
@pytest.mark.parametrize("freeze, trains", [
    ("backbone", ("head.",)),
    ("2", ("head.", "blocks.2.", "blocks.3.", "norm.")),  # embeddings and blocks 0-1 fixed
])
def test_frozen_weights_are_the_inits_bit_for_bit_and_out_of_the_optimizer(tmp_path, freeze,
                                                                           trains):
    r = run(tmp_path, "frozen", freeze=freeze, weight_decay=0.3)
    init = load_file(INIT)
    state = torch.load(r.run_dir / "state.pt", weights_only=True)
    for name in ("best.safetensors", "last.safetensors"):
        saved = load_file(r.run_dir / name)
        assert saved.keys() == init.keys()
        learned = [k for k in saved if k.startswith(trains)]
        for k in saved.keys() - set(learned):
            assert torch.equal(saved[k], init[k]), (name, k)
    # the final norm learns above frozen blocks, not in a probe
    assert torch.equal(saved["norm.weight"], init["norm.weight"]) == (freeze == "backbone")
    if freeze == "2":
        assert not torch.equal(saved["blocks.3.mlp.fc1.weight"], init["blocks.3.mlp.fc1.weight"])
    # the optimizer holds the trained tensors only (AdamW moments of their shapes)
    moments = state["optimizer"]["state"].values()
    assert sorted(m["exp_avg"].numel() for m in moments) == sorted(saved[k].numel()
                                                                  for k in learned)
    record = json.loads((r.run_dir / "params.json").read_text())
    assert record["trainable"] == numel(saved, learned) and record["freeze"] == freeze
    assert record["total"] == numel(saved, saved)
    log = (r.run_dir / "train.log").read_text()
    assert f"{record['trainable']:,} trainable" in log


def test_frozen_parameters_are_out_of_every_weight_decay_group():
    cfg = resolve(dict(BASE, freeze="1"))
    model = adapt.prepare(vitkit.create_model("vit_nano_patch4_32", num_classes=5), cfg)
    grouped = {id(p) for g in param_groups(model, 0.05, 0.75) for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in grouped}
    assert names == {n for n, _ in model.named_parameters()
                     if not n.startswith(("patch_embed.", "pos_embed", "cls_token", "blocks.0."))}
    assert all(b.drop_path1.p == 0 for b in model.blocks[:1])


# ---------------------------------------------------------------------------------- LoRA
LORA = dict(BASE, lora_rank=4, lora_alpha=8.0)


@pytest.fixture
def lora_model():
    """The trained nano ViT with rank-4 LoRA on every target, its B matrices drawn (PEFT
    starts them at zero, which would make any merge look right)."""
    torch.manual_seed(0)
    model = adapt.prepare(vitkit.load_model(INIT, num_classes=5, verbose=False), resolve(LORA))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


def test_only_the_adapters_and_the_head_train(lora_model):
    trained = {n for n, p in lora_model.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in lora_model.named_parameters()
                       if ".lora_A." in n or ".lora_B." in n or n.startswith("head.")}
    assert {n.split(".")[3] for n in trained if "lora" in n} == {"qkv", "proj", "fc1", "fc2"}
    assert not any("patch_embed" in n for n in trained)  # patch_embed.proj is no target


def test_the_merged_model_equals_the_adapted_one_and_peft_s_own_merge(lora_model):
    x = torch.randn(3, 3, 32, 32)
    merged = adapt.plain(lora_model)
    assert merged.state_dict().keys() == vitkit.load_model(INIT, verbose=False).state_dict().keys()
    assert merged.inplace_inference  # a plain model again: the in-place CPU path applies
    assert not hasattr(merged, "peft_config")
    lora_model.eval()
    with torch.no_grad():
        adapted, plain = lora_model(x), merged.eval()(x)
    torch.testing.assert_close(plain, adapted, atol=1e-5, rtol=0)
    with torch.enable_grad():  # the standard path, where training runs
        torch.testing.assert_close(merged(x), lora_model(x), atol=1e-5, rtol=0)
    # W' = W + alpha / r * B A (Hu et al. 2021, eq. 3)
    layer = lora_model.blocks[3].attn.qkv
    delta = 8.0 / 4 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    torch.testing.assert_close(merged.blocks[3].attn.qkv.weight,
                               layer.base_layer.weight + delta, atol=1e-6, rtol=0)
    # PEFT's merge_and_unload on the same weights
    from peft import LoraConfig, get_peft_model

    targets = r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.fc\d)"
    reference = get_peft_model(vitkit.load_model(INIT, num_classes=5, verbose=False),
                               LoraConfig(r=4, lora_alpha=8.0, target_modules=targets))
    reference.base_model.model.load_state_dict(lora_model.state_dict())
    unloaded = reference.merge_and_unload().state_dict()
    for k, v in merged.state_dict().items():
        torch.testing.assert_close(v, unloaded[k], atol=1e-6, rtol=0)


def test_the_last_blocks_readout_path_runs_the_adapter(lora_model):
    """A [CLS] model's last block computes the [CLS] row's query only; the adapter of its qkv
    must be on that path, in the forward and in the gradients."""
    x = torch.randn(2, 3, 32, 32)
    lora_model.train()
    rows = lora_model(x)  # readout rows only in the last block
    every = lora_model.forward_head(lora_model.forward_features(x))  # every row
    torch.testing.assert_close(rows, every, atol=1e-5, rtol=0)
    rows.square().sum().backward()
    grad = lora_model.blocks[-1].attn.qkv.lora_A["default"].weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_a_lora_run_saves_plain_merged_checkpoints_and_resumes_exactly(tmp_path, monkeypatch):
    kw = dict(LORA, lora_targets="qkv,fc2", lora_dropout=0.1, epochs=2)
    whole = run(tmp_path, "whole", **kw)
    init, state = load_file(INIT), torch.load(whole.run_dir / "state.pt", weights_only=True)
    model = vitkit.load_model(whole.run_dir / "last.safetensors", verbose=False)
    saved = load_file(whole.run_dir / "last.safetensors")
    assert saved.keys() == init.keys() == model.state_dict().keys()
    for k in saved:
        if k.startswith("head."):
            continue
        layer = k.removesuffix(".weight")
        if k.endswith(".weight") and f"{layer}.lora_A.default.weight" in state["model"]:
            A = state["model"][f"{layer}.lora_A.default.weight"]
            B = state["model"][f"{layer}.lora_B.default.weight"]
            assert B.abs().sum() > 0, k  # trained away from PEFT's zero start
            torch.testing.assert_close(saved[k], init[k] + 8.0 / 4 * B @ A, atol=1e-6, rtol=0)
        else:  # biases, norms, embeddings, proj and fc1: the init's, bit for bit
            assert torch.equal(saved[k], init[k]), k
    assert not any("lora" in k or "base_layer" in k for k in load_file(
        whole.run_dir / "best.safetensors"))

    # the same run stopped after its first epoch, then resumed from state.pt
    real = trainer._train_epoch

    def stop_at_the_second(run_, epoch, guard=None):
        if epoch == 1:
            raise KeyboardInterrupt
        return real(run_, epoch, guard)

    monkeypatch.setattr(trainer, "_train_epoch", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "stopped", **kw)
    monkeypatch.setattr(trainer, "_train_epoch", real)
    train(None, resume=tmp_path / "stopped", progress=False)
    resumed = load_file(tmp_path / "stopped" / "last.safetensors")
    for k in saved:
        assert torch.equal(resumed[k], saved[k]), k


# ------------------------------------------------------------------------------ the options
@pytest.mark.parametrize("options, words", [
    (dict(freeze="half"), "'backbone'"),
    (dict(freeze="-1"), "'backbone'"),
    (dict(freeze="2", lora_rank=4), "LoRA already freezes"),
    (dict(lora_alpha=16.0), "add --lora-rank"),
    (dict(lora_targets="qkv"), "add --lora-rank"),
    (dict(lora_rank=4, lora_targets="qkv,mlp"), "unknown mlp"),
    (dict(lora_rank=4, lora_dropout=1.0), "below 1"),
    (dict(model="resnet18", freeze="backbone", init=None), "resnet18 is a CNN"),
    (dict(model="resnet18", lora_rank=2, init=None), "resnet18 is a CNN"),
    (dict(objective="mae", freeze="4", init=None, data="digits"), "masked-image pre-training"),
])
def test_contradictory_or_malformed_options_are_refused(options, words):
    with pytest.raises(ConfigError, match=words):
        resolve({**BASE, **options})


def test_freeze_from_a_yaml_number_and_the_flags_exist(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("freeze: 3\n")
    assert resolve({}, str(path)).freeze == "3"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    for flag in ("--freeze", "--lora-rank", "--lora-targets", "--lora-alpha", "--lora-dropout"):
        assert flag in shown


def test_freezing_more_blocks_than_the_model_has_is_refused_before_training(tmp_path, capsys):
    code = main(["train", "--init", str(INIT), "--data", "digits:0-4", "--freeze", "99",
                 "--out", str(tmp_path), "--name", "deep"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--freeze 99" in err and "(4)" in err and "0..4" in err
    assert not (tmp_path / "deep").exists()  # nothing trained, nothing left


def test_freezing_without_init_is_allowed_and_said(tmp_path):
    r = run(tmp_path, "scratch", init=None, model="vit_nano_patch4_32", freeze="backbone",
            steps=2)
    assert "random initialisation" in (r.run_dir / "train.log").read_text()


# -------------------------------------------------------------------------------- the doctor
def test_the_doctor_reads_a_slow_probe_as_slow_not_broken(tmp_path):
    """A linear probe at a learning rate meant for a full fine-tune barely moves its loss in
    200 steps: a full fine-tune that flat would be broken (an error), a probe is slow."""
    r = run(tmp_path, "probe", freeze="backbone", lr=2e-5, steps=200, batch_size=16)
    found = {f.check: f for f in diagnose(r.run_dir) if f.check.startswith("run.")}
    assert not [f for f in found.values() if f.level == "error"], found
    learning = found["run.learning"]
    assert learning.level == "warning", learning
    assert "0.23% of the parameters (--freeze backbone)" in learning.summary
    assert "--lr" in learning.fix
    # the same numbers as a full fine-tune: not learning
    full = tmp_path / "full"
    shutil.copytree(r.run_dir, full)
    (full / "params.json").unlink()
    config = yaml.safe_load((full / "config.yaml").read_text())
    (full / "config.yaml").write_text(yaml.safe_dump({**config, "freeze": ""}))
    assert {f.check: f.level for f in diagnose(full)}["run.learning"] == "error"


def test_a_probe_at_a_high_lr_is_no_recipe_warning_but_a_fine_tune_is():
    def recipe(**kw):
        config = resolve({**BASE, "lr": 0.1, "epochs": 10, **kw}).to_dict()
        return [f for f in start_of_run(config, plan_run(config, 500, 5))
                if f.check == "run.recipe"]

    assert [f.level for f in recipe(freeze="backbone")] == ["ok"]
    assert "fine-tuning with AdamW" in " ".join(f.summary for f in recipe())
    assert "fine-tuning with AdamW" in " ".join(f.summary for f in recipe(lora_rank=4))


def test_a_copy_of_a_lora_model_merges_alone(lora_model):
    """plain() works on a copy: the model being trained keeps its adapters."""
    before = copy.deepcopy(lora_model.state_dict())
    adapt.plain(lora_model)
    after = lora_model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in after)


def test_lora_without_peft_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft fails
    model = vitkit.create_model("vit_nano_patch4_32", num_classes=5)
    with pytest.raises(ConfigError, match=r"pip install '\.\[train\]'"):
        adapt.prepare(model, resolve(LORA))


def test_an_init_head_of_other_classes_is_kept_and_said(tmp_path, vitkit_log):
    """A 5-class head trained on digits 0-4, fine-tuned on digits 5-9: the counts agree, so the
    head is kept row for row, and the log says it means other classes and how to start fresh;
    on its own classes nothing is said."""
    source = vitkit.load_model(INIT, num_classes=5, verbose=False)
    source.cfg.extra["class_names"] = ["0", "1", "2", "3", "4"]
    init = vitkit.save_model(source, tmp_path / "zero-to-four.safetensors")
    kw = dict(init=str(init), steps=1, warmup_steps=0)
    run(tmp_path, "same", data="digits:0-4", **kw)
    assert "trained on other classes" not in vitkit_log.text
    r = run(tmp_path, "other", data="digits:5-9", **kw)
    assert "head was trained on other classes (0, 1, 2, 3, 4) than the data's (5, 6, 7, 8, 9)" \
        in vitkit_log.text
    assert "--num-classes 0" in vitkit_log.text
    saved = load_file(r.run_dir / "last.safetensors")
    assert saved["head.weight"].shape == (5, 64)  # kept: the 0-4 rows, fine-tuned one step
