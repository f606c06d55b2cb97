"""Reading a run directory from the outside, read-only (live, finished or crashed alike),
and where it stands by replaying its journal without a scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.commands import UsageError
from asyncrl.runtime.contract.config import RunConfig, load_config, pipeline_for
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.core import CoreSettings
from asyncrl.runtime.scheduler.core.status import summarize
from asyncrl.runtime.scheduler.durable import recover
from asyncrl.runtime.scheduler.journal import JournalCorrupt

__all__ = ["existing_run", "replay_journal", "run_config"]


def existing_run(path: Path) -> RunDir:
    """``path`` as a run directory; a UsageError naming what is missing if it is not one."""
    run = RunDir(path)
    if not path.is_dir():
        raise UsageError(f"{path} is not a run directory: it does not exist")
    if not (run.config.exists() or run.journal.is_dir() or run.metrics.exists()):
        raise UsageError(
            f"{path} is not a run directory: it holds no {run.config.name}, "
            f"{run.journal.name}/ or {run.metrics.name}"
        )
    return run


def run_config(run: RunDir) -> RunConfig:
    """The configuration the run was started with (the defaults if it was never written)."""
    return load_config(run.config) if run.config.exists() else RunConfig()


def replay_journal(run: RunDir) -> dict[str, Any]:
    """Where the run stands, by replaying its journal: the core's summary and the
    journal's extent. A UsageError if it cannot be replayed."""
    try:
        cfg = run_config(run)
        core, found = recover(run.journal, CoreSettings.from_config(cfg), pipeline_for(cfg))
    except JournalCorrupt as error:
        raise UsageError(f"{error}; the journal cannot be replayed past this point") from None
    except KeyError as error:  # a record for a stage this config's table does not have
        raise UsageError(
            f"{run.journal} does not replay under the stages {run.config.name} gives "
            f"({error.args[0]}): was it changed since the run started?"
        ) from None
    summary: dict[str, Any] = summarize(core.state)
    summary["journal"] = {
        "records": found.last_seq,
        "snapshot_at": found.snapshot_seq,
        "torn_bytes_ignored": found.torn_bytes,
    }
    return summary
