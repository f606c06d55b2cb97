"""One process of a run as one Ray actor: it starts the process and dies with it.

The launcher (ray_launch.py) makes this class a detached Ray actor with ``max_restarts=-1``, so
Ray places it and, whenever it dies, starts it again, on any node that fits:

- The process is the actor's child, started from the actor's main thread with
  PR_SET_PDEATHSIG (_spawn.py): when the actor dies (its node lost, ``ray.kill``), the
  process dies with it, never left running beside its successor.
- When the process fails (exit non-zero, a signal), the actor's process exits too, and
  Ray starts the actor again (after a delay while the process keeps failing before it
  came up); when it exits 0 (the run is over for it), the actor kills itself for good.
  A process failing on every start the same way (three times, child_status.py) ends its
  actor for good too, its reason in ``logs/NAME.ray``, where the launcher reads it.
- The scheduler's actor makes the run's secret and keys in the run directory, as the
  scheduler's node does, forgets the endpoints of a scheduler before it (it lived on a
  machine Ray may have lost) and starts the scheduler with ``--resume`` once the journal
  exists. A worker's actor waits there for them, then starts its worker under its name
  with the key derived from the secret: restarted anywhere, it is the same worker.
- The ranks of a group (a placement group on one node) live and die together: a rank
  whose process fails kills the other ranks' actors, and every start of rank 0 picks
  the address the group meets at, which the other ranks ask it for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from asyncrl.runtime.contract.bus import finished_steps
from asyncrl.runtime.contract.child_status import STATUS_ENV, read_status
from asyncrl.runtime.contract.gangs import ENV_ADDR, free_local_address
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch._spawn import spawn
from asyncrl.runtime.launch._start_failures import StartFailures
from asyncrl.runtime.launch.last_words import last_words
from asyncrl.runtime.launch.node import make_keys, wait_for_the_run
from asyncrl.runtime.launch.plan import NodePlan
from asyncrl.transport.identity import ensure_run_secret, worker_env

from .ray_plan import RayPlan, RayProcess

__all__ = ["ProcessActor", "forget_failures", "gave_up_reason"]

_CRASH_LOOP_STARTS = 3  # failures to start in a row, the same way: a crash loop
_HEALTHY_AFTER_S = 30.0  # a process that says nothing about its start came up after this
_MAX_DELAY_S = 10.0
_WAIT_S = 300.0  # for the scheduler's actor to set the run up, as asyncrl node waits


def gave_up_reason(run_dir: Path, name: str) -> str | None:
    """Why the actor of ``name`` ended for good, if it gave up; None otherwise."""
    return _read_record(run_dir, name).get("gave_up")


def forget_failures(run_dir: Path, name: str) -> None:
    """A new launch: the failures counted for ``name`` in an earlier one are not its own."""
    _record_path(run_dir, name).unlink(missing_ok=True)


class ProcessActor:
    """Runs ``process`` of ``plan`` until it exits; see the module's docstring."""

    def __init__(self, plan: RayPlan, process: RayProcess) -> None:
        import ray  # in the actor's process, where Ray is

        self._ray = ray
        self._plan, self._process = plan, process
        self._run = RunDir.of(plan.cfg)
        self._log = self._run.logs / f"{process.name}.log"
        self._status = self._run.logs / f"{process.name}.status"
        self._address: str | None = None
        self._run.logs.mkdir(parents=True, exist_ok=True)
        if self._run_is_over():  # started again after the end: nothing is left to do
            self._end("the run is over")
            return
        try:
            argv, env = self._prepare()
        except Exception as error:
            self._give_up(f"could not start: {error}")
            raise
        node = ray.get_runtime_context().get_node_id()[:12]
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or "none"  # Ray's, for num_gpus
        resuming = " (resuming from the journal)" if "--resume" in argv else ""
        self._say(f"starting on node {node} ({ray.util.get_node_ip_address()}), GPUs "
                  f"{gpus}{resuming}")  # fmt: skip
        self._status.unlink(missing_ok=True)  # what it says is about this start only
        self._offset = self._log.stat().st_size if self._log.exists() else 0
        os.chdir(plan.cwd)
        # From the main thread, which lives as long as the actor: PR_SET_PDEATHSIG fires
        # when the thread that started the child ends.
        self._proc = spawn(argv, self._log, {**env, STATUS_ENV: str(self._status)})
        self._started = time.monotonic()
        threading.Thread(target=self._watch, name="process", daemon=True).start()

    def address(self) -> str | None:
        """Where this start of the group meets (rank 0 only)."""
        return self._address

    # --- before the start -------------------------------------------------------------

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment for this start, once the run is ready for it."""
        process, cfg = self._process, self._plan.cfg
        env = dict(process.env)
        if process.scheduler:
            # A scheduler before this one died: workers must not dial the address it
            # announced until this one announces its own.
            self._run.endpoints.unlink(missing_ok=True)
            make_keys(cfg, self._say)
            ensure_run_secret(self._run.secret)
            resume = self._run.journal.is_dir() and process.resume_argv is not None
            return list(process.resume_argv if resume else process.argv), env
        secret = wait_for_the_run(cfg, NodePlan({}, node="ray"), _WAIT_S, self._say)
        env.update(worker_env(secret, process.name, process.role))
        if process.gang is not None and process.gang not in self._plan.split:
            # A split group's rank 0 announces where it listens in the run directory.
            env[ENV_ADDR] = self._gang_address()
        return list(process.argv), env

    def _gang_address(self) -> str:
        """Rank 0 picks a fresh address for every start of its group; the others ask it."""
        if self._process.rank == 0:
            self._address = free_local_address()  # the group is on this one node
            return self._address
        # Asked after the rank that failed had Ray start rank 0 again (it kills the others
        # before its own actor ends): the answer is the new start's. Should an old one
        # answer, this rank fails to meet it and the group starts again.
        # Rank 0 may not exist yet (ValueError), or be between its death and its next
        # start (Ray's RayActorError: "the actor is restarting"): both pass, so ask again.
        not_yet = (ValueError, self._ray.exceptions.RayActorError)
        name, deadline = f"{self._process.gang}-0", time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(*not_yet):
                leader = self._ray.get_actor(name, namespace=self._plan.namespace)
                found = self._ray.get(leader.address.remote())
                if found:
                    return found
            time.sleep(0.2)
        raise RuntimeError(f"rank 0 of {self._process.gang} ({name}) never started")

    # --- while it runs ----------------------------------------------------------------

    def _watch(self) -> None:
        code = self._proc.wait()
        lived_s = time.monotonic() - self._started
        if code == 0:
            self._end("exited 0")
            return
        status = read_status(self._status)
        reason = status.reason or _how_it_ended(code, self._log, self._offset)
        self._say(f"exited after {lived_s:.1f}s: {reason}")
        record = _read_record(self._plan.run_dir, self._process.name)
        failures = StartFailures(_CRASH_LOOP_STARTS, _HEALTHY_AFTER_S, record.get("reason"),
                                 int(record.get("count", 0)))  # fmt: skip
        if failures.record(status, lived_s, reason):
            self._give_up(f"fails on every start ({failures.count} in a row): {reason}")
            self._end_gang()
            self._end("gave up")
            return
        _write_record(self._plan.run_dir, self._process.name,
                      {"reason": failures.reason, "count": failures.count})  # fmt: skip
        self._restart_gang()
        # Failing before it came up: wait before the next start, longer each time in a row.
        time.sleep(min(_MAX_DELAY_S, 0.5 * 2 ** (failures.count - 1)) if failures.count else 0)
        os._exit(1)  # a failure of the actor's process: Ray starts the actor again

    def _restart_gang(self) -> None:
        """The group cannot go on without this rank: Ray starts every rank again."""
        others = self._gang_others()
        if others:
            self._say(f"its group {self._process.gang} starts again, every rank")
        for other in others:
            self._ray.kill(other, no_restart=False)

    def _end_gang(self) -> None:
        for other in self._gang_others():
            self._ray.kill(other, no_restart=True)

    def _gang_others(self) -> list[object]:
        process = self._process
        if process.gang is None:
            return []
        _, ranks = self._plan.gangs[process.gang]
        found = []
        for rank in range(ranks):
            if rank != process.rank:
                with contextlib.suppress(ValueError):  # gone already
                    name = f"{process.gang}-{rank}"
                    found.append(self._ray.get_actor(name, namespace=self._plan.namespace))
        return found

    def _run_is_over(self) -> bool:
        steps = finished_steps(self._run)
        return steps is not None and steps >= self._plan.cfg.run.total_steps

    def _end(self, why: str) -> None:
        """Ends this actor for good: Ray does not start it again."""
        self._say(f"done ({why})")
        me = self._ray.get_runtime_context().current_actor
        self._ray.kill(me, no_restart=True)

    def _give_up(self, reason: str) -> None:
        self._say(reason)
        _write_record(self._plan.run_dir, self._process.name, {"gave_up": reason})

    def _say(self, line: str) -> None:
        text = f"asyncrl ray: {self._process.name}: {line}"
        print(text, flush=True)  # to the launcher's terminal, through Ray's log forwarding
        with self._log.open("a") as log:
            log.write(text + "\n")


def _how_it_ended(code: int, log: Path, offset: int) -> str:
    """Why a process that gave no reason failed: its signal, else its last words."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"ended by {signal.Signals(-code).name}"
        return f"ended by signal {-code}"
    return last_words(log, since=offset) or f"exit code {code}"


def _record_path(run_dir: Path, name: str) -> Path:
    return RunDir(run_dir).logs / f"{name}.ray"


def _read_record(run_dir: Path, name: str) -> dict[str, str]:
    """The failures in a row of ``name``'s process, kept across its actor's restarts."""
    try:
        return json.loads(_record_path(run_dir, name).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _write_record(run_dir: Path, name: str, record: dict[str, object]) -> None:
    path = _record_path(run_dir, name)
    path.write_text(json.dumps(record))
