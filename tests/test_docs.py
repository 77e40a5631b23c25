"""The documentation agrees with the registries it describes: every format, export, method,
data spec and command is documented, nothing documented is missing from the code, and the
reading order is the same in the README, the site's navigation and its overview page."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from vitkit.checkpoints.formats import EXPORTS, FORMATS
from vitkit.commands import COMMANDS
from vitkit.data.datasets import DATASETS
from vitkit.deploy import DEPLOY
from vitkit.explain import METHODS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _table_keys(text: str, heading: str) -> list[str]:
    """The backticked names in the first column of the table under the header row that
    starts with ``| heading |``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {heading} |"))
    keys = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        keys += re.findall(r"`([^`]+)`", line.split("|")[1])
    return keys


def test_every_format_is_documented_and_the_detection_order_is_the_registrys():
    text = (DOCS / "checkpoints.md").read_text()
    for fmt in FORMATS:
        assert f"`{fmt.NAME}`" in text, f"docs/checkpoints.md does not name format {fmt.NAME}"
    order = ", ".join(f"`{f.NAME}`" for f in FORMATS)
    assert f"tried in the order of `vitkit.checkpoints.FORMATS` ({order})" in text
    bar = "\\|"  # a table cell escapes its bars
    assert f"`--to {bar.join((*EXPORTS, *DEPLOY))}`" in text


def test_the_methods_table_is_the_registry():
    text = (DOCS / "explain.md").read_text()
    assert _table_keys(text, "method") == list(METHODS)
    listed = re.search(r"\| `--method M` \| (.*?) \(from `METHODS`\)", text).group(1)
    assert re.findall(r"`([^`]+)`", listed) == list(METHODS)


def test_the_data_table_is_the_registry():
    documented = set(_table_keys((DOCS / "training.md").read_text(), "`--data`"))
    assert documented == set(DATASETS)


def test_every_command_is_in_the_readme_and_the_docs():
    readme = (ROOT / "README.md").read_text()
    table = [re.match(r"\| `vitkit (\S+?)[` ]", line).group(1)
             for line in readme.splitlines() if line.startswith("| `vitkit ")]
    assert table == list(COMMANDS)
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    for name in COMMANDS:
        assert re.search(rf"^#+ .*`vitkit {name}", docs, re.M), f"no docs section: vitkit {name}"


def test_the_reading_order_is_the_same_everywhere():
    nav = [next(iter(item.values())) for item in
           yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]]
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Documentation"):]
    in_readme = re.findall(r"^\d+\. \[[^\]]+\]\(docs/([^)]+)\)", section, re.M)
    assert in_readme == nav
    index = (DOCS / "index.md").read_text()
    section = index[index.index("## Reading order"):]
    in_index = re.findall(r"^\d+\. \[[^\]]+\]\(([^)]+)\)", section, re.M)
    assert in_index == nav[1:]  # the overview page lists the pages after itself
