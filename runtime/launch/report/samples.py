"""The report's samples: what the model wrote, from the rollout dumps (``run.dump_rollouts``).

The steps dumped are split into a few ranges of equal length; each range shows its best
and its worst sample by reward, with prompt, response (shortened), reward and its parts,
and advantage. Filtered groups are counted, with a few of their reasons.

Every value from a dump is model output or task data, untrusted text: it is HTML-escaped
here, before it reaches the page.
"""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

from asyncrl.runtime.contract.rollout_dumps import RolloutDumps

__all__ = ["RANGES", "SHORTENED", "samples_html", "step_ranges"]

RANGES = 5  # step ranges the run is split into
SHORTENED = 400  # characters of a response shown; the rest is cut, its length said
_PROMPT_SHORTENED = 200
_REASONS = 3  # filtered reasons listed


def step_ranges(steps: list[int], ranges: int = RANGES) -> list[tuple[int, int]]:
    """``steps`` (sorted) split into at most ``ranges`` spans of equal length, first and
    last step of each; spans with no step dumped are left out."""
    if not steps:
        return []
    first, last = steps[0], steps[-1]
    width = max(1, -(-(last - first + 1) // ranges))
    spans = []
    for start in range(first, last + 1, width):
        end = min(start + width - 1, last)
        if any(start <= s <= end for s in steps):
            spans.append((start, end))
    return spans


def samples_html(dumps: RolloutDumps) -> str:
    """The samples section's HTML body (its heading is the page's), every value escaped."""
    e = html.escape
    parts: list[str] = []
    steps = sorted(dumps.trained)
    if steps:
        parts.append(
            f"<p>{sum(len(v) for v in dumps.trained.values())} trained samples dumped over "
            f"{len(steps)} steps; per step range, the best and the worst by reward.</p>"
        )
        parts.append(
            "<table class=samples><tr><th>steps</th><th></th><th>step</th><th>group</th>"
            "<th>reward</th><th>parts</th><th>advantage</th><th>prompt</th>"
            "<th>response</th></tr>"
        )
        for start, end in step_ranges(steps):
            lines = [x for s in steps if start <= s <= end for x in dumps.trained[s]]
            ranked = sorted(lines, key=_reward)
            chosen = [("best", ranked[-1])] + ([("worst", ranked[0])] if len(ranked) > 1 else [])
            for label, line in chosen:
                parts.append(_row(f"{start}-{end}", label, line))
        parts.append("</table>")
    else:
        parts.append("<p>No trained sample dumped yet.</p>")
    if dumps.filtered:
        groups = {line.get("gid") for line in dumps.filtered}
        reasons = Counter(str(line.get("filtered", "")) for line in dumps.filtered)
        listed = "".join(
            f"<li>{e(reason)} ({n} samples)</li>" for reason, n in reasons.most_common(_REASONS)
        )
        parts.append(
            f"<p>{len(groups)} groups filtered out ({len(dumps.filtered)} samples); "
            f"the commonest reasons:</p><ul>{listed}</ul>"
        )
    notes = []
    if dumps.skipped:
        notes.append(f"{dumps.skipped} lines skipped (torn by a kill, or of another format)")
    if dumps.superseded:
        notes.append(f"{dumps.superseded} lines of steps trained again after a restart left out")
    if notes:
        parts.append(f"<p>{e('; '.join(notes))}.</p>")
    return "\n".join(parts)


def _reward(line: dict[str, Any]) -> float:
    reward = line.get("reward")
    return float(reward) if isinstance(reward, int | float) else float("-inf")


def _row(span: str, label: str, line: dict[str, Any]) -> str:
    e = html.escape
    parts = line.get("reward_parts")
    parts_text = (
        ", ".join(f"{name} {_number(value)}" for name, value in parts.items())
        if isinstance(parts, dict)
        else ""
    )
    cells = [
        span,
        label,
        str(line.get("step", "")),
        str(line.get("gid", "")),
        _number(line.get("reward")),
        parts_text,
        _number(line.get("advantage")),
    ]
    row = "".join(f"<td>{e(cell)}</td>" for cell in cells)
    prompt = _shortened(line.get("prompt"), _PROMPT_SHORTENED)
    response = _shortened(line.get("response"), SHORTENED)
    if line.get("truncated") is True:
        response += " [truncated]"
    return f"<tr>{row}<td><pre>{e(prompt)}</pre></td><td><pre>{e(response)}</pre></td></tr>"


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else ""


def _shortened(text: object, at: int) -> str:
    text = text if isinstance(text, str) else ""
    return text if len(text) <= at else f"{text[:at]}... ({len(text)} characters)"
