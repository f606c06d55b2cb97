"""The report as one HTML file that needs nothing beside it: pictures are data: URIs."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Section", "render_page"]


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    caption: str
    png: bytes | None  # None: not drawn, ``caption`` says why


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222 }
table { border-collapse: collapse } td, th { padding: 2px 12px 2px 0; text-align: left }
td.v { font-variant-numeric: tabular-nums } img { max-width: 100%; border: 1px solid #ddd }
.missing { color: #a33 } pre { background: #f6f6f6; padding: 1em; overflow-x: auto }
table.samples td { vertical-align: top } table.samples pre { padding: 0.3em; margin: 0;
  white-space: pre-wrap; max-width: 450px }
table.evals th.eval { padding-top: 1em; font-family: monospace; font-weight: normal }
"""


def render_page(
    title: str,
    figures: Mapping[str, str],
    sections: Sequence[Section],
    missing: Sequence[str],
    config_text: str,
    samples: str = "",
    evals: str = "",
) -> str:
    """The page: headline figures, what is missing, every picture, the evaluations of
    checkpoints (``evals``: HTML that evals.py built, escaped there), the samples the model
    wrote (``samples``: HTML that samples.py built, every dumped value escaped there), the
    configuration."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<table>",
        *(f"<tr><th>{e(k)}</th><td class=v>{e(v)}</td></tr>" for k, v in figures.items()),
        "</table>",
    ]
    if missing:
        parts.append("<h2>Not in this run directory</h2><ul class=missing>")
        parts.extend(f"<li>{e(m)}</li>" for m in missing)
        parts.append("</ul>")
    for s in sections:
        parts.append(f"<h2>{e(s.title)}</h2>")
        if s.png is None:
            parts.append(f"<p class=missing>{e(s.caption)}</p>")
            continue
        data = base64.b64encode(s.png).decode("ascii")
        parts.append(
            f'<p>{e(s.caption)}</p><img alt="{e(s.title)}" src="data:image/png;base64,{data}">'
        )
    if evals:
        parts.append(f"<h2>Evaluations</h2>{evals}")
    if samples:
        parts.append(f"<h2>Samples</h2>{samples}")
    if config_text:
        parts.append(f"<h2>Configuration</h2><pre>{e(config_text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
