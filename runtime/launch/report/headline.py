"""The few figures a reader wants before any picture: how far, how fast, how good, how
stale, and whether generation and training really overlapped."""

from __future__ import annotations

import statistics
from typing import Any

from .run_files import RunData
from .timeline import GENERATE_ROLE, TRAIN_ROLE, Timeline, busy_overlap
from .validation import largest_k, number, source_metric, sources

__all__ = ["headline"]

_LAST = 10  # step lines averaged for "final" figures: one batch's reward is noisy


def headline(data: RunData, timeline: Timeline | None) -> dict[str, str]:
    """Label -> value, as shown; a figure whose data is missing is left out."""
    out: dict[str, str] = {}
    steps, total = data.steps, data.total_steps
    if steps:
        last = steps[-1]
        out["steps"] = f"{last.get('step', len(steps))}" + (f" of {total}" if total else "")
        elapsed = last.get("run_s")
        if isinstance(elapsed, int | float) and elapsed > 0:
            out["wall time"] = f"{elapsed:.1f} s"
            out["steps/s"] = f"{len(steps) / elapsed:.2f}"
        _mean_of(out, "reward, last 10 steps", steps[-_LAST:], "reward_mean")
        _mean_of(out, "reward, first 10 steps", steps[:_LAST], "reward_mean")
        _mean_of(out, "entropy, first 10 steps (nats/token)", steps[:_LAST], "entropy")
        _mean_of(out, "entropy, last 10 steps (nats/token)", steps[-_LAST:], "entropy")
        _mean_of(out, "staleness, mean", steps, "staleness_mean")
        # a learned critic's: critic versions its values lagged its steps (PPO's runs)
        _mean_of(out, "critic staleness, mean", steps, "critic_staleness_mean")
        _mismatch(out, steps)
        _corrections(out, steps)
        groups, created = last.get("group_states"), last.get("groups_created")
        if isinstance(groups, dict) and isinstance(created, int):
            counts = ", ".join(f"{state} {n}" for state, n in groups.items())
            out["groups at the last step"] = f"{counts} (of {created} created)"
        _filtered(out, last)
        for role, r in sorted((last.get("roles") or {}).items()):
            if isinstance(r, dict) and isinstance(r.get("waiting_for_work"), int | float):
                out[f"{role}: waiting for work"] = f"{r['waiting_for_work']:.0%}"
    vals = [v for v in data.validation if isinstance(v.get("val_reward"), int | float)]
    if vals:
        out["validation reward, first"] = f"{vals[0]['val_reward']:.3f} (v{vals[0]['version']})"
        out["validation reward, last"] = f"{vals[-1]['val_reward']:.3f} (v{vals[-1]['version']})"
        _sampled_validation(out, vals[-1])
    loads = [w for w in data.weight_loads if isinstance(w.get("stall_s"), int | float)]
    if loads:
        stall = statistics.median(w["stall_s"] for w in loads)
        out["weight load stall, median"] = f"{stall * 1e3:.1f} ms"
    if timeline is not None:
        train = timeline.role_intervals(TRAIN_ROLE)
        share = busy_overlap(train, timeline.role_intervals(GENERATE_ROLE))
        if share is not None:
            out["training time with generation running"] = f"{share:.0%}"
    return out


def _mean_of(out: dict[str, str], label: str, lines: list[dict[str, Any]], key: str) -> None:
    values = [line[key] for line in lines if isinstance(line.get(key), int | float)]
    if values:
        out[label] = f"{statistics.fmean(values):.3f}"


def _sampled_validation(out: dict[str, str], last: dict[str, Any]) -> None:
    """The last validation's pass@k beside its mean@k where it drew k > 1 samples per
    prompt, and each data source's where it names several."""
    k = largest_k(last)
    pass_k = number(last.get(f"val_pass@{k}")) if k > 1 else None
    if pass_k is not None:
        out[f"validation mean@{k} / pass@{k}, last"] = (
            f"{last['val_reward']:.3f} / {pass_k:.3f} (v{last['version']})"
        )
    names = sources([last])
    if len(names) < 2:
        return
    shown = []
    for name in names:
        reward = source_metric(last, name, "reward")
        passed = source_metric(last, name, f"pass@{k}") if k > 1 else None
        if reward is not None:
            tail = f" / {passed:.3f}" if passed is not None else ""
            shown.append(f"{name} {reward:.3f}{tail}")
    if shown:
        label = f"mean@{k} / pass@{k}" if k > 1 else "reward"
        out[f"validation per source ({label}), last"] = ", ".join(shown)


def _filtered(out: dict[str, str], last: dict[str, Any]) -> None:
    """Dynamic sampling: groups left out for lack of signal, and the prompts it took to
    fill each trained batch (counted from the start of the run)."""
    filtered, fraction = last.get("groups_filtered"), last.get("filtered_fraction")
    if isinstance(filtered, int) and isinstance(fraction, int | float):
        out["groups filtered (no signal)"] = f"{filtered} ({fraction:.1%} of those judged)"
    per_batch = last.get("prompts_per_batch")
    if isinstance(per_batch, int | float):
        out["prompts per trained batch"] = f"{per_batch:.2f}"


def _mismatch(out: dict[str, str], lines: list[dict[str, Any]]) -> None:
    """The widest gap between generator and trainer log-probs of one version, and over
    how many tokens of how many steps it was measured."""
    worst = [line["logprob_mismatch_max"] for line in lines if "logprob_mismatch_max" in line]
    if worst:
        tokens = sum(line.get("logprob_mismatch_tokens", 0) for line in lines)
        out["generator-trainer log-prob gap, max"] = (
            f"{max(worst):.2e} ({tokens} tokens in {len(worst)} steps)"
        )
    ppl = [line["logprob_mismatch_log_ppl"] for line in lines if "logprob_mismatch_log_ppl" in line]
    if ppl:
        out["log-perplexity gap (trainer - generator), mean"] = f"{statistics.fmean(ppl):+.2e}"


def _corrections(out: dict[str, str], lines: list[dict[str, Any]]) -> None:
    """What each part's correction did, averaged over the steps that report it."""
    for part, name in (("offpolicy", "off-policy"), ("engine", "engine")):
        keys = [f"{part}_{k}" for k in ("weight_mean", "truncated_frac", "masked_frac")]
        keys.append(f"{part}_rejected_frac")
        reporting = [line for line in lines if all(k in line for k in keys)]
        if not reporting:
            continue
        mean = {k: statistics.fmean(line[k] for line in reporting) for k in keys}
        out[f"{name} correction, mean per step"] = (
            f"weight {mean[keys[0]]:.3f} before truncation, {mean[keys[1]]:.2%} of tokens "
            f"truncated, {mean[keys[2]]:.2%} masked, {mean[keys[3]]:.2%} of sequences rejected"
        )
