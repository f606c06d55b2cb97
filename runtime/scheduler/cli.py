"""``asyncrl-scheduler``: the scheduler's commands.

    asyncrl-scheduler start -c run.yaml [--resume]   # serve the run (journal in run.dir)
    asyncrl-scheduler status -c run.yaml [--json]    # ask the live scheduler where it stands
    asyncrl-scheduler stop -c run.yaml               # drain: no new leases, then exit
    asyncrl-scheduler keygen DIR                     # CurveZMQ keys (start makes them if none)

``status`` and ``stop`` find the scheduler through ``<run.dir>/endpoints.json`` (or
``--scheduler tcp://HOST:PORT``). A run's journal is replayed by the user's command,
``asyncrl inspect RUN_DIR --journal``; ``asyncrl-scheduler inspect`` says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from asyncrl.runtime.contract.bus import next_port, read_endpoints
from asyncrl.runtime.contract.child_status import note_starting, note_up
from asyncrl.runtime.contract.commands import (
    UsageError,
    add_config_arguments,
    config_from_args,
    require_extras,
    run_command,
)
from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.logs import configure_logging
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile
from asyncrl.runtime.scheduler.durable import JournalExists
from asyncrl.runtime.scheduler.journal import JournalLocked
from asyncrl.runtime.scheduler.service.assembly import StagesChanged
from asyncrl.runtime.scheduler.service.process import serve
from asyncrl.runtime.scheduler.status_text import render_status
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkTimeout
from asyncrl.transport.security import (
    KeyFileError,
    curve_required,
    keygen,
    load_client_keys,
)

__all__ = ["main"]


def _start(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    require_extras(cfg)
    configure_logging(
        process="scheduler",
        level=cfg.logging.level,
        fmt=cfg.logging.format,
        max_bytes=cfg.logging.file_mb << 20,
        keep=cfg.logging.files_kept,
    )
    endpoints = _private_ipc(RunDir.of(cfg)) if args.ipc else None
    # Under asyncrl run: a failure before note_up is one to start, which a restart repeats;
    # one after it (a kill -9 mid-run) is resumed from the journal however soon it comes.
    note_starting()
    try:
        return serve(cfg, resume=args.resume, endpoints=endpoints, on_listening=note_up)
    except (JournalExists, StagesChanged) as error:
        raise UsageError(str(error)) from None
    except JournalLocked:
        raise UsageError(f"another scheduler is serving {cfg.run.dir}; stop it first") from None
    except KeyFileError as error:
        raise UsageError(str(error)) from None


def _private_ipc(run: RunDir) -> tuple[str, str]:
    """ipc:// control and events endpoints in a directory only this user can open."""
    directory = run.bus_sockets
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)
    for path in (directory.parent, directory):
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UsageError(f"{path} must belong to this user and be closed to others")
    return f"ipc://{directory}/control", f"ipc://{directory}/events"


def _ask(args: argparse.Namespace, message: p.Message) -> p.Message:
    """Send one request to the live scheduler of the run (or at --scheduler)."""
    from asyncrl.transport.zmq_link import ZmqLink

    cfg = config_from_args(args)
    control, events, curve = _where(args, cfg)
    keys = load_client_keys(RunDir.of(cfg).keys) if curve else None
    with ZmqLink(control, events, identity=f"observer-{os.getpid()}", client_keys=keys) as link:
        try:
            return link.request(message, timeout_s=args.timeout)
        except LinkTimeout:
            raise UsageError(
                f"no scheduler answered at {control} within {args.timeout:g}s: is it running?"
            ) from None


def _where(args: argparse.Namespace, cfg: RunConfig) -> tuple[str, str, bool]:
    """Control and events endpoints, and whether the bus is encrypted."""
    run = RunDir.of(cfg)
    if args.scheduler:
        curve = curve_required(args.scheduler, cfg.scheduler.curve)
        return args.scheduler, next_port(args.scheduler), curve
    try:
        found = read_endpoints(run, cfg.scheduler.curve)
    except UntrustedFile as error:
        raise UsageError(str(error)) from None
    if found is None:
        raise UsageError(
            f"no scheduler is serving {run.root} (no {run.endpoints.name}); "
            "start one with `asyncrl-scheduler start` or pass --scheduler tcp://HOST:PORT"
        )
    return found.control, found.events, found.curve


def _status(args: argparse.Namespace) -> int:
    while True:
        reply = _ask(args, p.Status())
        if not isinstance(reply, p.StatusReply):
            raise UsageError(f"unexpected reply {reply!r}")
        if args.json:
            print(json.dumps(reply.summary, sort_keys=True))
        else:
            if args.watch and sys.stdout.isatty():
                print("\033[H\033[J", end="")  # redraw in place, like watch(1)
            print(render_status(reply.summary), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _stop(args: argparse.Namespace) -> int:
    reply = _ask(args, p.Stop(args.reason))
    if isinstance(reply, p.Error):
        raise UsageError(f"stop refused: {reply.detail}")
    count = reply.count if isinstance(reply, p.Ack) else 0
    print(f"draining: {count} lease(s) still running; the scheduler exits when they end")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    try:
        keygen(args.directory)
    except FileExistsError as error:
        raise UsageError(str(error)) from None
    print(
        f"wrote server and client key pairs to {args.directory} (files are 0600); "
        "give workers the client pair and server.key"
    )
    return 0


def _inspect_moved(args: argparse.Namespace) -> int:
    raise UsageError(
        "inspect is a command of asyncrl, not of asyncrl-scheduler: "
        "asyncrl inspect RUN_DIR --journal replays a run's journal (--json: one line)"
    )


def _add_live_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--scheduler", help="control endpoint, e.g. tcp://10.0.0.5:5555")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a reply")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl-scheduler", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(title="commands")

    start = commands.add_parser("start", help="serve a run: bind the bus, journal every change")
    add_config_arguments(start)
    start.add_argument("--resume", action="store_true", help="continue the run in run.dir")
    start.add_argument(
        "--ipc",
        action="store_true",
        help="serve on ipc:// sockets only this user can open (asyncrl run does, locally)",
    )
    start.set_defaults(handler=_start)

    status = commands.add_parser("status", help="the live scheduler's counts, workers, versions")
    _add_live_arguments(status)
    status.add_argument("--json", action="store_true", help="one line of JSON")
    status.add_argument("--watch", type=float, metavar="S", help="repeat every S seconds")
    status.set_defaults(handler=_status)

    stop = commands.add_parser("stop", help="drain: no new leases, exit when running ones end")
    _add_live_arguments(stop)
    stop.add_argument("--reason", default="asyncrl-scheduler stop", help="logged with the stop")
    stop.set_defaults(handler=_stop)

    keys = commands.add_parser("keygen", help="write CurveZMQ key pairs (files 0600)")
    keys.add_argument("directory", type=Path, help="where to write them (scheduler.keys_dir)")
    keys.set_defaults(handler=_keygen)

    # The one inspect is the user's (asyncrl inspect); this name stays to say so.
    moved = commands.add_parser("inspect", help="moved: asyncrl inspect RUN_DIR --journal")
    moved.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    moved.set_defaults(handler=_inspect_moved)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("asyncrl-scheduler", build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
