"""Where a run's time goes, read from its ``metrics.jsonl``: what ``asyncrl inspect`` shows.

Three views, all from the step lines the scheduler writes (service/activity.py,
service/step_path.py, and the learners' own step metrics):

- per role, the share of its workers' time in each bucket (bus.TimeBucket) and its tokens
  per second. Each line holds these over the 30 s before it; over the run they are
  averaged weighted by the time each line stands for (since the line before it), so a
  stretch of fast steps counts for its duration, not its number of lines. The newest
  line's own window is kept apart (``roles_last``).
- the critical path of a step: per leg, the median over the steps whose whole path is
  known (so the rows describe the same steps; over every step that has a leg when none
  is whole), and the newest such step. A step's later legs are in a later line
  (``versions_loaded``), joined here by step number. The first leg is split into the time
  the trainer was still on the step before and the rest (the trainer free, claiming).
- per learner (the trainer, and PPO's critic), where its step's seconds go: the update
  (forward, backward, optimizer), staging its state, gathering its weights for publishing,
  and the checkpoint after it; the mean over the steps the lines carry (a critic step
  between two policy steps whose line another one overwrote is not among them).

Pure: lines in, a plain dict out (``--json`` prints it), and a table made from that dict.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.bus import TimeBucket
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from asyncrl.runtime.scheduler.service.step_path import LEGS, TRAINER_BUSY

__all__ = ["breakdown", "render_breakdown", "step_lines"]

_READY, _LEASED, _PUBLISHED, _LOADED = LEGS  # the keys the service writes, in path order
_ONE_LEG_TO_LOADED = "trained_to_loaded_s"  # when the publication was not seen (a restart)
_TRAINER_FREE = "trainer_free_s"  # the first leg less TRAINER_BUSY
_LABELS = {
    _READY: "batch ready -> train lease",
    TRAINER_BUSY: "  of which the trainer was on the step before",
    _TRAINER_FREE: "  of which the trainer was free (claiming)",
    _LEASED: "train lease -> trained",
    _PUBLISHED: "trained -> version published",
    _LOADED: "published -> run by every generator",
    _ONE_LEG_TO_LOADED: "trained -> run by every generator",
    "total_s": "batch ready -> run by every generator",
}
_HEADINGS = {
    TimeBucket.COMPUTE: "compute",
    TimeBucket.WAITING_FOR_WORK: "waiting",
    TimeBucket.SCHEDULER: "scheduler",
    TimeBucket.PAYLOADS: "payloads",
    TimeBucket.WEIGHTS: "weights",
    TimeBucket.OTHER: "other",
}


def step_lines(path: Path) -> list[dict[str, Any]]:
    """The whole step lines of a metrics file (a line torn by a crash is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and type(line.get("step")) is int:
            lines.append(line)
    return lines


def breakdown(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Role shares and the critical path over ``lines`` (see the module's docstring)."""
    last = lines[-1] if lines else {}
    return {
        "steps": len(lines),
        "last_step": last.get("step"),
        "elapsed_s": last.get("elapsed_s"),
        "roles": _role_shares(lines),
        "roles_last": last.get("roles") or {},
        "critical_path": _critical_path(lines),
        "learners": _learner_steps(lines),
    }


# --- the learners' steps ----------------------------------------------------------------

_LEARNERS = ("train", "critic")  # the prefixes of their step metrics (LearnerRole)
_PHASES = ("step_s", "update_s", "stage_s", "gather_s", "checkpoint_s")


def _learner_steps(lines: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    seen: dict[str, list[dict[str, float]]] = {}
    for line in lines:
        for learner in _LEARNERS:
            phases = {p: line.get(f"{learner}_{p}") for p in _PHASES}
            if all(isinstance(v, int | float) for v in phases.values()):
                seen.setdefault(learner, []).append(phases)  # type: ignore[arg-type]
    return {
        learner: {
            "steps": len(steps),
            **{p: round(statistics.fmean(s[p] for s in steps), 4) for p in _PHASES},
        }
        for learner, steps in seen.items()
    }


# --- roles ------------------------------------------------------------------------------


def _role_shares(lines: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    weights: dict[str, float] = {}  # role -> seconds of lines with shares
    shares: dict[str, list[float]] = {}
    rate_weights: dict[str, float] = {}
    tokens: dict[str, float] = {}
    workers: dict[str, int] = {}
    previous = 0.0
    for line in lines:
        elapsed = line.get("elapsed_s")
        if not isinstance(elapsed, int | float):
            continue
        # A scheduler restart starts elapsed_s again from zero.
        span, previous = (elapsed - previous if elapsed >= previous else elapsed), elapsed
        for role, seen in (line.get("roles") or {}).items():
            if not isinstance(seen, dict):
                continue
            workers[role] = seen.get("workers", workers.get(role, 0))
            if isinstance(seen.get("tokens_per_s"), int | float):
                rate_weights[role] = rate_weights.get(role, 0.0) + span
                tokens[role] = tokens.get(role, 0.0) + span * seen["tokens_per_s"]
            if all(isinstance(seen.get(b.key), int | float) for b in TimeBucket):
                weights[role] = weights.get(role, 0.0) + span
                acc = shares.setdefault(role, [0.0] * len(TimeBucket))
                for b in TimeBucket:
                    acc[b] += span * seen[b.key]
    out: dict[str, dict[str, float]] = {}
    for role in _role_order(workers):
        row: dict[str, float] = {"workers": workers[role]}
        if rate_weights.get(role):
            row["tokens_per_s"] = round(tokens[role] / rate_weights[role], 1)
        if weights.get(role):
            row.update((b.key, round(shares[role][b] / weights[role], 4)) for b in TimeBucket)
        out[role] = row
    return out


def _role_order(roles: Iterable[str]) -> list[str]:
    known = DEFAULT_PIPELINE.worker_roles
    return sorted(roles, key=lambda r: (known.index(r) if r in known else len(known), r))


# --- the critical path ------------------------------------------------------------------


def _critical_path(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    steps: dict[int, dict[str, float]] = {}
    for line in lines:
        path = line.get("critical_path")
        if isinstance(path, dict):
            steps.setdefault(line["step"], {}).update(_numbers(path))
        for later in line.get("versions_loaded") or ():
            if isinstance(later, dict) and type(later.get("step")) is int:
                steps.setdefault(later["step"], {}).update(_numbers(later, skip="step"))
    for legs in steps.values():
        if _READY in legs and TRAINER_BUSY in legs:
            legs[_TRAINER_FREE] = round(legs[_READY] - legs[TRAINER_BUSY], 4)
        total = _total(legs)
        if total is not None:
            legs["total_s"] = total
    whole = [n for n in sorted(steps) if "total_s" in steps[n]]
    pool = [steps[n] for n in whole] if whole else list(steps.values())
    median = {}
    for name in _LABELS:
        values = [legs[name] for legs in pool if name in legs]
        if values:
            median[name] = round(statistics.median(values), 4)
    newest = whole[-1] if whole else max(steps, default=None)
    last = {"step": newest, **steps[newest]} if newest is not None else {}
    return {"steps": len(steps), "whole": len(whole), "median": median, "last": last}


def _numbers(legs: dict[str, Any], skip: str = "") -> dict[str, float]:
    return {k: v for k, v in legs.items() if k != skip and isinstance(v, int | float)}


def _total(legs: dict[str, float]) -> float | None:
    first = (_READY, _LEASED)
    if not all(name in legs for name in first):
        return None
    if _PUBLISHED in legs and _LOADED in legs:
        later = legs[_PUBLISHED] + legs[_LOADED]
    elif _ONE_LEG_TO_LOADED in legs:
        later = legs[_ONE_LEG_TO_LOADED]
    else:
        return None
    return round(sum(legs[name] for name in first) + later, 4)


# --- the table --------------------------------------------------------------------------


def render_breakdown(report: dict[str, Any], title: str) -> str:
    """``report`` (from :func:`breakdown`) as a readable table under ``title``."""
    out = [title]
    if not report["steps"]:
        out.append("no train step yet: metrics.jsonl holds no step line")
        return "\n".join(out)
    out += ["", *_roles_table(report["roles"]), "", *_path_table(report["critical_path"])]
    if report.get("learners"):
        out += ["", *_learners_table(report["learners"])]
    return "\n".join(out)


def _learners_table(learners: dict[str, dict[str, float]]) -> list[str]:
    headings = ("step", "update", "stage", "gather", "checkpoint")
    lines = [
        "Where a learner's step goes: mean seconds (update: forward, backward, optimizer; "
        "gather: its weights whole, to publish)",
        f"{'learner':<10} {'steps':>7}" + "".join(f" {h:>10}" for h in headings),
    ]
    for learner, row in learners.items():
        cells = "".join(f" {_fmt(row.get(p), '{:.4f}'):>10}" for p in _PHASES)
        lines.append(f"{learner:<10} {int(row['steps']):>7}{cells}")
    return lines


def _roles_table(roles: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        "Where each role's time goes: share of its workers' time, time-weighted over the run",
        f"{'role':<10} {'workers':>7} {'tokens/s':>9}"
        + "".join(f" {_HEADINGS[b]:>9}" for b in TimeBucket),
    ]
    for role, row in roles.items():
        rate = row.get("tokens_per_s")
        cells = [f"{role:<10} {row.get('workers', 0):>7} {_fmt(rate, '{:.1f}'):>9}"]
        cells += [f" {_fmt(row.get(b.key), '{:.1%}'):>9}" for b in TimeBucket]
        lines.append("".join(cells))
    if not roles:
        lines.append("(no role reported its time: the step lines predate this breakdown)")
    else:
        lines.append("(the dataloader adds groups but completes no lease, so it reports no time)")
    return lines


def _path_table(path: dict[str, Any]) -> list[str]:
    median, last = path["median"], path["last"]
    names = [n for n in _LABELS if n in median or n in last]
    step = f"step {last['step']}" if last.get("step") is not None else "last"
    whole, steps = path["whole"], path["steps"]
    over = f"the {whole} of {steps} steps whose path is whole" if whole else f"{steps} steps"
    lines = [
        f"Critical path of a train step, seconds (median over {over})",
        f"{'':<46} {'median':>9} {step:>10}",
    ]
    for name in names:
        lines.append(
            f"{_LABELS[name]:<46} {_fmt(median.get(name), '{:.4f}'):>9}"
            f" {_fmt(last.get(name), '{:.4f}'):>10}"
        )
    if not names:
        lines.append("(no step line carries a critical path)")
    return lines


def _fmt(value: object, spec: str) -> str:
    return spec.format(value) if isinstance(value, int | float) else "-"
