"""``asyncrl-worker``: one stateless worker process for one role of a run.

    asyncrl-worker --role generate --scheduler tcp://HOST:PORT [--events tcp://HOST:PORT]
                   [-c run.yaml] [--index N] [--name NAME] [section.key=value ...]
    asyncrl-worker roles       # each role's stages: what it consumes and what it produces
    asyncrl-worker check [-c run.yaml] [--roles R,R] [section.key=value ...]   # what would
                               # stop a run (of those roles)
    asyncrl-worker eval ...    # asyncrl eval (evaluation/command.py): a checkpoint scored

The role's code is ``ROLES[role]`` of the module ``pipeline.actors`` names. The events
endpoint defaults to the control port + 1. Without ``--scheduler`` the worker dials the
scheduler serving ``run.dir`` (its ``endpoints.json``; else the configured host and ports).
The name is ``--name``, else ``ROLE-N`` with ``--index N``, else ``ROLE-HOST-PID``. SIGTERM
or Ctrl-C: the current lease is finished first; a second one hurries.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence

from asyncrl.runtime.contract.bus import Endpoints, next_port, read_endpoints, serves_ipc
from asyncrl.runtime.contract.child_status import (
    note_failure,
    note_starting,
    note_up,
    note_working,
)
from asyncrl.runtime.contract.commands import (
    UsageError,
    add_config_arguments,
    config_from_args,
    run_command,
)
from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.gangs import ENV_ADDR, ENV_RANK, ENV_SIZE, GangPlace
from asyncrl.runtime.contract.gc_policy import settle_after_startup
from asyncrl.runtime.contract.logs import configure_logging
from asyncrl.runtime.contract.pulse import start_pulse
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from asyncrl.transport import protocol as p
from asyncrl.transport.host import WILDCARD_HOSTS
from asyncrl.transport.identity import PAYLOAD_KEY_ENV, WORKER_KEY_ENV
from asyncrl.transport.security import (
    KeyFileError,
    curve_required,
    is_loopback,
    load_client_keys,
    payload_keys,
)
from asyncrl.transport.sockets import tcp_endpoint
from asyncrl.transport.zmq_link import ZmqLink

from .actor import Actor, ActorBroken
from .training.gang import end_process
from .worker import preflight
from .worker.credentials import worker_credentials
from .worker.data_plane import WorkerPayloads, serving_host
from .worker.loop import Worker, default_worker_name

__all__ = ["main"]

_ENDPOINTS_WAIT_S = 60.0  # how long a worker started beside its scheduler waits for it


def _roles(_args: argparse.Namespace) -> int:
    print(f"{DEFAULT_PIPELINE.entry_role}: feeds new groups into {DEFAULT_PIPELINE.entry}")
    for stage in DEFAULT_PIPELINE.stages:
        print(stage)
    return 0


def _serve(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    actor_class = load_actor_class(cfg.pipeline.actors, args.role)
    found = actor_class.check(cfg)
    if found:  # the same on every start: say so once and stop, do not go round again
        raise UsageError("; ".join(found))
    place = _gang_place(args)
    index = place.rank if place is not None else args.index
    name = args.name or (
        default_worker_name(args.role) if index is None else f"{args.role}-{index}"
    )
    if "/" in name:
        raise UsageError(f"--name {name!r}: a worker's name holds no '/'")
    configure_logging(
        process=name,
        level=cfg.logging.level,
        fmt=cfg.logging.format,
        max_bytes=cfg.logging.file_mb << 20,
        keep=cfg.logging.files_kept,
    )
    if place is None:
        return _run_worker(actor_class(), cfg, name, args.role, _endpoints(args, cfg), index)
    if place.leads:
        where = _endpoints(args, cfg)
        if place.announced and not place.host:
            _listen_where_reached(where, cfg)
        code = _run_worker(actor_class(), cfg, name, args.role, where, index)
    else:
        code = _follow(actor_class(), cfg, place)
    end_process(code)  # a rank's gloo threads must not meet the interpreter's teardown


def _gang_place(args: argparse.Namespace) -> GangPlace | None:
    """This process's place in a group of ranks: from --rank/--ranks/--rendezvous, or the
    environment ``asyncrl run`` gives its workers; None for a worker on its own."""
    given = (args.rank, args.ranks, args.rendezvous)
    if any(value is not None for value in given):
        if any(value is None for value in given):
            raise UsageError("--rank, --ranks and --rendezvous go together")
        os.environ.update(
            {ENV_RANK: str(args.rank), ENV_SIZE: str(args.ranks), ENV_ADDR: args.rendezvous}
        )  # the actor's own start reads its place from there too
    try:
        return GangPlace.from_env()
    except ValueError as error:
        raise UsageError(f"the group of ranks: {error}") from None


def _listen_where_reached(where: Endpoints, cfg: RunConfig) -> None:
    """The leader of a group whose ranks are on several machines, told no host: it
    listens where the others reach this machine, as its payloads are served (the
    address the scheduler is reached from, or ``payloads.host``), on a port the system
    gives (gangs.py). Through the environment, as the actor's own start reads its place."""
    host = serving_host(where.control, cfg.payloads.host)
    os.environ[ENV_ADDR] = f"[{host}]:0" if ":" in host else f"{host}:0"


def _follow(actor: Actor, cfg: RunConfig, place: GangPlace) -> int:
    """Rank > 0 of a group: no scheduler, only the leader's orders until it says stop."""
    # The leader decides when the group stops (its checkpoint needs every rank): a stop
    # signal to a follower is ignored; it leaves when the leader stops or is gone.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    for credential in (WORKER_KEY_ENV, PAYLOAD_KEY_ENV):  # a follower never dials anyone
        os.environ.pop(credential, None)
    try:
        return actor.follow(cfg, place)
    except ActorBroken as error:
        print(f"asyncrl-worker: rank {place.rank}: {error}", file=sys.stderr)
        return 1


def _came_up() -> None:
    note_up()
    # Watched from here on: a supervisor that sees the pulse stop kills this process as
    # frozen. Not before: a start may hold the GIL for long (loading native libraries).
    start_pulse()


def _run_worker(
    actor: Actor, cfg: RunConfig, name: str, role: str, where: Endpoints, index: int | None
) -> int:
    # A supervisor counts a failure before note_up as one to start, however long it took.
    note_starting()
    credentials = worker_credentials(name, role, RunDir.of(cfg))
    try:
        keys = load_client_keys(RunDir.of(cfg).keys) if where.curve else None
    except KeyFileError as error:
        raise UsageError(str(error)) from None
    worker: Worker | None = None

    def late_reply(message: p.Message) -> None:
        if worker is not None:
            worker.late_reply(message)

    link = ZmqLink(
        where.control,
        where.events,
        identity=credentials.routing_id,
        max_message_bytes=cfg.scheduler.max_message_mb << 20,
        client_keys=keys,
        on_late_reply=late_reply,
        busy_poll_s=cfg.scheduler.worker_busy_poll_us / 1e6,
    )
    try:
        payloads = WorkerPayloads(
            name,
            host=serving_host(where.control, cfg.payloads.host),
            inline_bytes=cfg.payloads.inline_bytes,
            fetch_timeout_s=cfg.payloads.fetch_timeout_s,
            max_message_bytes=cfg.scheduler.max_message_mb << 20,
            keys=payload_keys(credentials.payload_secret),  # local fetches included
            shared_memory=cfg.payloads.shared_memory,
        )
        worker = running = Worker(
            actor,
            link,
            cfg,
            name=name,
            index=index,
            payloads=payloads,
            on_started=_came_up,
            on_working=note_working,
            local=is_loopback(_host_of(where.control)),  # ipc://, or TCP on loopback
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda _signum, _frame: running.stop())
        settle_after_startup()
        code = running.run()
        if running.failure is not None:
            note_failure(running.failure)
        return code
    finally:
        link.close()


def load_actor_class(module_name: str, role: str) -> type[Actor]:
    """``ROLES[role]`` of ``module_name``; UsageError naming what is missing."""
    try:
        return preflight.load_actor_class(module_name, role)
    except preflight.PreflightError as error:
        raise UsageError(str(error)) from None


def _check(args: argparse.Namespace) -> int:
    """Every problem the run's roles can see before starting, one line each."""
    roles = [role for role in args.roles.split(",") if role] if args.roles else None
    found = preflight.problems(config_from_args(args), roles)
    for problem in found:
        print(f"asyncrl: {problem}", file=sys.stderr)
    return 2 if found else 0


def _endpoints(args: argparse.Namespace, cfg: RunConfig) -> Endpoints:
    if args.scheduler:
        return _given_endpoints(args.scheduler, args.events, cfg)
    if args.events:
        raise UsageError("--events needs --scheduler")
    return _run_endpoints(cfg)


def _given_endpoints(control: str, events: str | None, cfg: RunConfig) -> Endpoints:
    if events is None:
        if not control.startswith("tcp://"):
            raise UsageError(f"--scheduler {control}: give --events too (not a tcp:// endpoint)")
        try:
            events = next_port(control)
        except ValueError as error:
            raise UsageError(f"--scheduler: {error}") from None
    return Endpoints(control, events, curve_required(control, cfg.scheduler.curve))


def _host_of(endpoint: str) -> str:
    if not endpoint.startswith("tcp://"):
        return "localhost"  # ipc:// and inproc:// never leave the machine
    return endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")


def _run_endpoints(cfg: RunConfig) -> Endpoints:
    """Where the scheduler serving ``run.dir`` listens, as it announced it or as configured."""
    sched = cfg.scheduler
    run = RunDir.of(cfg)
    deadline = time.monotonic() + _ENDPOINTS_WAIT_S
    while True:
        try:
            found = read_endpoints(run, sched.curve)
        except UntrustedFile as error:
            raise UsageError(str(error)) from None
        if found is not None:
            return found
        fixed = sched.control_port and sched.events_port and sched.host not in WILDCARD_HOSTS
        if fixed and not serves_ipc(sched):
            # Fixed ports on a host to dial (not 0.0.0.0, which is every machine's own):
            # dial them now; the link connects once the scheduler is up.
            control = tcp_endpoint(sched.host, sched.control_port)
            return Endpoints(
                control,
                tcp_endpoint(sched.host, sched.events_port),
                curve_required(control, sched.curve),
            )
        if time.monotonic() >= deadline:
            raise UsageError(
                f"no scheduler announced itself in {run.endpoints} within "
                f"{_ENDPOINTS_WAIT_S:g}s; start one or pass --scheduler tcp://HOST:PORT"
            )
        time.sleep(0.2)


def build_parser() -> argparse.ArgumentParser:
    """The worker's own command line (``asyncrl-worker roles`` is :func:`build_roles_parser`)."""
    parser = argparse.ArgumentParser(
        prog="asyncrl-worker",
        description=__doc__.splitlines()[0],
        epilog="`asyncrl-worker roles` lists each role's stages.",
    )
    parser.add_argument("--role", required=True, help="the role to serve, e.g. generate")
    parser.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="the control endpoint")
    parser.add_argument("--events", metavar="tcp://HOST:PORT", help="the events endpoint")
    parser.add_argument("--index", type=int, help="this worker's number within its role")
    parser.add_argument("--name", help="this worker's name in the run (default ROLE-INDEX)")
    group = parser.add_argument_group(
        "a group of ranks (train with pipeline.workers.train > 1, across hosts)"
    )
    group.add_argument("--rank", type=int, help="this process's rank; 0 leads the group")
    group.add_argument("--ranks", type=int, help="how many ranks the group has")
    group.add_argument("--rendezvous", metavar="HOST:PORT", help="where rank 0 listens")
    add_config_arguments(parser)
    parser.set_defaults(handler=_serve)
    return parser


def build_roles_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl-worker roles", description="list the roles and their stages"
    )
    parser.set_defaults(handler=_roles)
    return parser


def build_check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl-worker check",
        description="check what the run's roles need before starting any process",
    )
    parser.add_argument("--roles", metavar="R,R", help="only these roles (default: every one)")
    add_config_arguments(parser)
    parser.set_defaults(handler=_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["roles"]:
        return run_command("asyncrl-worker", build_roles_parser(), args[1:])
    if args[:1] == ["check"]:
        return run_command("asyncrl-worker check", build_check_parser(), args[1:])
    if args[:1] == ["eval"]:
        from .evaluation.command import build_eval_parser

        return run_command("asyncrl eval", build_eval_parser(), args[1:], intermixed=True)
    return run_command("asyncrl-worker", build_parser(), args)


if __name__ == "__main__":
    raise SystemExit(main())
