"""The report's table of evaluations: each ``asyncrl eval`` of a checkpoint found under
``<run.dir>/eval/``, beside the run's own validation of the same version.

One block of rows per evaluation: its checkpoint, version, samples per prompt, mean@k,
pass@J, best of k, response length and prompts, then mean@k and pass@k per data source;
the column beside it holds the validation line of the run at that version (its last, if
the version was validated twice), or says there is none. The checkpoint path and the
source names are user text: everything is escaped here, before it reaches the page.
"""

from __future__ import annotations

import html
import time
from typing import Any

from .validation import largest_k, number, pass_ks, source_metric, sources

__all__ = ["evals_html"]


def evals_html(evals: list[dict[str, Any]], validation: list[dict[str, Any]]) -> str:
    """The evaluations section's HTML body (its heading is the page's), or "" if none."""
    if not evals:
        return ""
    e = html.escape
    parts = [
        f"<p>{len(evals)} evaluation{'s' if len(evals) != 1 else ''} of a checkpoint "
        "(asyncrl eval), each beside the run's validation at the same policy version.</p>",
        "<table class=evals>",
    ]
    for line in evals:
        version = line.get("version")
        run_line = _validated(validation, version)
        if run_line is not None:
            beside = f"run's validation (v{version})"
        elif isinstance(version, int):
            beside = f"run's validation (none at v{version})"
        else:
            beside = "run's validation (version unknown)"
        when = number(line.get("time"))
        stamp = time.strftime(" %Y-%m-%d %H:%M UTC", time.gmtime(when)) if when is not None else ""
        parts.append(
            f"<tr><th colspan=3 class=eval>{e(str(line.get('checkpoint')))}{e(stamp)}</th></tr>"
        )
        parts.append(f"<tr><th></th><th>eval</th><th>{e(beside)}</th></tr>")
        for row in _rows(line, run_line or {}):
            label, *values = (e(cell) for cell in row)
            cells = "".join(f"<td class=v>{v}</td>" for v in values)
            parts.append(f"<tr><td>{label}</td>{cells}</tr>")
    parts.append("</table>")
    return "\n".join(parts)


def _validated(validation: list[dict[str, Any]], version: object) -> dict[str, Any] | None:
    """The run's last validation line of ``version``; None for an unknown version."""
    if not isinstance(version, int) or isinstance(version, bool):
        return None
    same = [line for line in validation if line.get("version") == version]
    return same[-1] if same else None


def _rows(line: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, eval's value, run's value) per figure the evaluation reports."""
    k = largest_k(line)
    version = line.get("version")
    rows = [
        ("policy version", _text(version), _text(run.get("version"))),
        ("samples per prompt (k)", _text(_samples(line)), _text(_samples(run))),
        (f"mean@{k} (mean reward)", _fixed(line, "val_reward"), _fixed(run, "val_reward")),
    ]
    rows += [(f"pass@{j}", _fixed(line, f"val_pass@{j}"), _fixed(run, f"val_pass@{j}"))
             for j in pass_ks(line)]  # fmt: skip
    rows += [
        (f"best of {k} (mean)", _fixed(line, "val_best_reward"), _fixed(run, "val_best_reward")),
        ("response tokens (mean)", _fixed(line, "val_response_tokens", 1),
         _fixed(run, "val_response_tokens", 1)),
        ("prompts", _text(line.get("val_prompts")), _text(run.get("val_prompts"))),
    ]  # fmt: skip
    for name in sources([line]):
        keys = [("reward", f"mean@{k}")] + ([(f"pass@{k}", f"pass@{k}")] if k > 1 else [])
        for key, label in keys:
            rows.append(
                (
                    f"{name}: {label}",
                    _fixed_or_blank(source_metric(line, name, key)),
                    _fixed_or_blank(source_metric(run, name, key)),
                )
            )
    return rows


def _samples(line: dict[str, Any]) -> object:
    """k as the line states it; a validation line of an older run drew one (greedy)."""
    stated = line.get("samples", line.get("val_samples"))
    if stated is None and "val_reward" in line:
        return largest_k(line)
    return stated


def _fixed(line: dict[str, Any], key: str, digits: int = 3) -> str:
    return _fixed_or_blank(number(line.get(key)), digits)


def _fixed_or_blank(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _text(value: object) -> str:
    return "" if value is None or isinstance(value, dict | list) else str(value)
