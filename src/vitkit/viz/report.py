"""A self-contained HTML report: headings, paragraphs, tables and PNG images embedded as
base64, so one file can be mailed, archived or opened offline."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from vitkit.util.files import atomic_write

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; }
"""


class Report:
    """Build with ``heading``/``text``/``table``/``image``, then ``write(path)``."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = [f"<h1>{html.escape(title)}</h1>"]

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str) -> None:
        self.parts.append(f"<p>{html.escape(text)}</p>")

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                       + "</tr>" for row in rows)
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def image(self, path: str | os.PathLike, caption: str = "") -> None:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self.parts.append(f'<figure><img alt="{html.escape(caption or Path(path).name)}" '
                          f'src="data:image/png;base64,{data}">{cap}</figure>')

    def write(self, path: str | os.PathLike) -> Path:
        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(self.title)}</title><style>{_STYLE}</style></head>"
                f"<body>{''.join(self.parts)}</body></html>\n")
        return atomic_write(path, lambda tmp: tmp.write_text(page, encoding="utf-8"))
