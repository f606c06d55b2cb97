"""The live status as a person reads it: a few aligned lines, not a JSON dump."""

from __future__ import annotations

from typing import Any

__all__ = ["render_status"]


def render_status(s: dict[str, Any]) -> str:
    run, stale = s["run"], s["staleness"]
    lines = [
        f"run {run['name']}: step {run['steps']}, up {run['uptime_s']:.0f}s"
        + (f", draining ({run['draining']})" if run["draining"] else ""),
        "groups    " + _pairs(s["groups"]) + f"  (created {s['created']})",
        f"versions  policy {s['policy_version']}, steps done {s['steps_done']}, "
        f"max staleness {stale['max_staleness']}, worst trained lag {stale['worst_trained']}",
        "leases    " + (_pairs(s["leases"]) or "none"),
    ]
    if "learning" in s:
        lines.append("learning  " + _learning(s["learning"]))
    if "mismatch" in s:
        lines.append("mismatch  " + _mismatch(s["mismatch"]))
        if "offpolicy_weight_mean" in s["mismatch"]:
            lines.append("corrected " + _corrected(s["mismatch"]))
    if "filtered" in s:
        lines.append("filtered  " + _filtered(s["filtered"]))
    if run.get("failure"):
        lines.insert(1, f"stopping  {run['failure']}")
    if "critic" in s:
        c = s["critic"]
        lines.insert(
            3,
            f"critic    version {c['version']}, steps done {c['steps_done']}, "
            f"worst trained lag {c['worst_trained']}",
        )
    if s["locks"]:
        locks = {
            k: f"{v['held']}/{v['capacity']} (+{v['waiting']} waiting)"
            for k, v in s["locks"].items()
        }
        lines.append("locks     " + _pairs(locks))
    lines.append("workers")
    for name, w in sorted(s["workers"].items(), key=lambda kv: (kv[1]["role"], kv[0])):
        loaded = "" if w["loaded"] is None else f"  loaded v{w['loaded']}"
        ago = w["last_heartbeat_s_ago"]
        seen = "never" if ago is None else f"{ago:.1f}s ago"
        lines.append(f"  {w['role']:<10} {name:<24} heartbeat {seen}{loaded}")
    if s["dead"]:
        lines.append("dead      " + _pairs(s["dead"]))
    if s["refused"] or s["protocol_errors"]:
        refused = {**s["refused"], "protocol": s["protocol_errors"]}
        lines.append("refused   " + _pairs({k: v for k, v in refused.items() if v}))
    lines.append(f"journal   {s['journal']['records']} records, {s['journal']['durable']} fsynced")
    return "\n".join(lines)


def _learning(m: dict[str, Any]) -> str:
    """The newest step's mean reward, mean token entropy (nats) and learning rate, those
    it reported."""
    figures = []
    if "reward_mean" in m:
        figures.append(f"reward {m['reward_mean']:.3f}")
    if "entropy" in m:
        figures.append(f"entropy {m['entropy']:.3f} nats/token")
    if "lr" in m:
        figures.append(f"lr {m['lr']:.3g}")
    return f"step {m['step']}: " + ", ".join(figures)


def _mismatch(m: dict[str, Any]) -> str:
    """The newest step's gap between generator and trainer log-probs of one version."""
    tokens = m.get("logprob_mismatch_tokens", 0)
    if not tokens or "logprob_mismatch_mean" not in m:
        return f"step {m['step']}: no token scored under the version that sampled it"
    return (
        f"step {m['step']}: |logp gap| mean {m['logprob_mismatch_mean']:.2e}, "
        f"max {m['logprob_mismatch_max']:.2e}, k3 KL {m['logprob_mismatch_kl']:.2e}"
        + (
            f", log-ppl gap {m['logprob_mismatch_log_ppl']:+.2e}"
            if "logprob_mismatch_log_ppl" in m
            else ""
        )
        + f" over {tokens} tokens"
    )


def _corrected(m: dict[str, Any]) -> str:
    """What the newest step's corrections did, per part of the proximal/behaviour ratio."""
    parts = []
    for part, name in (("offpolicy", "off-policy"), ("engine", "engine")):
        parts.append(
            f"{name} weight mean {m[f'{part}_weight_mean']:.3f} max "
            f"{m[f'{part}_weight_max']:.3g} ({100 * m[f'{part}_truncated_frac']:.1f}% "
            f"truncated), {100 * m[f'{part}_masked_frac']:.1f}% tokens masked, "
            f"{100 * m[f'{part}_rejected_frac']:.1f}% sequences rejected"
        )
    return f"step {m['step']}: " + "; ".join(parts)


def _filtered(f: dict[str, Any]) -> str:
    """Dynamic sampling: groups left out for lack of signal, and what filling a batch took."""
    per_batch = f["prompts_per_batch"]
    text = f"{f['groups_filtered']} groups ({100 * f['filtered_fraction']:.1f}% of those judged)"
    if per_batch is not None:
        text += f", {per_batch:g} prompts per trained batch"
    if f["filtered_bound"]:
        text += f", {f['filtered_in_a_row']} in a row (stops past {f['filtered_bound']})"
    return text


def _pairs(mapping: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v}" for k, v in mapping.items())
