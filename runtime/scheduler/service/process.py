"""The scheduler process: config in, bound sockets, the daemon loop, a clean exit.

Where the bus is lives in ``<run.dir>/endpoints.json`` while the scheduler runs (ports may
be 0 = picked by the OS), so workers, ``status`` and ``stop`` can find it from the run's
configuration alone.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import structlog
import zmq

from asyncrl.runtime.contract.bus import (
    Endpoints,
    announce_endpoints,
    announce_finished,
    dialable,
    read_endpoints,
)
from asyncrl.runtime.contract.child_status import STOPS_THE_RUN, note_failure
from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.gc_policy import settle_after_startup
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile
from asyncrl.transport.identity import ensure_run_secret
from asyncrl.transport.security import ServerKeys, curve_required, ensure_keys, load_server_keys
from asyncrl.transport.sockets import (
    BoundSockets,
    bind_scheduler_sockets,
    bind_scheduler_sockets_at,
    tcp_endpoint,
)

from .assembly import open_service
from .connections import Connections
from .daemon import SchedulerDaemon
from .service import SchedulerService

__all__ = ["serve"]

log = structlog.get_logger("asyncrl.scheduler")

_FILES_PER_WORKER = 2  # its DEALER's connection and its SUB's


def _allow_many_connections() -> None:
    """Every worker holds two connections to the scheduler, each an open file: at the
    common soft limit of 1,024 open files a scheduler would refuse its 500th worker. The
    soft limit is raised to the hard one, as a server's is; a low hard limit is said."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    workers = soft // _FILES_PER_WORKER - 64  # a few for the journal, logs and sockets
    if workers < 4096:
        log.info("open files limit the workers", open_files=soft, workers_at_most=workers)


def serve(
    cfg: RunConfig,
    *,
    resume: bool,
    endpoints: tuple[str, str] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> int:
    """Run the scheduler until the run is finished or it is stopped; returns the exit code
    (child_status.STOPS_THE_RUN when the run cannot go on, its reason noted for the
    supervisor).

    ``endpoints`` (control, events) replaces the config's host and ports, e.g. with
    ``ipc://`` paths for a benchmark on one machine. ``on_listening`` is called once the
    journal is replayed and the endpoints are announced: the scheduler is up.
    """
    sched = cfg.scheduler
    _allow_many_connections()
    # Made by the launcher already under asyncrl run; resuming, the one the journal's
    # fences were keyed with.
    secret = ensure_run_secret(RunDir.of(cfg).secret)
    wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    service = open_service(
        cfg,
        resume=resume,
        now=time.monotonic(),
        on_progress=lambda: os.eventfd_write(wake_fd, 1),
        run_secret=secret,
    )
    ctx = zmq.Context()
    sockets: BoundSockets | None = None
    metrics, metrics_server = None, None
    try:
        if sched.metrics_port:
            metrics, metrics_server = _serve_metrics(
                service, sched.metrics_host, sched.metrics_port
            )
        control = endpoints[0] if endpoints else tcp_endpoint(sched.host, sched.control_port)
        curve = curve_required(control, sched.curve)
        options: dict[str, Any] = {
            "max_message_bytes": sched.max_message_mb << 20,
            "server_keys": _server_keys(RunDir.of(cfg)) if curve else None,
        }
        if endpoints is None:
            sockets = _bind(ctx, cfg, resume, options)
        else:
            sockets = bind_scheduler_sockets_at(ctx, *endpoints, **options)
        daemon = SchedulerDaemon(
            service,
            sockets.control,
            sockets.events,
            wake_fd,
            ack_after=sched.ack_after,
            busy_poll_s=sched.busy_poll_us / 1e6,
            exit_grace_s=2 * sched.heartbeat_interval_s + 1,
            auth_failures=sockets.auth_failures,
            on_tick=None if metrics is None else metrics.refresh,
            connections=Connections(service.core, secret),
        )
        # Before announcing: a worker's first request meets no start-up collection.
        settle_after_startup()
        _announce(cfg, sockets, curve, resume, service.core.state.steps_done)
        if on_listening is not None:
            on_listening()
        with _stop_signals(daemon):
            code = daemon.run()
        if service.failure is not None:  # no restart of the scheduler can help
            note_failure(service.failure)
            code = STOPS_THE_RUN
        if service.finished:  # for machines whose workers missed the end on the bus
            announce_finished(RunDir.of(cfg), service.core.state.steps_done)
        RunDir.of(cfg).endpoints.unlink(missing_ok=True)  # finished or stopped: nobody dials
        return code
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        service.durable.close()
        service.close_files()
        if sockets is not None:
            sockets.close()
        ctx.term()
        os.close(wake_fd)
        log.info("scheduler stopped", steps=service.core.state.steps_done)


def _serve_metrics(service: SchedulerService, host: str, port: int) -> tuple[Any, Any]:
    """Prometheus metrics at http://host:port/metrics (live_metrics.py)."""
    from .live_metrics import LiveMetrics, serve_metrics

    live = LiveMetrics(service)
    server = serve_metrics(live, host, port)
    log.info("metrics served", url=f"http://{host}:{port}/metrics")
    return live, server


def _server_keys(run: RunDir) -> ServerKeys:
    """The bus's keys, made in the run directory first if it has none: a scheduler started
    by hand on loopback is under CURVE too, and its own tools dial with the keys there."""
    if ensure_keys(run.keys):
        log.info("made CurveZMQ keys (0600)", keys=str(run.keys))
    return load_server_keys(run.keys)


def _bind(ctx: zmq.Context, cfg: RunConfig, resume: bool, options: dict[str, Any]):
    """The configured host and ports; resuming with ports left to the OS, the ports of the
    scheduler this one replaces, when they are free: its workers are still dialling them."""
    sched = cfg.scheduler
    left = None
    if resume:
        try:
            left = read_endpoints(RunDir.of(cfg), sched.curve)
        except UntrustedFile as error:  # not the old scheduler's: its ports mean nothing
            log.warning("endpoints left behind are not trusted", error=str(error))
    if left is not None and sched.control_port == 0 and sched.events_port == 0:
        with contextlib.suppress(zmq.ZMQError, ValueError):  # taken, or not ours to read
            ports = [int(e.rpartition(":")[2]) for e in (left.control, left.events)]
            return bind_scheduler_sockets(ctx, sched.host, *ports, **options)
    where = (sched.host, sched.control_port, sched.events_port)
    return bind_scheduler_sockets(ctx, *where, **options)


def _announce(cfg: RunConfig, sockets: BoundSockets, curve: bool, resume: bool, steps: int) -> None:
    # Bound to every interface (scheduler.host 0.0.0.0), it announces an address to dial.
    control, events = dialable(sockets.control_endpoint), dialable(sockets.events_endpoint)
    where = Endpoints(control, events, curve, os.getpid())
    announce_endpoints(RunDir.of(cfg), where)
    log.info(
        "scheduler listening",
        resumed=resume,
        steps_done=steps,
        control=where.control,
        events=where.events,
        curve=where.curve,
        pid=where.pid,
    )


@contextlib.contextmanager
def _stop_signals(daemon: SchedulerDaemon) -> Iterator[None]:
    """SIGTERM or Ctrl-C: drain; a second one: stop now."""
    handler = lambda _signum, _frame: daemon.request_stop()  # noqa: E731
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
