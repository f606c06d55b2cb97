"""The ``values`` role: the critic's value of every response token, at its version.

Consumes ``transition.*.generated`` (PPO's table with ``critic.values: stage``; by default
the critic's step makes the values itself, and this role has no work); produces
:class:`~..payloads.ValuesOut` with the critic version it used, which the scheduler
keeps with the group: the critic's step refuses values older than the staleness bound
allows (they are made again). A branch beside ``logp``: the scorer of the critic.

It follows the critic's versions as logp follows the policy's: each version the critic
published is fetched over the weight plane (the critic's own routes: the scheduler
answers a values worker's WantWeights with the critic's plan), loaded between leases,
reported loaded and its transfer reported (``weights``). So it runs on any host, not
only the critic's.
"""

from __future__ import annotations

from typing import ClassVar

import structlog
import torch

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import Received, make_receiver

from ..actor import Actor, Outcome, WorkerContext
from ..critic import response_values
from ..payloads import RolloutsOut, ValuesOut
from ..policy.checkpoint import load_parameters
from ..startup.model_loading import load_critic
from ..startup.role_checks import check_device, check_model
from ..training.scorer import by_like_length, pack_rollouts, per_group
from ..worker.weight_following import StallBounds, WeightFollower, weights_access
from .critic import critic_path

__all__ = ["Values"]

log = structlog.get_logger("asyncrl.values")


class Values(Actor):
    role: ClassVar[str] = Role.VALUES.value
    claim_size: ClassVar[int] = 4
    follows_critic: ClassVar[bool] = True

    def __init__(self) -> None:
        self.loaded = 0  # version 0: the critic as it starts, read from critic.path
        self.reports: list[p.Report] = []

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [*check_device(cfg), *check_model(cfg)]

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        self.worker = ctx.worker
        self.model, self.codec = load_critic(cfg, self.role, ctx.index, critic_path(cfg))
        self.model.eval()
        weight = next(self.model.parameters())
        log.info(
            "value model loaded",
            device=str(weight.device),
            dtype=str(weight.dtype),
            threads=torch.get_num_threads(),
        )
        dirs = RunDir.of(cfg).critic_weight_dirs(cfg.weights)
        receiver = make_receiver(
            cfg.weights, dirs, weights_access(ctx), parts=cfg.weight_parts(Role.CRITIC.value)
        )
        self.weights = WeightFollower(
            receiver, ctx.ask_weights, StallBounds.of(ctx.worker, cfg.weights)
        )

    def on_version(self, version: int) -> int | None:
        moved = self.weights.follow(version, self.loaded, self._load)
        if moved is not None:
            self.loaded, cost = moved
            self.reports.append(p.Report(self.worker, "weights", self.loaded, cost))
        return self.loaded

    def _load(self, received: Received) -> list[torch.Tensor]:
        # Runs on the receiver's checked buffer itself, as logp does: no copy.
        return load_parameters(self.model, received.state, copy=False)

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports

    def process(self, lease: p.Lease) -> Outcome:
        # The lease's groups together, in passes of rows of like length, as logp scores
        # them: a forward pass per group padded each to its longest cost values twice
        # what logp spends on the same groups.
        rollouts = [RolloutsOut.of(item) for item in lease.items]
        packed = pack_rollouts(rollouts, self.codec.pad_id)
        with torch.inference_mode():
            values = by_like_length(packed, lambda part: response_values(self.model, part))
        results = tuple(
            p.Result(item.gid, ValuesOut(laid, self.loaded).to_payload())
            for item, laid in zip(lease.items, per_group(values, rollouts), strict=True)
        )
        return Outcome(results, tokens=sum(r.trained_tokens() for r in rollouts))

    def on_stop(self) -> None:
        self.weights.receiver.close()
