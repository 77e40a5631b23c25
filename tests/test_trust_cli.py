"""`vitkit trust`: the trust table of every applicable method on a checkpoint, and the committed
faithfulness benchmark's code path on a tiny model (it once stopped at a method the model
refuses, so the README's numbers could not be regenerated)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from doctor_catalogue import TRAINED

import vitkit
from vitkit.cli import main
from vitkit.explain.lrp import BUDGET_PARTS
from vitkit.explain.registry import applicable

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--count", "4", "--random", "3", "--steps", "4", "--sanity-images", "2"]


def test_trust_writes_the_table_for_every_applicable_method(tmp_path, capsys):
    assert main(["trust", str(TRAINED), "--data", "cluttered-digits", *FAST,
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "left out: map (does not apply to this model's readout)" in out
    with open(tmp_path / "trust.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    model = vitkit.load_model(TRAINED, verbose=False)
    assert [r["method"] for r in rows] == applicable(model.cfg)
    for r in rows:
        assert 0.0 <= float(r["percentile_vs_random"]) <= 1.0
        assert r["randomisation"] in ("pass", "fail") and r["pointing"] != ""
        assert {"deletion_noisy-linear", "insertion_blur"} <= set(r)
        # the verdict column is the rule the explorer shows: 90% of random maps and both checks
        trusted = (float(r["percentile_vs_random"]) >= 0.9 and r["randomisation"] == "pass"
                   and r["class_sensitivity"] == "pass")
        assert r["verdict"] == ("trust" if trusted else "trust less"), r
        # where each LRP method's logit goes: shares of the five parts, summing to one
        shares = [r.get(f"budget_{part}", "") for part in BUDGET_PARTS]
        if r["method"] in ("attnlrp", "cp-lrp"):
            assert abs(sum(float(v) for v in shares) - 1) < 1e-4, shares
            assert float(r["budget_pixels"]) > 0
        else:
            assert shares == [""] * len(BUDGET_PARTS)
    assert (tmp_path / "trust.png").stat().st_size > 1000
    assert "| rollout |" in (tmp_path / "trust.md").read_text()


def test_trust_on_image_files_and_chosen_methods(tmp_path, capsys):
    import sklearn.datasets

    photos = Path(sklearn.datasets.__file__).parent / "images"
    assert main(["trust", str(TRAINED), str(photos), *FAST, "--methods", "chefer", "rollout",
                 "--baselines", "constant"]) == 0
    out = capsys.readouterr().out
    assert "| chefer |" in out and "| rollout |" in out and "pointing" not in out
    assert "deletion noisy-linear" not in out


def test_trust_answers_mistakes_with_a_message(capsys):
    assert main(["trust", str(TRAINED)]) == 2
    assert "give either --data SPEC or image files" in capsys.readouterr().err
    assert main(["trust", str(TRAINED), "--data", "digits", "--random", "0"]) == 2
    assert "--random must be 1 or more" in capsys.readouterr().err


def test_the_faithfulness_benchmark_runs_on_a_tiny_model(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "explain_faithfulness.py"), "--checkpoint",
         str(TRAINED), "--eval", "4", "--random", "2", "--steps", "4", "--sanity-images", "2",
         "--out", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "explain_faithfulness.md").read_text()
    assert "| random |" in text and "| chefer |" in text
    assert "Left out: map (does not apply to this model's readout)." in text
    assert (tmp_path / "explain_faithfulness.png").exists()


def test_the_verdicts_floor_is_the_constant_baseline_whatever_baselines_are_asked():
    from vitkit.data import cluttered_digits
    from vitkit.explain import trust
    from vitkit.explain.registry import explain_map

    model = vitkit.load_model(TRAINED, verbose=False)
    x = cluttered_digits(8, "val", canvas=32, align=4, seed=2).images
    e = explain_map(model, x, "cls")
    kw = dict(n=10, steps=8)
    floors = {b: trust.random_floor(model, x, e.map, e.target, baseline=b, **kw)
              .percentile.mean().item() for b in ("blur", "constant")}
    assert floors["blur"] != floors["constant"]  # else the test could not tell them apart
    kw = dict(n_random=10, steps=8)
    blur = trust.score_maps(model, x, e.map, e.target, baselines=("blur",), **kw)
    both = trust.score_maps(model, x, e.map, e.target, baselines=("blur", "constant"), **kw)
    assert blur["percentile_vs_random"] == both["percentile_vs_random"] == floors["constant"]
    assert "deletion_constant" not in blur
