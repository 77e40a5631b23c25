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
