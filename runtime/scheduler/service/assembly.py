"""Assembling a scheduler service from a run's configuration and directory."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from asyncrl.runtime.contract.config import (
    RunConfig,
    config_to_dict,
    dump_config,
    load_config,
    pipeline_for,
)
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.runtime.scheduler.core import CoreSettings
from asyncrl.runtime.scheduler.durable import JournaledCore
from asyncrl.runtime.scheduler.journal import JournalWriter

from .metrics import MetricsLog
from .reports import ReportLog
from .run_plan import RunPlan
from .service import SchedulerService
from .sinks import open_sinks
from .trace import NO_TRACE, Trace, TraceLog

__all__ = ["StagesChanged", "fence_key", "open_service"]


class StagesChanged(ValueError):
    """A resumed run would replay its journal through a different table of stages."""


def open_service(
    cfg: RunConfig,
    *,
    resume: bool,
    now: float,
    on_progress: Callable[[], None] | None = None,
    run_secret: bytes = b"",
) -> SchedulerService:
    """Open the run directory's journal (fresh, or resumed) and wrap it in a service.

    ``now`` is the monotonic clock's reading: the trace maps it to the wall clock, so the
    events of a resumed scheduler follow the earlier ones. A fresh start refuses a
    directory that already holds a journal (JournalExists).
    """
    run = RunDir.of(cfg)
    run.make()
    if resume and run.config.exists():
        _check_same_stages(load_config(run.config), cfg)
    sched = cfg.scheduler
    writer_factory = partial(
        JournalWriter.open,
        fsync_every=sched.journal_fsync_every,
        fsync_interval_s=sched.journal_fsync_interval_ms / 1000,
        snapshot_every=sched.snapshot_every,
        on_progress=on_progress,
    )
    durable = JournaledCore.open(
        run.journal,
        replace(CoreSettings.from_config(cfg), fence_key=fence_key(run_secret)),
        resume=resume,
        now=now,
        pipeline=pipeline_for(cfg),
        writer_factory=writer_factory,
        snapshot_in_child=True,  # the state dumped by a forked child: no pause of the loop
    )
    if not resume:
        run.config.write_text(dump_config(cfg), encoding="utf-8")
    pipeline = cfg.pipeline
    plan = RunPlan(cfg.run.total_steps, pipeline.train_batch_groups, pipeline.max_staleness)
    return SchedulerService(
        durable,
        plan,
        MetricsLog(
            run.metrics,
            open_sinks(cfg.logging.backends, run.root, cfg.run.name, config_to_dict(cfg)),
        ),
        reports={
            "validation": ReportLog(run.validation),
            "weights": ReportLog(run.weight_loads, per_worker=True),
        },
        relay_fanout=cfg.weights.relay_fanout,
        trace=_trace(cfg, run, now),
        run_name=cfg.run.name,
        heartbeat_interval_s=sched.heartbeat_interval_s,
        max_message_bytes=sched.max_message_mb << 20,
        started_at=now,
        validating_role=_validating_role(cfg),
    )


def _validating_role(cfg: RunConfig) -> str | None:
    if cfg.data.val_every_versions == 0:
        return None
    # With harnesses, the harness role validates through the generators' API.
    return Role.HARNESS.value if cfg.data.harness else Role.GENERATE.value


def _trace(cfg: RunConfig, run: RunDir, now: float) -> Trace:
    if not cfg.logging.trace:
        return NO_TRACE
    return TraceLog(run.trace, now=now, wall_offset_s=time.time() - now)


def fence_key(run_secret: bytes) -> bytes:
    """The core's fence key, from the run secret (none without one: fences are counts)."""
    if not run_secret:
        return b""
    return hashlib.blake2b(b"asyncrl fences", key=run_secret[:64]).digest()


def _check_same_stages(before: RunConfig, now: RunConfig) -> None:
    was, will = pipeline_for(before).roles, pipeline_for(now).roles
    if was != will:
        raise StagesChanged(
            f"the run started with the stages {', '.join(was)} and this configuration has "
            f"{', '.join(will)} (algorithm.kl_coef decides whether ref_logp runs: it was "
            f"{before.algorithm.kl_coef:g}, now {now.algorithm.kl_coef:g}); resume with the "
            "same kl_coef, or start a new run"
        )
