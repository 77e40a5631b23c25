"""The package as users install it: a light `import vitkit`, `python -m vitkit`, the extras."""

import subprocess
import sys
from pathlib import Path

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
    assert out.stdout.split() == ["vit_nano_patch4_32"]
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
            " import vitkit.commands.demo; print(matplotlib.get_backend())")
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
    assert "needs yaml, which is not installed" in err and "vitkit[train,viz]" in err
    assert cli.main(["list", "nano"]) == 0  # the other commands still work
