"""`vitkit train`: recipes, configs, distillation, fine-tuning, bad data, and runs that survive
a SIGKILL or run on two processes with exactly the same result."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import yaml
from conftest import small_vit
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit.data.datasets import DataError, load_split
from vitkit.data.transforms import eval_transform
from vitkit.train.config import resolve
from vitkit.train.distill import distillation_loss
from vitkit.train.trainer import NonFiniteLoss, epoch_batches, train

FAST = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, epochs=1)


def run(tmp_path, name, **kw):
    cfg = resolve({**FAST, "out": str(tmp_path), "name": name, **kw})
    return train(cfg, progress=False)


def cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "vitkit.cli", *args], capture_output=True,
                          text=True, env=env, **kw)


def weights(path):
    return load_file(str(path))


def test_run_folder_holds_everything(tmp_path):
    r = run(tmp_path, "plain", epochs=2, ema_decay=0.9)
    files = {p.name for p in r.run_dir.iterdir()}
    assert {"config.yaml", "metrics.csv", "curves.png", "best.safetensors", "last.safetensors",
            "state.pt", "train.log"} <= files
    assert any(f.startswith("events.out.tfevents") for f in files)
    header = (r.run_dir / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("epoch,step,train_loss,val_loss,val_top1,val_top5")
    assert "ema_top1" in header
    model = vitkit.load_model(r.run_dir / "best.safetensors")
    assert model.cfg.extra["class_names"] == [str(i) for i in range(10)]
    assert yaml.safe_load((r.run_dir / "config.yaml").read_text())["ema_decay"] == 0.9


def test_precedence_recipe_then_yaml_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("recipe: deit\nlr: 0.002\nmixup: 0.0\nepochs: 7\n")
    cfg = resolve({"epochs": 3}, str(path))
    assert cfg.recipe == "deit" and cfg.randaugment == 9 and cfg.cutmix == 1.0  # recipe
    assert cfg.lr == 0.002 and cfg.mixup == 0.0  # file over recipe
    assert cfg.epochs == 3  # flag over file
    with pytest.raises(ValueError, match="unknown training option"):
        resolve({"learning_rate": 1.0})
    with pytest.raises(ValueError, match="unknown recipe"):
        resolve({"recipe": "fast"})


def _colours(root, n):
    """Three classes told apart by their colour (red, green, blue over dim noise), which
    survives every augmentation of the DeiT recipe."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(["red", "green", "blue"]):
        (root / name).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 96, (16, 16, 3), dtype=np.uint8)
            pixels[..., c] = rng.integers(160, 256, (16, 16), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def test_deit_recipe_trains_with_every_augmentation(tmp_path):
    """RandAugment, MixUp/CutMix, erasing, label smoothing, stochastic depth, accumulation and
    clipping all on, on a task they leave learnable: the loss falls, and validation ends far
    below chance (ln 3). A pipeline that mixes images and labels apart, or never steps, fails."""
    _colours(tmp_path / "rgb", n=48)
    r = run(tmp_path, "deit", recipe="deit", data=f"imagefolder:{tmp_path / 'rgb'}", epochs=2,
            lr=1e-2, warmup_epochs=0.5, clip_grad=1.0, accum_steps=2, batch_size=16)
    cfg = yaml.safe_load((r.run_dir / "config.yaml").read_text())
    assert (cfg["randaugment"], cfg["mixup"], cfg["cutmix"], cfg["random_erasing"],
            cfg["crop_scale"], cfg["label_smoothing"]) == (9, 0.8, 1.0, 0.25, 0.08, 0.1)
    first, last = r.history[0], r.history[-1]
    assert last["train_loss"] < first["train_loss"] - 0.05, r.history
    assert last["val_loss"] < 0.5 * math.log(3), r.history
    assert last["val_top1"] >= 0.9, r.history


def test_learns_digits(tmp_path):
    r = run(tmp_path, "learn", epochs=6, lr=4e-3, batch_size=32)
    assert r.best_top1 > 0.5  # chance is 0.1


def test_non_finite_loss_stops_with_the_step_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    import vitkit.train.trainer as trainer

    build = trainer.build_model

    def poisoned(*args, **kwargs):  # the 25th training forward (epoch 2) returns NaN
        model = build(*args, **kwargs)
        calls = {"n": 0}

        def hook(module, inputs, output):
            if module.training:
                calls["n"] += 1
                if calls["n"] >= 25:
                    return output * float("nan")
            return output

        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(trainer, "build_model", poisoned)
    with pytest.raises(NonFiniteLoss, match=r"became nan at step 25 \(epoch 2\).*last good"):
        run(tmp_path, "nan", epochs=3)
    vitkit.load_model(tmp_path / "nan" / "last.safetensors")  # the epoch-1 checkpoint loads


@pytest.mark.parametrize("accum", [1, 4])
def test_one_host_read_and_one_collective_per_optimizer_step(tmp_path, monkeypatch, accum):
    """The training loop waits on the device once per optimizer step, whatever the
    accumulation: the non-finite and Ctrl-C flags are reduced together (one all-reduce) and
    read together (one read to the host); the loss stays on the device between log intervals.
    Counted with Tensor.item / Tensor.tolist and the all-reduce patched, inside the epochs'
    steps only (validation is per epoch), where vitkit calls them (the data transforms read
    CPU tensors in the loader's workers, and AdamW its CPU step count: no device waits)."""
    import vitkit.train.trainer as trainer
    from vitkit.train import distributed

    counts = {"host": 0, "collective": 0}
    inside = {"on": False}
    item, tolist, reduce = torch.Tensor.item, torch.Tensor.tolist, distributed.all_reduce_sum
    package = str(Path(vitkit.__file__).parent)

    def counted(original, key):
        def wrapper(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            counts[key] += inside["on"] and caller.startswith(package)
            return original(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(torch.Tensor, "item", counted(item, "host"))
    monkeypatch.setattr(torch.Tensor, "tolist", counted(tolist, "host"))
    monkeypatch.setattr(distributed, "all_reduce_sum", counted(reduce, "collective"))
    epoch = trainer._train_epoch

    def steps_only(*args, **kwargs):
        inside["on"] = True
        try:
            return epoch(*args, **kwargs)
        finally:
            inside["on"] = False

    monkeypatch.setattr(trainer, "_train_epoch", steps_only)
    result = run(tmp_path, f"a{accum}", steps=6, batch_size=16, accum_steps=accum)
    assert result.history[-1]["step"] == 6
    # 6 steps in one epoch: one read a step, and the epoch's batch order (a CPU permutation)
    assert counts == {"host": 6 + 1, "collective": 6}, counts


def test_distillation_loss_formulas():
    torch.manual_seed(0)
    cls, dist, teacher = torch.randn(3, 4, 5).unbind(0)
    y = torch.tensor([0, 1, 2, 3])
    hard = distillation_loss(cls, dist, y, teacher, "hard", alpha=0.3)
    expected = 0.7 * F.cross_entropy(cls, y) + 0.3 * F.cross_entropy(dist, teacher.argmax(-1))
    torch.testing.assert_close(hard, expected)
    soft = distillation_loss(cls, dist, y, teacher, "soft", alpha=0.5, tau=2.0)
    p_t = F.softmax(teacher / 2, -1)
    kl = (p_t * (p_t.log() - F.log_softmax(dist / 2, -1))).sum() * 4 / dist.numel()
    torch.testing.assert_close(soft, 0.5 * F.cross_entropy(cls, y) + 0.5 * kl)


def test_the_teachers_logits_steer_the_students_gradient():
    """Two teachers, two gradients: the distillation head's gradient is set by the teacher
    (toward its argmax for hard labels, its tempered softmax for soft ones), the [CLS] head's
    by the labels only. A loss that ignored the teacher would give one gradient for both."""
    g = torch.Generator().manual_seed(0)
    cls, dist, teacher = torch.randn(3, 4, 5, generator=g).unbind(0)
    other = teacher.roll(1, dims=1)  # every image's top class moves
    y = torch.tensor([0, 1, 2, 3])
    alpha, tau = 0.3, 2.0

    def grads(kind, t, **kw):
        c, d = cls.clone().requires_grad_(True), dist.clone().requires_grad_(True)
        distillation_loss(c, d, y, t, kind, alpha=alpha, **kw).backward()
        return c.grad, d.grad

    for t in (teacher, other):
        c, d = grads("hard", t)
        torch.testing.assert_close(c, (1 - alpha) * (F.softmax(cls, -1) - F.one_hot(y, 5)) / 4)
        torch.testing.assert_close(d, alpha * (F.softmax(dist, -1) - F.one_hot(t.argmax(-1), 5))
                                   / 4)
        _, d = grads("soft", t, tau=tau)
        torch.testing.assert_close(d, alpha * tau * (F.softmax(dist / tau, -1)
                                                     - F.softmax(t / tau, -1)) / dist.numel())
    for kind in ("hard", "soft"):
        (c1, d1), (c2, d2) = grads(kind, teacher), grads(kind, other)
        assert torch.equal(c1, c2) and (d1 - d2).abs().max() > 0.2 * d1.abs().max(), kind
    # hard labels are the teacher's argmax and nothing else
    assert torch.equal(grads("hard", teacher * 3 + 1)[1], grads("hard", teacher)[1])

    # through a distilled ViT: the teacher reaches every weight under the distillation token's
    # path (the blocks, the distillation head), never the [CLS] head
    student = small_vit(scale=0.1, distilled=True)
    x = torch.randn(4, 3, 32, 32, generator=g)
    logits = torch.randn(2, 4, 7, generator=g)

    def weight_grads(t):
        student.zero_grad()
        c, d = student(x, distill_heads=True)
        distillation_loss(c, d, y, t, "soft", tau=tau).backward()
        return {n: p.grad.clone() for n, p in student.named_parameters()}

    a, b = weight_grads(logits[0]), weight_grads(logits[1])
    assert torch.equal(a["head.weight"], b["head.weight"])
    for name in ("head_dist.weight", "dist_token", "blocks.0.attn.qkv.weight"):
        assert not torch.allclose(a[name], b[name], atol=1e-6), name


@pytest.fixture(scope="module")
def cnn_teacher(tmp_path_factory):
    """`vitkit train --model resnet18` on the same data: the teacher."""
    out = tmp_path_factory.mktemp("teacher")
    return run(out, "resnet18", model="resnet18", batch_size=128).run_dir / "best.safetensors"


def test_cnn_checkpoint_loads_as_a_cnn(cnn_teacher):
    teacher = vitkit.load_model(cnn_teacher)
    assert teacher.cfg.arch == "resnet18" and teacher(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def _val_images(model, size=16):
    """The digits validation images as ``model`` takes them (its mean and std)."""
    split = load_split("digits", "val", size)
    preprocess = eval_transform(size, model.cfg.extra["mean"], model.cfg.extra["std"])
    return torch.stack([preprocess(split[i][0]) for i in range(len(split))])


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_distil_from_a_cnn_teacher(tmp_path, kind, cnn_teacher):
    """The student learns from its teacher, not only from the labels: the ResNet-18 teacher
    with its class-3 logit raised says "3" for (almost) every image, and after one epoch the
    student's distillation head says "3" too, while its [CLS] head, taught by the labels,
    does not. A trainer that dropped the teacher's logits would leave the two heads alike."""
    teacher = vitkit.load_model(cnn_teacher)
    with torch.no_grad():
        teacher.net.fc.bias[3] += 8.0
    biased = tmp_path / "says-3.safetensors"
    vitkit.save_model(teacher, biased)
    x = _val_images(teacher)
    with torch.no_grad():
        assert (teacher(x).argmax(1) == 3).float().mean() > 0.95
    student = run(tmp_path, f"student-{kind}", distill=kind, teacher=str(biased))
    model = vitkit.load_model(student.run_dir / "last.safetensors").eval()
    assert model.cfg.distilled and model.num_prefix_tokens == 2
    with torch.no_grad():
        cls_logits, dist_logits = model(x, distill_heads=True)
    assert (dist_logits.argmax(1) == 3).float().mean() > 0.9
    assert (cls_logits.argmax(1) == 3).float().mean() < 0.5


def test_finetune_from_a_timm_checkpoint_with_new_classes_and_size(tmp_path):
    peer = timm.create_model("vit_tiny_patch16_224", depth=2, img_size=32, patch_size=4)
    torch.save(peer.state_dict(), tmp_path / "timm.pth")
    # no --model: the checkpoint sets the architecture (a different --model is refused)
    options = {k: v for k, v in FAST.items() if k != "model"}
    r = train(resolve({**options, "out": str(tmp_path), "name": "ft", "recipe": "finetune",
                       "init": str(tmp_path / "timm.pth"), "img_size": 16,
                       "layer_decay": 0.75}), progress=False)
    assert yaml.safe_load((r.run_dir / "config.yaml").read_text())["model"] == "(from --init)"
    model = vitkit.load_model(r.run_dir / "last.safetensors")
    assert model.num_classes == 10 and model.grid_size == (4, 4)
    # it started from timm's weights: one epoch at the fine-tuning lr (1.25e-5 a step) leaves
    # them within 2e-3, where a fresh initialisation would be ~0.1 away; the position table is
    # timm's 8x8 resampled to 4x4
    ours, theirs = model.state_dict(), peer.state_dict()
    for k in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.1.mlp.fc2.weight"):
        assert (ours[k] - theirs[k]).abs().max() < 2e-3, k
    table = vitkit.interpolate_pos_embed(theirs["pos_embed"], (8, 8), (4, 4))
    assert (ours["pos_embed"] - table).abs().max() < 2e-3


def test_epoch_batches_split_one_global_batch_across_processes():
    single = epoch_batches(100, 8, seed=3, epoch=1, rank=0, world=1)
    r0 = epoch_batches(100, 4, seed=3, epoch=1, rank=0, world=2)
    r1 = epoch_batches(100, 4, seed=3, epoch=1, rank=1, world=2)
    assert len(single) == len(r0) == len(r1) == 12
    for s, a, b in zip(single, r0, r1, strict=True):
        assert sorted(s) == sorted(a + b)


def test_killed_mid_epoch_and_resumed_matches_an_uninterrupted_run(tmp_path):
    args = ["train", "--model", "vit_micro_patch4_32", "--data", "digits", "--epochs", "2",
            "--batch-size", "32", "--drop-path", "0.1", "--crop-scale", "0.6", "--hflip",
            "--checkpoint-every", "5", "--out", str(tmp_path)]
    whole = cli(*args, "--name", "whole")
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen([sys.executable, "-m", "vitkit.cli", *args, "--name", "killed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "killed" / "state.pt"
    deadline = time.time() + 120
    while time.time() < deadline:
        if state.exists() and torch.load(state, weights_only=True)["step"] >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(state, weights_only=True)
    assert saved["epoch"] == 0 and 0 < saved["step_in_epoch"]  # killed mid-epoch 1
    stale = tmp_path / "killed" / ".state.pt.k1ll3d.pt"  # what a kill mid-write leaves
    stale.write_bytes(b"")
    resumed = cli("train", "--resume", str(tmp_path / "killed"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at epoch 1" in resumed.stderr
    assert not stale.exists()
    # the resumed epoch's logged loss covers its steps before the kill too
    assert (tmp_path / "whole" / "metrics.csv").read_text().splitlines()[1].split(",")[:3] == \
        (tmp_path / "killed" / "metrics.csv").read_text().splitlines()[1].split(",")[:3]
    umask = os.umask(0)
    os.umask(umask)
    for f in ("last.safetensors", "state.pt", "config.yaml", "metrics.csv"):
        assert (tmp_path / "killed" / f).stat().st_mode & 0o777 == 0o666 & ~umask, f
    a, b = weights(tmp_path / "whole" / "last.safetensors"), \
        weights(tmp_path / "killed" / "last.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_grad_checkpointing_trains_the_same_weights(tmp_path):
    kw = dict(drop_path=0.1, epochs=1, steps=6)
    plain = run(tmp_path, "plain", **kw)
    ckpt = run(tmp_path, "ckpt", grad_checkpointing=True, **kw)
    a, b = weights(plain.run_dir / "last.safetensors"), weights(ckpt.run_dir / "last.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)
    with pytest.raises(ValueError, match="applies to ViTs"):
        run(tmp_path, "cnn", model="resnet18", grad_checkpointing=True, steps=1)


def test_torchrun_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    common = ["--model", "vit_nano_patch4_32", "--data", "digits", "--img-size", "16",
              "--epochs", "1", "--out", str(tmp_path)]
    single = cli("train", *common, "--batch-size", "64", "--name", "one")
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "-m", "vitkit.cli", "train", *common, "--batch-size", "32",
                          "--name", "two"], capture_output=True, text=True, env=env)
    assert two.returncode == 0, two.stderr
    assert "2 process(es)" in (tmp_path / "two" / "train.log").read_text()
    assert two.stdout.count("best validation top-1") == 1  # one closing line, not one per rank
    a, b = weights(tmp_path / "one" / "last.safetensors"), \
        weights(tmp_path / "two" / "last.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)


# ------------------------------------------------------------------------------------- data
def _folder(root, classes, n=3, size=(20, 20)):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(
                root / c / f"{i}.png")


def test_image_folder_skips_and_lists_broken_files(tmp_path):
    _folder(tmp_path / "imgs", ["cat", "dog"], n=6)
    (tmp_path / "imgs" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    Image.new("LA", (20, 20)).save(tmp_path / "imgs" / "dog" / "grey_alpha.png")
    split = load_split(f"imagefolder:{tmp_path / 'imgs'}", "train", val_fraction=0.25)
    assert split.classes == ["cat", "dog"]
    assert any(s.endswith("broken.jpg") for s in split.skipped)
    assert all(split[i][0].mode == "RGB" for i in range(len(split)))
    r = run(tmp_path, "folder", data=f"imagefolder:{tmp_path / 'imgs'}", batch_size=4)
    assert "skipped 1 unreadable images" in (r.run_dir / "train.log").read_text()


def test_image_folder_with_train_and_val(tmp_path):
    _folder(tmp_path / "ds" / "train", ["a", "b", "c"])
    _folder(tmp_path / "ds" / "val", ["a", "b", "c"], n=1)
    assert len(load_split(f"imagefolder:{tmp_path / 'ds'}", "val")) == 3


def test_empty_class_and_missing_data_are_errors_before_training(tmp_path):
    _folder(tmp_path / "imgs", ["cat"])
    (tmp_path / "imgs" / "dog").mkdir()
    with pytest.raises(DataError, match="class 'dog' has no readable images"):
        load_split(f"imagefolder:{tmp_path / 'imgs'}", "train")
    with pytest.raises(DataError, match="put the extracted 'cifar-10-batches-py' folder"):
        load_split("cifar10", "train", root=str(tmp_path))
    with pytest.raises(DataError, match="unknown dataset"):
        load_split("svhn", "train")
    with pytest.raises(DataError, match="mnist is not in"):  # no Debian fallback for MNIST
        load_split("mnist", "train", root=tmp_path / "none")


# ------------------------------------------------------------------------- eval and predict
def test_eval_and_predict_commands(tmp_path):
    r = run(tmp_path, "ev")
    ckpt = str(r.run_dir / "best.safetensors")
    out = cli("eval", ckpt, "--data", "digits", "--out", str(tmp_path / "eval"))
    assert out.returncode == 0, out.stderr
    assert "top-1" in out.stdout and (tmp_path / "eval" / "confusion.png").exists()
    _folder(tmp_path / "pics", ["x"], n=2)
    (tmp_path / "pics" / "x" / "bad.png").write_bytes(b"nope")
    out = cli("predict", ckpt, str(tmp_path / "pics"), "--top-k", "3",
              "--out", str(tmp_path / "p.csv"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0].startswith("image,class1,prob1,class2,prob2,class3,prob3")
    assert len(lines) == 4 and "cannot read image" in lines[-1]


def test_warmup_in_steps_overrides_epochs(tmp_path):
    from vitkit.recipe import schedule

    assert schedule(20, epochs=2, warmup_epochs=0.5) == (40, 10)
    assert schedule(20, steps=7, epochs=2, warmup_epochs=0.5, warmup_steps=3) == (7, 3)
    # a warmup as long as the run ends it at the full lr; without one the cosine has decayed
    top = run(tmp_path, "warm", steps=4, warmup_steps=4, lr=8e-3).history[-1]["lr"]
    cold = run(tmp_path, "cold", steps=4, warmup_epochs=0, lr=8e-3).history[-1]["lr"]
    assert top == pytest.approx(8e-3 * 64 / 512) and cold < 0.5 * top


def test_warmup_then_cosine():
    from vitkit.train.trainer import cosine_lr

    lrs = [cosine_lr(s, 100, 10, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] < 0.01
