"""``asyncrl-scheduler``: the scheduler's commands. ``inspect`` for now.

    asyncrl-scheduler inspect runs/demo      # replay a run's journal, print where it stands

``inspect`` only reads: it works on a live run's directory and after a crash alike.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from asyncrl.runtime.config import RunConfig, load_config
from asyncrl.runtime.core import CoreSettings
from asyncrl.runtime.core.status import summarize
from asyncrl.runtime.durable import recover
from asyncrl.runtime.journal import JournalCorrupt
from asyncrl.runtime.rundir import RunDir

from ._common import UsageError, run_command

__all__ = ["main"]


def _inspect(args: argparse.Namespace) -> int:
    run = RunDir(args.run_dir)
    if not run.journal.is_dir():
        raise UsageError(f"{run.journal} does not exist: is {run.root} a run directory?")
    cfg = load_config(run.config) if run.config.exists() else RunConfig()
    try:
        core, found = recover(run.journal, CoreSettings.from_config(cfg))
    except JournalCorrupt as error:
        raise UsageError(f"{error}; the journal cannot be replayed past this point") from None
    summary = summarize(core.state)
    summary["journal"] = {
        "records": found.last_seq,
        "snapshot_at": found.snapshot_seq,
        "torn_bytes_ignored": found.torn_bytes,
    }
    print(json.dumps(summary, indent=None if args.json else 2, sort_keys=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl-scheduler", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(title="commands")
    inspect = commands.add_parser("inspect", help="replay a run's journal and summarize it")
    inspect.add_argument("run_dir", type=Path, help="the run directory (run.dir)")
    inspect.add_argument("--json", action="store_true", help="one line of JSON")
    inspect.set_defaults(handler=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("asyncrl-scheduler", build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
