"""A plain summary of the core's state, for `status` commands, logs and dashboards."""

from __future__ import annotations

from collections import Counter
from typing import Any

from asyncrl.runtime.contract.stages import GroupState

from .transitions import CoreState

__all__ = ["filtering", "summarize"]


def summarize(state: CoreState) -> dict[str, Any]:
    """Counts per state, versions, leases per role, locks, staleness, deaths, payloads lost."""
    groups = state.groups.values()
    return {
        "groups": {s.value: state.counts[s] for s in GroupState if state.counts[s]},
        "created": state.next_gid,
        "steps_done": state.steps_done,
        "policy_version": state.policy_version,
        "workers": {
            name: {"role": w.role, "loaded": w.loaded} for name, w in sorted(state.workers.items())
        },
        "leases": dict(Counter(lease.role for lease in state.leases.values())),
        "locks": {
            name: {"capacity": r.capacity, "held": len(r.holders), "waiting": len(r.waiting)}
            for name, r in state.resources.items()
        },
        "worst_staleness_trained": None if state.worst_staleness < 0 else state.worst_staleness,
        "dead": dict(Counter(g.reason for g in groups if g.state is GroupState.DEAD)),
        "regenerated": dict(state.regenerated),  # payloads lost with their holder, by role
        **_critic(state),
    }


def filtering(state: CoreState, bound: int) -> dict[str, Any]:
    """Dynamic sampling's counts, all from the start of the run (so a restart or a
    rollback keeps them exact):

    - ``groups_filtered``: groups left out of training, their rewards without signal;
    - ``filtered_fraction``: of the groups judged (trained or filtered), those filtered;
    - ``prompts_per_batch``: groups judged per train step, so the prompts it took to fill
      each batch (the batch size when nothing is filtered);
    - ``filtered_in_a_row``: filtered since the last group judged to carry signal, against
      ``bound`` (``max_filtered_batches`` batches' worth) past which the run stops.
    """
    filtered, trained = state.counts[GroupState.FILTERED], state.counts[GroupState.TRAINED]
    judged = filtered + trained
    return {
        "groups_filtered": filtered,
        "filtered_fraction": round(filtered / judged, 4) if judged else 0.0,
        "prompts_per_batch": round(judged / state.steps_done, 3) if state.steps_done else None,
        "filtered_in_a_row": state.filtered_in_a_row,
        "filtered_bound": bound,
    }


def _critic(state: CoreState) -> dict[str, Any]:
    """A PPO table's critic: its steps, published version and worst lag (none without one)."""
    if not state.critic_followers:
        return {}
    worst = state.worst_critic_staleness
    return {
        "critic": {
            "steps_done": state.critic_steps_done,
            "version": state.critic_version,
            "worst_trained": None if worst < 0 else worst,
        }
    }
