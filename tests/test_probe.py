"""``vitkit probe`` and ``vitkit.backbone``'s kNN and linear probe: the weighted kNN vote equals
DINOv2's protocol written out in plain loops, the linear probe equals scikit-learn's
LogisticRegression fitted here with the C it chose (and that C is the held-out best), the
command runs end to end on features folders and on a checkpoint, and its refusals (one class,
features of different models or preprocessing, missing shards) are exit 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.backbone import knn_eval, knn_scores, linear_probe, read_features
from vitkit.cli import main
from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess
from vitkit.errors import DataError

VITKIT = str(Path(sys.executable).with_name("vitkit"))


def reference_votes(train, train_labels, queries, k, T, classes):
    """DINOv2's kNN, one query and one neighbour at a time."""
    out = np.zeros((len(queries), classes))
    bank = [t / math.sqrt(sum(v * v for v in t)) for t in train]
    for q, query in enumerate(queries):
        query = query / math.sqrt(sum(v * v for v in query))
        sims = [float(sum(a * b for a, b in zip(query, t, strict=True))) for t in bank]
        order = sorted(range(len(bank)), key=lambda j: -sims[j])[:k]
        for j in order:
            out[q, train_labels[j]] += math.exp(sims[j] / T)
        out[q] /= out[q].sum()
    return out


def test_the_knn_vote_equals_the_protocol_written_out():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((5, 16))
    train_labels = rng.integers(0, 5, 120)
    train = centres[train_labels] + 1.5 * rng.standard_normal((120, 16))
    val_labels = rng.integers(0, 5, 30)
    val = centres[val_labels] + 1.5 * rng.standard_normal((30, 16))
    ks = (1, 5, 20)
    got = knn_scores(train, train_labels, val, ks=ks, temperature=0.07, num_classes=5)
    result = knn_eval(train, train_labels, val, val_labels, ks=ks, num_classes=5)
    for k, row in zip(ks, result["results"], strict=True):
        want = reference_votes(train, train_labels, val, k, 0.07, 5)
        np.testing.assert_allclose(got[k], want, atol=1e-5)
        top1 = np.mean([np.argmax(w) == y for w, y in zip(want, val_labels, strict=True)])
        top5 = np.mean([y in np.argsort(-w, kind="stable")[:5] and w[y] > 0
                        for w, y in zip(want, val_labels, strict=True)])
        assert row["k"] == k and math.isclose(row["top1"], 100 * top1)
        assert math.isclose(row["top5"], 100 * top5)
    assert 0 < result["results"][2]["top1"] < 100  # a task neither trivial nor hopeless


def test_a_k_above_the_training_set_is_capped_and_said():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40, 8)), np.arange(40) % 4
    result = knn_eval(x, y, x[:10], y[:10], ks=(10, 200))
    assert [(r["k"], r["k_used"]) for r in result["results"]] == [(10, 10), (200, 40)]
    assert result["notes"] == ["k=200 capped at 40, the number of training features"]


def test_the_linear_probe_equals_sklearn_with_the_c_it_chose():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    centres = 2 * rng.standard_normal((4, 10))
    y = rng.integers(0, 4, 200)
    x = centres[y] + 2.0 * rng.standard_normal((200, 10))
    yv = rng.integers(0, 4, 80)
    xv = centres[yv] + 2.0 * rng.standard_normal((80, 10))
    grid = (1e-4, 1e-2, 1.0, 1e2)
    result = linear_probe(x, y, xv, yv, grid=grid)
    # the held-out tenth (seed 0), each C fitted on the rest: the chosen one is the best
    order = np.random.default_rng(0).permutation(200)
    held, fit = order[:20], order[20:]
    accuracy = {C: 100 * np.mean(LogisticRegression(C=C, max_iter=1000).fit(
        x[fit], y[fit]).predict(x[held]) == y[held]) for C in grid}
    assert [r["holdout_top1"] for r in result["sweep"]] == pytest.approx(
        [accuracy[C] for C in grid])
    assert result["C"] == max(grid, key=lambda C: (accuracy[C], -C))
    clf = LogisticRegression(C=result["C"], max_iter=1000).fit(x, y)
    probs = clf.predict_proba(xv)
    assert result["top1"] == pytest.approx(100 * np.mean(probs.argmax(1) == yv))
    top5 = np.mean([label in np.argsort(-p)[:5] for p, label in zip(probs, yv, strict=True)])
    assert result["top5"] == pytest.approx(100 * top5)
    assert 30 < result["top1"] < 100
    with pytest.raises(DataError, match="two classes or more"):
        linear_probe(x, np.zeros(200, int), xv, yv)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Features of a tiny random ViT on the digits' two splits, and of a second model."""
    root = tmp_path_factory.mktemp("probe")
    torch.manual_seed(0)
    for name in ("a", "b"):
        vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=10),
                          root / f"{name}.safetensors")
    for model, split, extra in (("a", "train", []), ("a", "val", []), ("b", "val", []),
                                ("a", "val", ["--img-size", "48"])):
        out = root / f"{model}-{split}{'-48' if extra else ''}"
        assert main(["features", str(root / f"{model}.safetensors"), "--data", "digits",
                     "--split", split, "--limit", "150", "--shard-size", "64", "--out",
                     str(out), *extra]) == 0
    return root


def test_the_command_on_features_folders(folders, tmp_path, capsys):
    out = tmp_path / "p"
    saved = tmp_path / "probed.safetensors"
    code = main(["probe", "--features", str(folders / "a-train"), "--val-features",
                 str(folders / "a-val"), "--out", str(out), "--c-grid", "0.01,1",
                 "--save-model", str(saved)])
    done = capsys.readouterr()
    assert code == 0, done.err
    record = json.loads((out / "probe.json").read_text())
    train, _ = read_features(folders / "a-train")
    val, _ = read_features(folders / "a-val")
    want = knn_eval(train["pooled"], train["label"], val["pooled"], val["label"],
                    num_classes=10)
    assert record["knn"]["results"] == want["results"]
    assert record["knn"]["notes"] == ["k=200 capped at 150, the number of training features"]
    assert f"kNN k=10: top-1 {want['results'][0]['top1']:.2f}%" in done.out
    lin = record["linear"]
    assert [r["C"] for r in lin["sweep"]] == [0.01, 1.0] and lin["C"] in (0.01, 1.0)
    assert 0 <= lin["top1"] <= lin["top5"]
    assert f"linear probe (C={lin['C']:g})" in done.out
    # the saved classifier: the same backbone, and the probe as its head
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=lin["C"], max_iter=1000).fit(
        train["pooled"].astype(np.float64), train["label"])
    model = vitkit.load_model(saved, verbose=False).eval()
    assert model.num_classes == 10 and f"wrote {saved}" in done.out
    split = load_split("digits", "val", 32)
    x = torch.stack([Preprocess(32)(split[i][0]) for i in range(150)])
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model(x)
    np.testing.assert_allclose(pooled.numpy(), val["pooled"], atol=1e-5)
    want = clf.predict(val["pooled"].astype(np.float64))
    assert logits.argmax(1).tolist() == want.tolist()
    assert len(set(want.tolist())) > 2  # not one class predicted for everything
    np.testing.assert_allclose(logits.softmax(1).numpy(),
                               clf.predict_proba(val["pooled"].astype(np.float64)), atol=1e-4)
    page = (out / "probe.md").read_text()
    assert "| 200 (150) |" in page and "not standardised" in page
    with Image.open(out / "knn.png") as img:
        assert img.size[0] > 100


def test_the_command_on_a_checkpoint_embeds_both_splits(folders, tmp_path):
    """Through the console script, as a user runs it."""
    out = tmp_path / "p"
    done = subprocess.run([VITKIT, "probe", str(folders / "a.safetensors"), "--data", "digits",
                           "--limit", "150", "--k", "5,10", "--no-linear", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "probe.json").read_text())
    a, _ = read_features(out / "features-val")
    b, _ = read_features(folders / "a-val")
    np.testing.assert_array_equal(a["pooled"], b["pooled"])
    assert [r["k"] for r in record["knn"]["results"]] == [5, 10] and record["linear"] is None


def _one_class(folders, tmp_path):
    """Features folders of the two splits of one class (digits:3), from model a."""
    for split in ("train", "val"):
        assert main(["features", str(folders / "a.safetensors"), "--data", "digits:3",
                     "--split", split, "--out", str(tmp_path / f"one-{split}")]) == 0
    return tmp_path / "one-train", tmp_path / "one-val"


@pytest.mark.parametrize(("case", "said"), [
    ("models", "different models (weights sha256"),
    ("preprocessing", "different preprocessing (img_size [32, 32] and [48, 48])"),
    ("missing", "misses 1 of its 3 shards (features-00002.safetensors)"),
    ("one-class", "holds one class (3); a probe needs two or more"),
    ("both", "give either CHECKPOINT --data SPEC"),
    ("save-cls", "--save-model writes the linear probe as the model's head, which reads the "
                 "pooled embedding; got --feature cls"),
])
def test_refusals_are_one_message_and_exit_2(folders, tmp_path, capsys, case, said):
    train, val = folders / "a-train", folders / "a-val"
    if case == "models":
        val = folders / "b-val"
    elif case == "preprocessing":
        val = folders / "a-val-48"
    elif case == "missing":
        val = tmp_path / "copy"
        val.mkdir()
        for p in (folders / "a-val").iterdir():
            if p.name != "features-00002.safetensors":
                (val / p.name).write_bytes(p.read_bytes())
    elif case == "one-class":
        train, val = _one_class(folders, tmp_path)
    extra = [str(folders / "a.safetensors")] if case == "both" else []
    if case == "save-cls":
        extra = ["--feature", "cls", "--save-model", str(tmp_path / "m.safetensors")]
    code = main(["probe", *extra, "--features", str(train), "--val-features", str(val),
                 "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "p" / "probe.json").exists()
