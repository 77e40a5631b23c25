"""MkDocs hook: publish the committed figures of ``benchmarks/results/`` under ``results/``.

The pages show ``results/study.png`` and the like; the files stay where the benchmark scripts
write them, so the site never carries a second copy that could drift from the results.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files, config):
    for figure in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{figure.name}", abs_src_path=str(figure)))
    return files
