"""One machine's share of a run, started, watched and restarted: ``asyncrl node``, and
``asyncrl run`` as the machine that runs all of it.

Before anything starts, ``asyncrl-worker check`` looks at the roles this machine runs.
The machine with the scheduler makes what the run's processes share in the run directory
(the run secret; CurveZMQ keys when the bus is encrypted and there are none) and shows
the step progress; another machine waits for them there (``wait_s``), derives its
workers' keys from the same secret, and ends when its workers have left at the run's end
(or the scheduler wrote that the run is finished: a worker started again too late never
hears it on the bus). Every machine stops its children on Ctrl-C and stops with the reason
when one of them fails the same way on every start (supervisor.py).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from asyncrl.runtime.contract.bus import finished_steps, read_endpoints, serves_ipc
from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile
from asyncrl.transport.host import process_alive
from asyncrl.transport.identity import RunSecretError, ensure_run_secret, load_run_secret
from asyncrl.transport.security import (
    KeyFileError,
    curve_required,
    ensure_keys,
    is_loopback,
    load_client_keys,
)
from asyncrl.transport.sockets import tcp_endpoint

from .gpus import VISIBLE_ENV
from .plan import WORKER_MODULE, NodePlan, node_specs
from .progress import ProgressReporter
from .supervisor import ChildSpec, Supervisor
from .supervisor_events import describe

__all__ = ["NodeError", "make_keys", "preflight", "run_node", "wait_for_the_run"]

_WAIT_S = 300.0  # how long a machine waits for the scheduler's machine to set the run up
# A worker is killed as frozen only when clearly so: a short scheduler.worker_timeout_s
# (a test's) must not turn a slow moment on a busy machine into a kill.
_FROZEN_AFTER_AT_LEAST_S = 10.0


class NodeError(Exception):
    """What stops a machine before it starts anything, in one line."""


def run_node(
    cfg: RunConfig,
    config_args: Sequence[str],
    plan: NodePlan,
    *,
    resume: bool,
    prog: str = "asyncrl node",
    wait_s: float = _WAIT_S,
) -> int:
    """Run ``plan`` on this machine until the run ends; returns the exit status."""
    roles = None if plan.node is None else list(plan.roles)  # None: every role of the run
    status = preflight(config_args, roles, prog) if roles != [] else 0
    if status != 0:
        return status  # nothing started: the reasons are on the terminal already
    run = RunDir.of(cfg)
    run.make()
    run.logs.mkdir(mode=0o700, exist_ok=True)
    say = _printer(prog)
    if plan.scheduler:
        _forget_dead_scheduler(cfg, say)
        make_keys(cfg, say)
        secret = ensure_run_secret(run.secret)  # the scheduler reads the same one
        local_only = not serves_ipc(cfg.scheduler) and is_loopback(cfg.scheduler.host)
        if plan.node is not None and local_only:
            say(f"scheduler.host={cfg.scheduler.host} is loopback: only this machine's "
                "workers reach it (set it to this machine's address, or 0.0.0.0)")  # fmt: skip
    else:
        secret = wait_for_the_run(cfg, plan, wait_s, say)
    specs = node_specs(cfg, config_args, plan, resume=resume, run_secret=secret)
    say(f"{cfg.run.name} in {run.root}: {_what(plan, specs)}; logs in {run.logs}")
    gpus = {s.name: s.env[VISIBLE_ENV] for s in specs if s.env and VISIBLE_ENV in s.env}
    if gpus:
        say("GPUs: " + ", ".join(f"{name} {gpu}" for name, gpu in gpus.items()))
    supervisor = Supervisor(
        specs,
        run.logs,
        # A worker silent as long as the scheduler takes for death, but alive, is frozen
        stall_after_s=max(cfg.scheduler.worker_timeout_s, _FROZEN_AFTER_AT_LEAST_S),
        on_event=lambda k, f: say(describe(k, f)),
    )
    try:
        with contextlib.ExitStack() as stack:
            if plan.scheduler:
                stack.enter_context(ProgressReporter(run.metrics, cfg.run.total_steps))
            else:
                stack.enter_context(_watch_for_the_end(run, cfg.run.total_steps, supervisor))
            return supervisor.run()
    finally:
        _release_shared_weights(cfg)
        _release_shared_payloads()


def _printer(prog: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    return say


def _what(plan: NodePlan, specs: Sequence[ChildSpec]) -> str:
    workers = len(specs) - plan.scheduler
    if plan.node is None:
        return f"scheduler and {workers} workers"
    names = ", ".join(spec.name for spec in specs)
    return f"{names} ({workers} worker{'' if workers == 1 else 's'})"


def preflight(config_args: Sequence[str], roles: Sequence[str] | None, prog: str) -> int:
    """``asyncrl-worker check`` on the same config, for ``roles`` (None: every role of the
    run): what they can see is wrong now (a model directory, a plug-in path, a device),
    each a line on stderr; 0 if nothing.

    A check ended by a signal (killed, say) said nothing about the config: it runs
    again, ``_PREFLIGHT_TRIES`` times at most."""
    argv = [sys.executable, "-m", WORKER_MODULE, "check", *config_args]
    if roles is not None:
        argv += ["--roles", ",".join(roles)]
    for _ in range(_PREFLIGHT_TRIES):
        code = subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode
        if code >= 0:
            return code
        name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
        print(f"{prog}: the check before the start ended by {name}; checking again",
              file=sys.stderr)  # fmt: skip
    print(f"{prog}: the check before the start never finished ({_PREFLIGHT_TRIES} tries)",
          file=sys.stderr)  # fmt: skip
    return 1


# A check ended by a signal is no verdict on the config, and it loads no model that could
# run a machine out of memory every time: it is tried again more often than a worker start
# (three), so that kill -9 of anything every few seconds cannot stop the run before it
# starts.
_PREFLIGHT_TRIES = 10


def _forget_dead_scheduler(cfg: RunConfig, say: Callable[[str], None]) -> None:
    """A scheduler killed outright leaves its endpoints behind; workers must not dial them.
    (Only the machine that runs the scheduler judges: a pid is this machine's.) Nor may
    they dial what another user left there: the scheduler about to start writes its own."""
    run = RunDir.of(cfg)
    try:
        found = read_endpoints(run, cfg.scheduler.curve)
    except UntrustedFile as error:
        run.endpoints.unlink(missing_ok=True)
        say(f"removed {run.endpoints.name}, which was not trusted: {error}")
        return
    if found is None or found.pid is None:
        return
    # Another user's live process counts as alive: the scheduler's journal lock says so.
    if not process_alive(found.pid):
        run.endpoints.unlink(missing_ok=True)


def make_keys(cfg: RunConfig, say: Callable[[str], None]) -> None:
    """CurveZMQ keys in ``scheduler.keys_dir`` when the bus needs them and has none."""
    sched = cfg.scheduler
    if serves_ipc(sched) or not curve_required(tcp_endpoint(sched.host, 0), sched.curve):
        return
    keys = RunDir.of(cfg).keys
    if ensure_keys(keys):  # some there already: the scheduler names what lacks
        say(f"made CurveZMQ keys in {keys} (0600): every machine's workers read them there")


def wait_for_the_run(
    cfg: RunConfig, plan: NodePlan, wait_s: float, say: Callable[[str], None]
) -> bytes:
    """The run secret, once the scheduler's machine has made it in the shared run
    directory, the scheduler has announced where it listens (unless ``plan.dial`` says),
    and, for an encrypted bus, the keys are there; NodeError after ``wait_s``."""
    run = RunDir.of(cfg)
    deadline = time.monotonic() + wait_s
    waited_for = None
    while True:
        missing, secret = _what_is_missing(cfg, plan)
        if missing is None:
            return secret
        if time.monotonic() >= deadline:
            raise NodeError(
                f"no {missing} after {wait_s:g}s: start the machine with the scheduler "
                f"(asyncrl node --with-scheduler) on run.dir={run.root}, a directory every "
                "machine of the run shares"
            )
        if missing != waited_for:
            say(f"waiting for {missing} (from the machine with the scheduler)")
            waited_for = missing
        time.sleep(0.5)


def _what_is_missing(cfg: RunConfig, plan: NodePlan) -> tuple[str | None, bytes]:
    run = RunDir.of(cfg)
    try:
        secret = load_run_secret(run.secret)
    except FileNotFoundError:
        return f"run secret {run.secret}", b""
    except RunSecretError as error:
        raise NodeError(str(error)) from None
    try:
        if plan.dial is None and read_endpoints(run, cfg.scheduler.curve) is None:
            return f"scheduler's endpoints {run.endpoints}", b""
    except UntrustedFile as error:
        raise NodeError(str(error)) from None
    if _encrypted(cfg, plan):
        try:
            load_client_keys(run.keys)
        except KeyFileError:
            return f"CurveZMQ keys in {run.keys}", b""
    return None, secret


def _encrypted(cfg: RunConfig, plan: NodePlan) -> bool:
    """Whether the workers' bus is under CURVE, as they will find the scheduler."""
    if plan.dial is not None:
        return curve_required(plan.dial, cfg.scheduler.curve)
    found = read_endpoints(RunDir.of(cfg), cfg.scheduler.curve)
    return found is not None and found.curve


@contextlib.contextmanager
def _watch_for_the_end(run: RunDir, total_steps: int, supervisor: Supervisor) -> Iterator[None]:
    """Tell ``supervisor`` the run is over once the scheduler wrote so in the run dir."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            steps = finished_steps(run)
            if steps is not None and steps >= total_steps:
                supervisor.finish(f"the run is finished ({steps} steps)")
                return

    thread = threading.Thread(target=watch, name="run-end", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _release_shared_payloads() -> None:
    """Every process has ended: payloads a killed worker left in RAM go too."""
    from asyncrl.transport.dataplane.store import default_shared_dir, sweep_stale

    shared = default_shared_dir()
    if shared is not None:
        sweep_stale(shared)


def _release_shared_weights(cfg: RunConfig) -> None:
    """Every process has ended: staged weights a killed trainer (or critic) left in RAM go
    too."""
    weights = cfg.weights
    if not (weights.strategy == "shm" or (weights.strategy == "ucx" and weights.map_on_host)):
        return
    from asyncrl.transport.weights.shm import sweep

    run = RunDir.of(cfg)
    # The critic's first: its directory is inside the policy's.
    for directory in (run.critic_weight_dirs(weights).shared, run.weight_dirs(weights).shared):
        sweep(directory)
        with contextlib.suppress(OSError):  # gone already, or holding files not ours
            directory.rmdir()
