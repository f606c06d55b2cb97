"""The stages a configuration runs: the default table, less what nobody would read.

Reference log-probs only feed the KL penalty; with ``algorithm.kl_coef`` 0 no ``ref_logp``
stage runs, so a group joins ``ready`` once logp and reward are done and no worker
computes a forward pass whose result is thrown away.

With ``data.harness`` set, agent harnesses (the ``harness`` role) take the generate stage's
place: they drive the generators through the API those serve, and the generate workers
stay registered to serve and follow versions, and are leased nothing.

With ``algorithm.estimator: gae`` the table has a learned critic (``Pipeline.with_critic``):
the ``critic``'s step before the train step, which makes the values in its update's
forward pass, or, with ``critic.values: stage``, a ``values`` branch beside logp.

With ``algorithm.proximal_logp: trainer`` no ``logp`` stage runs either: the trainer reads
the proximal log-probs from its own update's forward pass.
"""

from __future__ import annotations

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Pipeline, Role

from .schema import RunConfig

__all__ = ["pipeline_for", "workers_to_start"]


def pipeline_for(cfg: RunConfig) -> Pipeline:
    table = DEFAULT_PIPELINE
    if cfg.data.harness:
        table = table.admitting_with(Role.HARNESS)
    if cfg.algorithm.estimator == "gae":  # PPO: a learned critic's values and steps
        table = table.with_critic(values_stage=cfg.critic.values == "stage")
    if cfg.algorithm.kl_coef == 0:
        table = table.without(Role.REF_LOGP)
    if cfg.algorithm.proximal_logp == "trainer":
        table = table.without(Role.LOGP)
    return table


def workers_to_start(cfg: RunConfig) -> dict[str, int]:
    """``pipeline.workers``, for the roles the run's pipeline has (the rest have no work)."""
    roles = set(pipeline_for(cfg).worker_roles)
    return {role: count for role, count in cfg.pipeline.workers.items() if role in roles}
