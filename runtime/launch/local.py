"""``asyncrl run``: a whole pipeline on this machine, as the config describes it.

The scheduler and every worker are separate processes started by the supervisor with the
same configuration arguments, so each resolves the same config; workers find the
scheduler through ``<run.dir>/endpoints.json`` (ports may be 0: picked by the OS).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence

from asyncrl.runtime.bus import read_endpoints, serves_ipc
from asyncrl.runtime.config import RunConfig, workers_to_start
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport.host import process_alive
from asyncrl.transport.identity import WORKER_KEY_ENV, ensure_run_secret, worker_key

from .gangs import ENV_RANK, ENV_SIZE
from .progress import ProgressReporter
from .supervisor import ChildSpec, Supervisor

__all__ = ["GROUPED_ROLES", "WORKER_MODULE", "local_specs", "preflight", "run_locally"]

# Workers are started by module name: the launcher runs role code, it never imports it.
WORKER_MODULE = "asyncrl.actors.cli"
# Roles whose workers form one group of ranks (pipeline.workers.train=N: N ranks of one
# sharded trainer; logp, ref_logp: of one sharded scorer), rather than N independent workers.
GROUPED_ROLES = frozenset({"train", "logp", "ref_logp"})


def local_specs(
    cfg: RunConfig, config_args: Sequence[str], *, resume: bool, run_secret: bytes = b""
) -> list[ChildSpec]:
    """The scheduler first (the primary), then ``pipeline.workers[role]`` workers per role.

    With ``run_secret`` each worker gets its worker key in its environment (never on its
    command line, which any user may read): restarted under the same name, it is known
    to the scheduler as the same worker at once (transport/identity.py).
    """
    python = [sys.executable, "-m"]
    start = [*python, "asyncrl.runtime.cli.scheduler", "start", *config_args]
    if serves_ipc(cfg.scheduler):
        start.append("--ipc")  # every process is on this host: no TCP port for others
    # A scheduler that dies resumes from its journal; its workers find it again.
    resumed = [*start, "--resume"]
    specs = [
        ChildSpec("scheduler", resumed if resume else start, restart=False, resume_argv=resumed)
    ]
    for role, count in workers_to_start(cfg).items():
        for index in range(count):
            argv = [*python, WORKER_MODULE, "--role", role, "--index", str(index)]
            env: dict[str, str] = {}
            gang = None
            if run_secret:
                env[WORKER_KEY_ENV] = worker_key(run_secret, f"{role}-{index}").hex()
            if role in GROUPED_ROLES and count > 1:
                # One group of ranks, rank 0 its leader (the only one the scheduler sees).
                env, gang = {**env, ENV_RANK: str(index), ENV_SIZE: str(count)}, role
            name, full = f"{role}-{index}", [*argv, *config_args]
            specs.append(ChildSpec(name, full, True, env=env or None, gang=gang))
    return specs


def _forget_dead_scheduler(cfg: RunConfig) -> None:
    """A scheduler killed outright leaves its endpoints behind; workers must not dial them."""
    run = RunDir.of(cfg)
    found = read_endpoints(run)
    if found is None or found.pid is None:
        return
    # Another user's live process counts as alive: the scheduler's journal lock says so.
    if not process_alive(found.pid):
        run.endpoints.unlink(missing_ok=True)


def preflight(config_args: Sequence[str]) -> int:
    """``asyncrl-worker check`` on the same config: what the roles can see is wrong now
    (a model directory, a plug-in path, a device), each a line on stderr; 0 if nothing.

    A check ended by a signal (killed, say) said nothing about the config: it runs
    again, ``_PREFLIGHT_TRIES`` times at most."""
    argv = [sys.executable, "-m", WORKER_MODULE, "check", *config_args]
    for _ in range(_PREFLIGHT_TRIES):
        code = subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode
        if code >= 0:
            return code
        name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
        print(f"asyncrl run: the check before the start ended by {name}; checking again",
              file=sys.stderr)  # fmt: skip
    print(f"asyncrl run: the check before the start never finished ({_PREFLIGHT_TRIES} tries)",
          file=sys.stderr)  # fmt: skip
    return 1


# A check ended by a signal is no verdict on the config, and it loads no model that could
# run a machine out of memory every time: it is tried again more often than a worker start
# (three), so that kill -9 of anything every few seconds cannot stop the run before it
# starts.
_PREFLIGHT_TRIES = 10


def run_locally(cfg: RunConfig, config_args: Sequence[str], *, resume: bool) -> int:
    status = preflight(config_args)
    if status != 0:
        return status  # nothing started: the reasons are on the terminal already
    run = RunDir.of(cfg)
    run.logs.mkdir(parents=True, exist_ok=True)
    _forget_dead_scheduler(cfg)
    secret = ensure_run_secret(run.secret)  # the scheduler reads the same one
    specs = local_specs(cfg, config_args, resume=resume, run_secret=secret)
    print(
        f"asyncrl run: {cfg.run.name} in {run.root}: scheduler and {len(specs) - 1} workers; "
        f"logs in {run.logs}",
        file=sys.stderr,
    )
    try:
        with ProgressReporter(run.metrics, cfg.run.total_steps):
            return Supervisor(specs, run.logs).run()
    finally:
        _release_shared_weights(cfg)
        _release_shared_payloads()


def _release_shared_payloads() -> None:
    """Every process has ended: payloads a killed worker left in RAM go too."""
    from asyncrl.transport.dataplane.store import default_shared_dir, sweep_stale

    shared = default_shared_dir()
    if shared is not None:
        sweep_stale(shared)


def _release_shared_weights(cfg: RunConfig) -> None:
    """Every process has ended: staged weights a killed trainer left in RAM go too."""
    weights = cfg.weights
    if not (weights.strategy == "shm" or (weights.strategy == "ucx" and weights.map_on_host)):
        return
    from asyncrl.transport.weights.shm import sweep

    directory = RunDir.of(cfg).weight_dirs(weights).shared
    sweep(directory)
    with contextlib.suppress(OSError):  # gone already, or holding files not ours
        directory.rmdir()
