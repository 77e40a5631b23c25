"""The package as users install it: a light `import vitkit`, `python -m vitkit`, the extras."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_import_vitkit_pulls_in_no_optional_dependency():
    code = ("import sys, vitkit; print(' '.join(m for m in ('matplotlib', 'tensorboard', "
            "'sklearn', 'torchvision', 'yaml', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_python_dash_m_vitkit_is_the_vitkit_command():
    out = subprocess.run([sys.executable, "-m", "vitkit", "list", "nano"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["vit_nano_patch4_32", "vit_nano_patch4_32_map"]
    bad = subprocess.run([sys.executable, "-m", "vitkit", "info", "vit_nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown model 'vit_nope'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_core_dependencies_are_ranges_and_the_extras_hold_the_rest():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0] for d in project["dependencies"]}
    assert core == {"torch", "numpy", "pillow", "safetensors"}
    assert not any("==" in d for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert {"train", "viz", "web", "docs", "dev", "all"} <= set(extras)
    pinned = {line.split("==")[0].lower() for line in
              (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    assert {"torch", "torchvision", "timm", "transformers", "mkdocs"} <= pinned


def test_importing_the_figures_keeps_a_notebooks_backend():
    code = ("import matplotlib; matplotlib.use('svg'); import vitkit.viz.plot, vitkit.viz.report;"
            " import vitkit.train.demo; print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "svg"


def test_a_command_whose_extra_is_missing_says_which_to_install(monkeypatch, capsys):
    from vitkit import cli, commands

    real = commands.load

    def without_yaml(name):
        if name == "train":
            raise ImportError("No module named 'yaml'", name="yaml")
        return real(name)

    monkeypatch.setattr(commands, "load", without_yaml)
    assert cli.main(["train", "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert "needs yaml, which is not installed" in err and "pip install '.[train,viz]'" in err
    assert cli.main(["list", "nano"]) == 0  # the other commands still work


def test_the_wheel_installs_on_its_own_and_works(tmp_path):
    """`python -m build` makes a wheel that, installed alone (no editable checkout on the
    path), imports, answers `vitkit --help` and carries the explorer's page."""
    pytest.importorskip("build")
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp_path / "dist"), str(tree)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("vitkit-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", "--target", str(site), str(wheel)], check=True,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = ("import importlib.resources as r, vitkit; print(vitkit.__file__); "
            "print(sorted(p.name for p in (r.files('vitkit.web') / 'static').iterdir()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].startswith(str(site)), out  # the wheel's copy, not this checkout
    assert {"index.html", "explorer.js", "explorer.css"} <= set(eval(out[1]))
    help_text = subprocess.run([sys.executable, "-m", "vitkit", "--help"], env=env,
                               capture_output=True, text=True, check=True).stdout
    assert all(command in help_text for command in ("train", "explore", "doctor", "study"))
    assert (site / "bin" / "vitkit").is_file()  # the console script
    assert not list(site.glob("tests")) and not list(site.glob("benchmarks"))
