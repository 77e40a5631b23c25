"""`vitkit doctor`: each classic failure built on purpose and caught at the right level, and no
false alarm on a healthy model or run."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from doctor_catalogue import TRAINED

import vitkit
from vitkit.cli import main
from vitkit.diagnose import diagnose, maps, runs, start_of_run, weights
from vitkit.explain import stats
from vitkit.recipe import RunPlan, plan_run
from vitkit.train import resolve, train, trainer
from vitkit.train.trainer import NonFiniteLoss


def levels(findings) -> dict[str, str]:
    """check name -> the worst level it reported."""
    out: dict[str, str] = {}
    for f in findings:
        order = ("error", "warning", "unknown", "ok")
        if f.check not in out or order.index(f.level) < order.index(out[f.check]):
            out[f.check] = f.level
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A ViT trained for ~25 s on the digits (a healthy run) and a fresh one."""
    root = tmp_path_factory.mktemp("doctor")
    result = train(resolve(dict(data="digits", img_size=32, model="vit_nano_patch4_32",
                                steps=150, batch_size=64, lr=8e-3, warmup_epochs=0.5,
                                out=str(root), name="healthy")), progress=False)
    vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=10),
                      root / "fresh.safetensors")
    return result.run_dir, root


def _variant(trained, name, change):
    run_dir, root = trained
    model = vitkit.load_model(run_dir / "last.safetensors", verbose=False)
    with torch.no_grad():
        change(model)
    return vitkit.save_model(model, root / f"{name}.safetensors")


# ----------------------------------------------------------------------------------- weights
def test_a_fresh_checkpoint_is_an_error_and_a_trained_one_is_not(trained, capsys):
    run_dir, root = trained
    fresh = levels(diagnose(root / "fresh.safetensors"))
    assert fresh["weights.trained"] == "error"
    healthy = levels(diagnose(run_dir / "last.safetensors", data="digits"))
    assert healthy["weights.trained"] == "ok"
    assert "error" not in healthy.values(), healthy
    assert main(["doctor", str(root / "fresh.safetensors"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["worst"] == "error"
    entry = next(f for f in report["findings"] if f["check"] == "weights.trained")
    assert entry["measured"]["blocks_at_init"] == 4 and entry["fix"]


def test_a_healthy_run_gives_no_error(trained, capsys):
    run_dir, _ = trained
    found = levels(diagnose(run_dir))
    assert "error" not in found.values(), found
    assert found["run.small_data"] == "warning"  # 1,438 images from scratch: said, not an error
    assert main(["doctor", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "[warning] run.small_data" in text and "fix: in order: fine-tune" in text
    # vitkit train ran the same checks itself: a line at the start, doctor.json at the end
    log = (run_dir / "train.log").read_text()
    assert "doctor: warning: a ViT trained from scratch on 1,438 images" in log
    saved = json.loads((run_dir / "doctor.json").read_text())
    assert {f["check"] for f in saved["findings"]} >= {"run.learning", "run.overfitting"}


def _reinit_table(model):
    torch.nn.init.trunc_normal_(model.pos_embed, std=0.02)


def test_blocks_loaded_but_table_reinitialised_is_the_mismatched_sizes_trap(tmp_path):
    model = vitkit.load_model(TRAINED, verbose=False)  # 300 steps: LayerNorm gains moved 0.046
    with torch.no_grad():
        _reinit_table(model)
    path = vitkit.save_model(model, tmp_path / "reinit.safetensors")
    found = [f for f in diagnose(path) if f.check == "weights.position_table"]
    assert found[0].level == "warning" and "ignore_mismatched_sizes" in found[0].why
    assert levels(diagnose(TRAINED))["weights.position_table"] == "ok"


def test_a_briefly_trained_table_is_not_called_replaced(trained):
    """150 steps move the blocks' LayerNorm gains by ~0.008: a table that has not moved yet is
    expected, so a replaced one cannot be told from it, and the doctor says so."""
    path = _variant(trained, "reinit-table", _reinit_table)
    found = next(f for f in diagnose(path) if f.check == "weights.position_table")
    assert found.level == "unknown" and "barely moved" in found.summary and not found.fix
    assert found.measured["blocks_layernorm_moved"] < weights.TRAINED_EXTENT


def test_some_blocks_at_init_is_a_partial_load(trained):
    def reset(model):
        for block in model.blocks[1:3]:
            for norm in (block.norm1, block.norm2):
                norm.weight.fill_(1.0)
                norm.bias.zero_()

    found = diagnose(_variant(trained, "partial", reset))
    partial = next(f for f in found if f.check == "weights.partially_loaded")
    assert partial.level == "error" and "blocks 1, 2" in partial.summary


def test_a_32px_checkpoint_asked_for_64(trained):
    path = trained[0] / "last.safetensors"
    fit = next(f for f in diagnose(path, img_size=64) if f.check == "weights.input_size")
    assert fit.level == "warning"
    assert fit.measured["table_rows"] == 65 and fit.measured["rows_needed"] == 257
    assert fit.fix == f"vitkit resize {path} resized.safetensors --img-size 64"
    assert next(f for f in diagnose(path, img_size=30)
                if f.check == "weights.input_size").level == "error"
    assert next(f for f in diagnose(path, img_size=32)
                if f.check == "weights.input_size").level == "ok"


def test_a_224_checkpoint_asked_for_384(tmp_path):
    vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224"), tmp_path / "t.safetensors")
    fit = next(f for f in diagnose(tmp_path / "t.safetensors", img_size=384)
               if f.check == "weights.input_size")
    assert fit.level == "warning"
    assert (fit.measured["table_rows"], fit.measured["rows_needed"]) == (197, 577)
    assert "interpolates it bicubic from 14x14 to 24x24" in fit.why
    assert fit.fix.endswith("resized.safetensors --img-size 384")


def test_keys_left_at_init_by_a_non_strict_load_are_an_error(trained, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(trained[0] / "last.safetensors")
    del state["blocks.1.mlp.fc1.weight"]
    save_file(state, tmp_path / "loose.safetensors")
    torch.save(state, tmp_path / "loose.pth")
    model = vitkit.load_model(tmp_path / "loose.pth", strict=False, verbose=False)
    finding = weights.check_load_record(weights.Weights.of_model(model), {})[0]
    assert finding.level == "error" and "blocks.1.mlp.fc1.weight" in finding.summary
    # the doctor loads non-strictly itself: the missing key is a finding, not exit code 2
    found = [f for f in diagnose(tmp_path / "loose.safetensors") if f.check == "weights.load"]
    assert found[0].level == "error" and "blocks.1.mlp.fc1.weight" in found[0].summary


# -------------------------------------------------------------------------------------- runs
def _run_folder(tmp_path, config: dict, losses: list[tuple[float, float]],
                result: dict | None = None, top1: float = 0.5):
    """A vitkit run folder: its config, one metrics row per (train, val) loss, the run.json of
    200,000 images of 10 classes, and ``result`` as its result.json."""
    import yaml

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = ["epoch,step,train_loss,val_loss,val_top1"]
    rows += [f"{i + 1},{100 * (i + 1)},{t},{v},{top1}" for i, (t, v) in enumerate(losses)]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "run.json").write_text(json.dumps(plan_run(config, 200_000, 10).to_dict()))
    if result is not None:
        (tmp_path / "result.json").write_text(json.dumps(result))
    return tmp_path


def test_sgd_at_lr_0_1_is_a_cnn_recipe(tmp_path):
    folder = _run_folder(tmp_path, dict(model="vit_base_patch16_224", opt="sgd", lr=0.1,
                                        warmup_epochs=0, clip_grad=0, weight_decay=1e-4,
                                        epochs=90), [(2.0, 2.1), (1.8, 1.9), (1.6, 1.8)])
    recipe = [f for f in diagnose(folder) if f.check == "run.recipe"]
    summaries = " | ".join(f.summary for f in recipe)
    assert all(f.level == "warning" for f in recipe)
    assert "SGD from scratch: a CNN recipe, without warmup or gradient clipping" in summaries
    assert "weight decay 0.0001" in summaries


def test_a_run_stuck_at_ln_classes_is_not_learning(tmp_path):
    stuck = [(math.log(10) + d, math.log(10)) for d in (0.01, -0.02, 0.005, 0.0)]
    folder = _run_folder(tmp_path, dict(model="vit_small_patch16_224", lr=5e-4, epochs=4,
                                        warmup_epochs=1, recipe="plain", batch_size=64),
                         stuck, top1=0.1)  # validation at chance too
    assert main(["doctor", str(folder)]) == 1
    assert levels(diagnose(folder))["run.learning"] == "error"


def test_an_overfitting_run_and_loss_spikes_are_warnings(tmp_path):
    over = [(2.0, 2.0), (1.0, 1.2), (0.4, 1.1), (0.1, 1.6)]
    found = levels(diagnose(_run_folder(tmp_path / "over", dict(model="vit_tiny", lr=5e-4),
                                        over)))
    assert found["run.overfitting"] == "warning"
    spikes = [(2.0, 2.0), (1.5, 1.6), (1.2, 1.3), (3.5, 3.0), (1.1, 1.2)]
    found = levels(diagnose(_run_folder(tmp_path / "spike", dict(model="vit_tiny", lr=5e-4),
                                        spikes)))
    assert found["run.stability"] == "warning"
    stopped = dict(stopped="non-finite", step=25, epoch=2, loss="nan", epochs=1)
    nan = _run_folder(tmp_path / "nan", dict(model="vit_tiny"), [(2.0, 2.0)], result=stopped)
    found = next(f for f in diagnose(nan) if f.check == "run.stability")
    assert found.level == "error" and "(nan) at step 25 (epoch 2)" in found.summary


def test_train_says_the_small_data_and_recipe_warnings_at_its_start(tmp_path):
    cfg = resolve(dict(model="vit_nano_patch4_32", warmup_epochs=0, weight_decay=0.5,
                       randaugment=9, mixup=0.8, epochs=5, lr=2.0)).to_dict()
    found = start_of_run(cfg, plan_run(cfg, 1000, 10))
    text = " | ".join(f.summary for f in found if f.level == "warning")
    for words in ("from scratch on 1,000 images", "no learning-rate warmup",
                  "AdamW at lr 0.25 from scratch",
                  "weight decay 0.5", "RandAugment with MixUp/CutMix for 5 epochs"):
        assert words in text


def test_a_warmup_in_steps_or_a_ratio_counts_as_warmup():
    def warns(**warmup):
        cfg = {**resolve(dict(model="vit_nano_patch4_32", steps=150)).to_dict(),
               "warmup_epochs": 0, **warmup}
        return any("no learning-rate warmup" in f.summary
                   for f in start_of_run(cfg, plan_run(cfg, 1000, 10)))

    assert warns() and warns(warmup_steps=0)
    assert not warns(warmup_steps=15) and not warns(warmup_ratio=0.1)


def _too_hot(cfg: dict, plan) -> bool:
    return any("from scratch" in f.summary and "AdamW at lr" in f.summary
               for f in start_of_run(cfg, plan))


@pytest.mark.parametrize("scale", [dict(accum_steps=8), dict(world=8)])
def test_the_doctor_judges_the_learning_rate_the_trainer_uses(scale):
    """lr 2e-2 per 512 images at a batch of 64 is 2.5e-3 on one process, but 2e-2 (above the
    1e-2 limit) with 8 accumulation steps or on 8 processes: the doctor must see the real
    rate, as the trainer resolves it (the doctor once left out accumulation and processes)."""
    world = scale.pop("world", 1)
    cfg = resolve(dict(model="vit_nano_patch4_32", lr=2e-2, batch_size=64, epochs=5,
                       **scale)).to_dict()
    plan = plan_run(cfg, 20000, 10, world)
    assert plan.global_batch == 512 and plan.lr == pytest.approx(2e-2)
    assert _too_hot(cfg, plan)
    single = plan_run({**cfg, "accum_steps": 1}, 20000, 10, 1)
    assert single.lr == pytest.approx(2.5e-3) and not _too_hot(cfg, single)


def test_a_run_folder_is_judged_by_the_trainers_own_numbers(tmp_path):
    """`vitkit train` writes run.json (its RunPlan); the doctor's learning rate and schedule of
    the folder are those numbers, with accumulation, and with processes it cannot see in the
    config."""
    result = train(resolve(dict(data="digits", img_size=16, model="vit_nano_patch4_32", steps=2,
                                batch_size=32, accum_steps=2, lr=4e-3, out=str(tmp_path),
                                name="accum")), progress=False)
    written = json.loads((result.run_dir / "run.json").read_text())
    assert written["global_batch"] == 64 and written["lr"] == pytest.approx(4e-3 * 64 / 512)
    run = runs.read_run(result.run_dir)
    assert run.effective_lr == pytest.approx(written["lr"])
    assert f"lr {written['lr']:.3g}" in (result.run_dir / "train.log").read_text()
    # the same folder as if trained on 4 processes: only run.json can tell
    (result.run_dir / "run.json").write_text(json.dumps(
        {**written, "world": 4, "global_batch": 256, "lr": 4e-3 * 256 / 512}))
    assert runs.read_run(result.run_dir).effective_lr == pytest.approx(2e-3)


@pytest.mark.parametrize("options,words", [
    (dict(steps=150, warmup_steps=150), "a warmup of 150 steps in a run of 150"),
    (dict(epochs=4, warmup_epochs=5), "a warmup of 75 steps in a run of 60"),  # 15 steps an epoch
])
def test_a_warmup_as_long_as_the_run_is_flagged(options, words):
    for warm, flagged in ((options, True), ({**options, "warmup_steps": 1,
                                             "warmup_epochs": 0.1}, False)):
        cfg = resolve(dict(model="vit_nano_patch4_32", **warm)).to_dict()
        text = [f.summary for f in start_of_run(cfg, plan_run(cfg, 1000, 10))]
        assert any(words in t for t in text) == flagged, text


# -------------------------------------------------------------------------------------- maps
def _maps_of(trained, x):
    model = vitkit.load_model(trained[0] / "last.safetensors", verbose=False)
    with torch.no_grad():
        _, m = model(x, return_attn=True)
    return torch.stack(list(m))[:, 0].numpy()  # (layers, heads, T, T)


def _one_hot_column(a, column=5):
    e = np.zeros(a.shape[-1], dtype=a.dtype)
    e[column] = 1.0
    return 0.3 * a + 0.7 * e  # every row gives 70% to token 5


@pytest.mark.parametrize(("name", "make", "check"), [
    ("averaged", lambda a: a.mean(1), "maps.heads"),  # (layers, T, T): a 3-D array
    ("one-map", lambda a: a[-1].mean(0), "maps.heads"),  # (T, T)
    ("identical-heads", lambda a: np.repeat(a.mean(1, keepdims=True), a.shape[1], 1),
     "maps.heads"),
    ("last-layer", lambda a: a[-1:], "maps.layers"),  # (1, heads, T, T)
    ("one-layer-3d", lambda a: a[-1], "maps.heads"),  # (heads, T, T): layers cannot be told
    ("uniform", lambda a: np.full_like(a, 1 / a.shape[-1]), "maps.uniform"),
    ("sink", _one_hot_column, "maps.sinks"),
])
def test_broken_maps_files_are_caught(tmp_path, name, make, check):
    g = torch.Generator().manual_seed(0)
    good = torch.softmax(torch.randn(3, 4, 17, 17, generator=g) * 3, -1).numpy()
    np.save(tmp_path / "good.npy", good)
    assert "warning" not in levels(diagnose(tmp_path / "good.npy")).values()
    np.save(tmp_path / f"{name}.npy", make(good).astype(np.float32))
    assert levels(diagnose(tmp_path / f"{name}.npy"))[check] == "warning"


def test_a_3d_maps_array_is_not_called_one_layer(tmp_path):
    """(N, T, T) is one layer's heads or every layer with heads averaged: the layer check
    cannot tell (it once said 'one layer only' of a head-averaged stack)."""
    g = torch.Generator().manual_seed(0)
    stack = torch.softmax(torch.randn(6, 17, 17, generator=g) * 3, -1).numpy()
    np.save(tmp_path / "stack.npy", stack)
    found = levels(diagnose(tmp_path / "stack.npy"))
    assert found["maps.layers"] == "unknown" and found["maps.heads"] == "warning"


def test_maps_written_by_vitkit_attention_are_read(trained, tmp_path, capsys):
    from pathlib import Path

    import sklearn.datasets

    photo = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"
    assert main(["attention", str(photo), "--checkpoint",
                 str(trained[0] / "last.safetensors"), "--out", str(tmp_path)]) == 0
    found = levels(diagnose(tmp_path / "china_maps.npy"))
    assert found["maps.heads"] == "ok" and found["maps.layers"] == "ok"
    capsys.readouterr()
    assert main(["doctor", str(tmp_path / "china_cls_attention.npy")]) == 2
    assert "not a map on the patch grid" in capsys.readouterr().err


def test_artifact_tokens_and_attention_distance():
    norms = torch.full((3, 1, 20), 5.0) + torch.rand(3, 1, 20) * 0.1
    norms[-1, 0, 7] = 60.0
    ctx = {"layout": {"num_prefix_tokens": 1, "grid": (4, 5), "patch_size": 8}}
    found = maps.check_artifacts(norms, ctx)
    assert found.level == "warning" and found.measured["outliers"] == [7]
    assert stats.outlier_tokens(torch.tensor([1.0, 1.1, 0.9, 1.0, 9.0])).tolist() == [4]
    # a head attending to itself looks 0 px away; uniform attention looks the mean distance
    t = 1 + 20
    local = [torch.eye(t)[None, None].expand(1, 2, t, t)] * 3
    assert maps.check_distance(local, ctx).level == "ok"
    uniform = [torch.full((1, 2, t, t), 1 / t)] * 3
    assert maps.check_distance(uniform, ctx).level == "warning"
    assert stats.mean_attention_distance(uniform, (4, 5), 8, 1)[0, 0].item() == pytest.approx(
        stats.uniform_distance((4, 5), 8), rel=1e-5)


def test_the_rule_table_names_every_check_once():
    from vitkit.diagnose import RULES

    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.looks_at for r in RULES} == {"model", "run", "maps", "computed", "norms", "audit"}
    assert runs.SMALL_DATA == 100_000 and maps.UNIFORM == 0.95


def test_a_run_that_diverges_at_once_keeps_its_folder_for_the_doctor(tmp_path, monkeypatch):
    """NaN at the first step, before any checkpoint: the folder stays with its log (it was
    once removed as 'a run that failed before it trained'), and the doctor reads it."""
    build = trainer.build_model

    def poisoned(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_hook(
            lambda module, inputs, output: output * float("nan") if module.training else output)
        return model

    monkeypatch.setattr(trainer, "build_model", poisoned)
    with pytest.raises(NonFiniteLoss, match="became nan at step 1"):
        train(resolve(dict(data="digits", img_size=16, model="vit_nano_patch4_32", steps=5,
                           batch_size=32, out=str(tmp_path), name="nan")), progress=False)
    folder = tmp_path / "nan"
    assert "loss became nan" in (folder / "train.log").read_text()  # for people
    ended = json.loads((folder / "result.json").read_text())  # for the doctor
    assert ended == dict(stopped="non-finite", step=1, epoch=1, loss="nan", epochs=0)
    (folder / "train.log").write_text("reworded: every line of the log says something else\n")
    found = next(f for f in diagnose(folder) if f.check == "run.stability")
    assert found.level == "error" and "non-finite (nan) at step 1" in found.summary
    assert main(["doctor", str(folder)]) == 1


@pytest.mark.parametrize("name", ["healthy", "nan", "diverging", "overfitting", "lr-too-high",
                                  "finetune", "short"])
def test_the_doctor_reads_no_log(tmp_path, name):
    """Every real run's findings are the same with its train.log reworded or gone: the
    doctor reads config.yaml, metrics.csv, run.json and result.json only."""
    import shutil

    from doctor_catalogue import DATA

    folder = Path(shutil.copytree(DATA / name, tmp_path / name))
    before = [(f.check, f.level, f.summary) for f in diagnose(folder)]
    (folder / "train.log").write_text("data digits: 9 train, 1 val images, 99 classes\n"
                                      "99 process(es)\nthe loss became nan\n")
    assert [(f.check, f.level, f.summary) for f in diagnose(folder)] == before
    (folder / "train.log").unlink()
    assert [(f.check, f.level, f.summary) for f in diagnose(folder)] == before


def test_the_start_and_the_end_of_a_run_judge_its_recipe_alike(tmp_path):
    """The pre-flight check and the end-of-run check see the same plan, so they say the same
    about the recipe (heavy augmentation in a --steps run was once only flagged at the end)."""
    result = train(resolve(dict(data="digits", img_size=16, model="vit_nano_patch4_32",
                                steps=30, batch_size=64, lr=5e-2, randaugment=2, mixup=0.8,
                                out=str(tmp_path), name="r")), progress=False)
    plan = RunPlan(**json.loads((result.run_dir / "run.json").read_text()))
    config = runs.read_run(result.run_dir).config
    start = {f.summary for f in start_of_run(config, plan) if f.check == "run.recipe"}
    end = {f.summary for f in diagnose(result.run_dir) if f.check == "run.recipe"}
    assert start == end and any("RandAugment with MixUp/CutMix" in s for s in start), (start, end)


DATA = Path(__file__).parent / "data" / "doctor"


def test_a_fine_tune_under_strong_augmentation_learns_by_validation():
    """The real fine-tune with --recipe finetune: its training loss sits above chance (label
    smoothing, drop path, crop 0.5, flips on digits) while validation top-1 is 0.89. A
    warning that the two disagree, with the numbers; never "diverging"."""
    found = {f.check: f for f in diagnose(DATA / "finetune")}
    learning = found["run.learning"]
    assert learning.level == "warning"
    assert "sits above chance" in learning.summary and "validation is good" in learning.summary
    assert "diverging" not in learning.summary and "not learning" not in learning.summary
    m = learning.measured
    assert m["train_loss"] > m["ln_classes"] > m["val_loss"] and m["val_top1"] > 0.8
    assert m["augmentation"] == ("label smoothing 0.1, stochastic depth 0.1, crop scale 0.5, "
                                 "horizontal flips")
    assert "--no-hflip" in learning.fix and "crop" in learning.fix
    bad = {f.check: f for f in diagnose(DATA / "finetune-diverging")}["run.learning"]
    assert bad.level == "error" and bad.summary.startswith("diverging")
    assert "validation is no better" in bad.summary


def test_the_augmentation_is_read_from_vitkit_and_timm_names():
    from vitkit.diagnose.runs import augmentation

    assert augmentation({"label_smoothing": 0.1, "crop_scale": 1.0, "hflip": False}) == \
        {"label_smoothing": 0.1}
    assert augmentation({"mixup": "0.8", "cutmix": 0, "hflip": True, "crop_scale": 0.08}) == \
        {"mixup": 0.8, "hflip": 1.0, "crop_scale": 0.08}
    from vitkit.diagnose import foreign

    folder = DATA / "timm-healthy"
    run = foreign.read_timm(next(folder.glob("**/args.yaml")).parent)
    # that run was made with --smoothing 0 and timm's default crop, scale (0.08, 1)
    assert augmentation(run.config) == {"crop_scale": 0.08}


def test_vitkit_train_writes_the_doctors_verdict_on_an_augmented_fine_tune(tmp_path):
    result = train(resolve(dict(init=str(DATA / "demo-recipe.safetensors"),
                                data="cluttered-digits", data_size=300, img_size=32,
                                recipe="finetune", lr=1e-4, steps=4, out=str(tmp_path),
                                name="ft")), progress=False)
    saved = json.loads((result.run_dir / "doctor.json").read_text())["findings"]
    written = next(f for f in saved if f["check"] == "run.learning")
    again = next(f for f in diagnose(result.run_dir) if f.check == "run.learning")
    assert (written["level"], written["summary"]) == (again.level, again.summary)
    assert written["level"] != "error"  # a good model under its recipe's augmentation


def test_the_attention_spectrum_is_the_largest_singular_value_over_the_random_edge():
    from vitkit.diagnose.weights import _largest_singular, attention_spectrum

    rng = np.random.default_rng(1)
    noise = rng.standard_normal((96, 96)) * 0.02
    spike = noise + 0.3 * np.outer(rng.standard_normal(96), rng.standard_normal(96)) / 96
    for m in (noise, spike):
        exact = np.linalg.svd(m, compute_uv=False)[0]
        assert _largest_singular(m) == pytest.approx(exact, rel=0.02 if m is noise else 1e-4)
    fresh = vitkit.create_model("vit_nano_patch4_32", num_classes=10)
    assert 0.9 < attention_spectrum(weights.Weights.of_model(fresh)) < 1.1


def test_a_redrawn_table_in_a_trained_model_with_quiet_layernorms_is_found(tmp_path):
    """The demo recipe's ViT: top-1 0.90, LayerNorms moved only 0.016 (below the 0.02 that
    alone would say "trained"); its attention spectra say it was trained."""
    model = vitkit.load_model(DATA / "demo-recipe.safetensors", verbose=False)
    assert not [f for f in diagnose(DATA / "demo-recipe.safetensors")
                if f.level in ("warning", "error") and f.check.startswith("weights.")]
    with torch.no_grad():
        _reinit_table(model)
    path = vitkit.save_model(model, tmp_path / "redrawn.safetensors")
    table = next(f for f in diagnose(path) if f.check == "weights.position_table")
    assert table.level == "warning" and "freshly initialised" in table.summary
    assert table.measured["blocks_layernorm_moved"] < 0.02
    assert table.measured["attention_spectrum"] > 2
