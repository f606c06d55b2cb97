"""``asyncrl``: the user's entry point.

asyncrl run -c run.yaml [--resume]        # scheduler + every worker on this machine
asyncrl node -c run.yaml --roles generate=2,logp [--with-scheduler] [--resume]
                                          # this machine's share of a run on several
asyncrl launch --on slurm|ray -c run.yaml [--dry-run]  # on a cluster, as placement says
asyncrl config check -c run.yaml pipeline.max_staleness=0
asyncrl config show -c run.yaml          # the resolved config, as YAML
asyncrl config keys                      # every key with its default and meaning
asyncrl inspect runs/arithmetic [--json] # where a run's step time goes (live, done, crashed)
asyncrl inspect runs/arithmetic --journal  # the journal replayed: where the run stands
asyncrl report runs/arithmetic           # pictures and an HTML page in runs/arithmetic/report
asyncrl eval -c run.yaml --checkpoint runs/arithmetic/final [--samples 8]
                                         # a checkpoint scored as the run validates
asyncrl clean [RUN_DIR ...] [--dry-run]  # what runs killed with -9 left in /dev/shm and runs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from asyncrl.runtime.contract.commands import (
    UsageError,
    add_config_arguments,
    config_from_args,
    require_extras,
    run_command,
)
from asyncrl.runtime.contract.config import describe_fields, dump_config

from ._clean import add_clean_parser
from ._launch import add_launch_parser
from ._node import add_node_parser

__all__ = ["main"]


def _check(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    source = args.config or "defaults"
    print(f"ok: {source} is a valid configuration (run {cfg.run.name!r} in {cfg.run.dir})")
    return 0


def _show(args: argparse.Namespace) -> int:
    print(dump_config(config_from_args(args)), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    from asyncrl.runtime.launch.local import run_locally

    cfg = config_from_args(args)
    require_extras(cfg)  # before any process starts
    config_args = [*(["-c", str(args.config.resolve())] if args.config else []), *args.overrides]
    return run_locally(cfg, config_args, resume=args.resume)


def _keys(_args: argparse.Namespace) -> int:
    rows = describe_fields()
    width = max(len(key) for key, _, _ in rows)
    for key, default, text in rows:
        print(f"{key:<{width}}  {default:<24}  {text}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from asyncrl.runtime.scheduler.replay import existing_run, replay_journal, run_config

    from ._breakdown import breakdown, render_breakdown, step_lines

    run = existing_run(args.run_dir)
    if args.journal:
        if not run.journal.is_dir():
            raise UsageError(f"{run.journal} does not exist: is {run.root} a run directory?")
        summary = replay_journal(run)
        print(json.dumps(summary, indent=None if args.json else 2, sort_keys=True))
        return 0
    report = breakdown(step_lines(run.metrics))
    total = run_config(run).run.total_steps
    done = f"{report['last_step'] or 0}/{total} steps in metrics.jsonl"
    if not run.journal.is_dir():
        done += " (no journal)"
    else:
        try:
            summary = replay_journal(run)
        except UsageError as error:  # the step lines are still worth showing
            report["journal"] = {"error": str(error)}
            done += f" (journal not replayed: {error})"
        else:
            report["journal"] = {
                "steps_done": summary["steps_done"],
                "groups": summary["groups"],
                "created": summary["created"],
            }
            done = f"{summary['steps_done']}/{total} steps done (journal)"
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    elapsed = report["elapsed_s"]
    when = f", last step line at {elapsed:.1f} s" if isinstance(elapsed, int | float) else ""
    print(render_breakdown(report, f"{run.root}: {done}{when}"))
    return 0


def _report(args: argparse.Namespace) -> int:
    from asyncrl.runtime.launch.report import MissingExtra, write_report
    from asyncrl.runtime.scheduler.replay import existing_run

    run = existing_run(args.run_dir)
    try:
        report = write_report(run.root, args.out)
    except MissingExtra as error:
        raise UsageError(str(error)) from None
    for line in report.missing:
        print(f"asyncrl report: not shown: {line}")
    print(f"wrote {report.page} ({len(report.pictures)} pictures beside it)")
    return 0


def _evaluate(argv: Sequence[str]) -> int:
    """``asyncrl eval``: the actors' code scores a checkpoint, in a process of its own as
    every worker runs (this package starts actors' code, it does not import it)."""
    import signal
    import subprocess

    from asyncrl.runtime.launch.plan import WORKER_MODULE

    child = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "eval", *argv])

    def forward(signum: int, _frame: object) -> None:
        # A terminal's Ctrl-C reaches the child too; a kill of this process alone, only
        # through here. The child stops once, whichever comes first, and cleans up.
        child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    return child.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(title="commands")
    run = commands.add_parser("run", help="run the whole pipeline on this machine")
    add_config_arguments(run)
    run.add_argument("--resume", action="store_true", help="continue the run in run.dir")
    run.set_defaults(handler=_run)
    add_node_parser(commands)
    add_launch_parser(commands)
    config = commands.add_parser("config", help="validate and show run configurations")
    actions = config.add_subparsers(title="actions")
    for name, handler, text in (
        ("check", _check, "validate a config (and overrides); one line per problem"),
        ("show", _show, "print the resolved config as YAML"),
    ):
        sub = actions.add_parser(name, help=text)
        add_config_arguments(sub)
        sub.set_defaults(handler=handler)
    actions.add_parser("keys", help="list every key with its default").set_defaults(handler=_keys)
    inspect = commands.add_parser(
        "inspect", help="where a run's time goes: per role, and a train step's critical path"
    )
    inspect.add_argument("run_dir", type=Path, help="the run directory (run.dir)")
    inspect.add_argument("--json", action="store_true", help="one line of JSON")
    inspect.add_argument(
        "--journal",
        action="store_true",
        help="replay the journal (read-only) and print where the run stands, in full",
    )
    inspect.set_defaults(handler=_inspect)
    report = commands.add_parser(
        "report", help="plots, the lease timeline and one HTML page of a run (live or done)"
    )
    report.add_argument("run_dir", type=Path, help="the run directory (run.dir)")
    report.add_argument("--out", type=Path, help="where to write (default RUN_DIR/report)")
    report.set_defaults(handler=_report)
    add_clean_parser(commands)
    # Listed here; main() hands the arguments to the evaluation's own parser.
    commands.add_parser(
        "eval",
        help="score a checkpoint on the run's validation sets: asyncrl eval --help",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["eval"]:
        return _evaluate(args[1:])
    return run_command("asyncrl", build_parser(), args)


if __name__ == "__main__":
    raise SystemExit(main())
