"""``asyncrl launch --on ray``: a run on a Ray cluster, each of its processes an actor.

The launcher connects to the cluster (``--address``, else ``RAY_ADDRESS``, else the
cluster this machine belongs to), asks Ray for the plan's actors (ray_plan.py) and
follows the run: the step progress, a line for every start of an actor (its node, its
GPUs), and its end. Ray places every actor and brings it back when it dies, on any node
that fits; the scheduler keeps what only it can keep (journal, leases, fences, versions)
in the run directory every node shares, so a process Ray brings back is taken up where
it left off.

Every actor is detached, named in the run's namespace: the run does not depend on this
process. Launched again while it runs, the launcher finds the same actors and follows
them (``get_if_exists``); launched after a stop, the scheduler resumes from its journal.
Ctrl-C stops the run: every actor is killed, workers first.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from asyncrl.runtime.contract.bus import finished_steps
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.progress import ProgressReporter

from .ray_actor import ProcessActor, forget_failures, gave_up_reason
from .ray_plan import RayPlan, RayProcess

__all__ = ["RayLaunchError", "launch_on_ray"]

_POLL_S = 1.0
_DIAL_S = 5.0
_HEAD = "node:__internal_head__"  # a resource only the head node has
_LEAVE_S = 30.0  # for workers to leave by themselves once the scheduler has ended the run
# After a Ctrl-C, for a fresh driver to connect and kill every actor of the run; past
# this the launcher leaves without it.
_STOP_S = 40.0


class RayLaunchError(Exception):
    """What stops the launch before the run starts, in one line."""


def launch_on_ray(plan: RayPlan, address: str | None = None) -> int:
    """Start (or find) the run's actors and follow the run to its end; its exit status.

    Every call of Ray's is made in a child process (:func:`_apart_from_ray`), so a Ctrl-C
    stops the run whatever Ray does with the thread it holds."""
    if not _ray_installed():
        raise RayLaunchError("--on ray needs Ray, not installed here: pip install 'asyncrl[ray]'")
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    return _apart_from_ray(lambda: _launch(plan, where), lambda: _stop_apart(plan, where), _STOP_S)


def _launch(plan: RayPlan, address: str) -> int:
    import ray

    _connect(ray, plan, address)
    try:
        going_on = _alive(ray, plan, "scheduler")
        actors = _start(ray, plan, going_on)
        if going_on:
            _say("the run goes on already: following its actors")
        _say(f"{plan.cfg.run.name}: {len(actors)} actors in namespace {plan.namespace}; "
             f"logs in {RunDir.of(plan.cfg).logs}")  # fmt: skip
        return _follow(ray, plan)
    finally:
        ray.shutdown()


def _stop_apart(plan: RayPlan, address: str) -> int:
    """Ctrl-C's work, by a driver of its own: every actor of the run killed."""
    import ray

    _connect(ray, plan, address)
    try:
        _stop(ray, plan)
    finally:
        ray.shutdown()
    _say("stopped: every actor killed; launch again to resume from the journal")
    return 130


def _ray_installed() -> bool:
    if "ray" in sys.modules:  # None there: an install without it, as a test makes one
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def _apart_from_ray(follow: Callable[[], int], stop: Callable[[], int], seconds: float) -> int:
    """``follow`` run in a child process, and its exit status; on a Ctrl-C, that child
    killed and ``stop`` run in another, and 130.

    Python runs a signal's handler only between bytecodes of the main thread, and a call
    of Ray's has been seen to hold that thread past a minute after a Ctrl-C (a watchdog
    thread in the same process did not run either; a KeyboardInterrupt relayed to it left
    the run's actors alive). This process makes no call of Ray's: it waits, and on a
    Ctrl-C kills the follower, which holds nothing of the run's (its actors are detached),
    and stops the run from a fresh driver, given ``seconds``."""
    interrupted: list[bool] = []

    def note(signum: int, frame: object) -> None:
        interrupted.append(True)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, note) if main else None
    try:
        follower = _fork(follow)
        while not interrupted:
            done, status = os.waitpid(follower, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) % 256
            time.sleep(0.05)
        _end(follower)
        stopper = _fork(stop)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if os.waitpid(stopper, os.WNOHANG)[0]:
                return 130
            time.sleep(0.05)
        _say(f"Ray did not let go within {seconds:g} s: leaving without it")
        _end(stopper)
        return 130
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _fork(work: Callable[[], int]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by the cluster tests
        _child(work)
    return pid


def _end(pid: int) -> None:
    """Kill a child and what it started (its process group, once it has made it)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _child(work: Callable[[], int]) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        code = work()
    except RayLaunchError as error:
        print(f"asyncrl: error: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG): the launcher
    killed leaves no driver of Ray behind (the run's actors are detached and go on)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # died before the request took effect
        os._exit(1)


def _connect(ray: ModuleType, plan: RayPlan, address: str) -> None:
    try:
        _reachable(address)
        ray.init(address=address, namespace=plan.namespace, logging_level="WARNING")
    except ConnectionError as error:
        raise RayLaunchError(
            f"no Ray cluster at {address} ({error}): start one (ray start --head) on the "
            "cluster's head node, or give its address in RAY_ADDRESS"
        ) from None


def _reachable(address: str) -> None:
    """ConnectionError at once if nothing listens at a HOST:PORT given: Ray would retry
    for minutes before it says so."""
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit()) or "://" in address:
        return  # "auto", or a ray:// client address: Ray finds it itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_DIAL_S).close()
    except OSError as error:
        raise ConnectionError(error.strerror or str(error)) from None


def _start(ray: ModuleType, plan: RayPlan, going_on: bool) -> list[Any]:
    """Every actor of the plan, made now or found running (``going_on``: its scheduler's
    actor is alive)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not going_on:
        # A new start: endpoints left by an earlier one name a scheduler nobody serves,
        # and the failures its actors counted are not this start's.
        RunDir.of(plan.cfg).endpoints.unlink(missing_ok=True)
        for process in plan.processes:
            forget_failures(plan.run_dir, process.name)
    actor_class = ray.remote(ProcessActor)
    groups = {gang: _placement_group(ray, plan, gang) for gang in plan.gangs}
    actors = []
    for process in plan.processes:
        options: dict[str, Any] = {}
        if process.scheduler:
            # On the head node: its address stays the one the workers dial (they read the
            # run's endpoints once), and a Ray cluster does not outlive its head anyway.
            options["resources"] = {_HEAD: 0.001}
        if process.gang is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=groups[process.gang],
                placement_group_bundle_index=process.bundle,
            )
        actor = actor_class.options(
            name=process.name,
            namespace=plan.namespace,
            lifetime="detached",  # the run outlives the launcher
            get_if_exists=True,
            num_cpus=0,  # one CPU each (Ray's default) leaves small nodes unable to place them
            num_gpus=process.num_gpus,
            max_restarts=-1,
            **options,
        ).remote(plan, process)
        actors.append(actor)
    return actors


def _placement_group(ray: ModuleType, plan: RayPlan, gang: str) -> Any:
    """The group's placement group (its ranks on one node, or on the nodes the placement
    splits it over), found again if it exists."""
    name = f"{plan.namespace}-{gang}"
    try:
        return ray.util.get_placement_group(name)
    except ValueError:
        pass
    return ray.util.placement_group(plan.bundles(gang), strategy=plan.strategy(gang), name=name,
                                    lifetime="detached")  # fmt: skip


def _follow(ray: ModuleType, plan: RayPlan) -> int:
    """Wait for the scheduler's actor to end; 0 if the run finished, else 1."""
    run, total = RunDir.of(plan.cfg), plan.cfg.run.total_steps
    with ProgressReporter(run.metrics, total):
        while _alive(ray, plan, "scheduler"):
            gave_up = _gave_up(ray, plan, plan.processes)
            if gave_up:
                _stop(ray, plan)
                return 1
            time.sleep(_POLL_S)
    steps = finished_steps(run)
    if steps is None or steps < total:
        _gave_up(ray, plan, plan.processes[:1])
        _say(f"the scheduler ended before the run's end ({steps or 0} of {total} steps)")
        _stop(ray, plan)
        return 1
    # Workers were told the run is over; one started again too late ends by itself.
    deadline = time.monotonic() + _LEAVE_S
    while any(_alive(ray, plan, p.name) for p in plan.processes):
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    _stop(ray, plan)
    _say(f"the run is finished ({steps} steps) in {run.root}")
    return 0


def _gave_up(ray: ModuleType, plan: RayPlan, processes: Sequence[RayProcess]) -> bool:
    """Says so of every actor of ``processes`` that ended for good, failing; any?"""
    found = False
    for process in processes:
        reason = gave_up_reason(plan.run_dir, process.name)
        if reason is not None and not _alive(ray, plan, process.name):
            log = RunDir.of(plan.cfg).logs / f"{process.name}.log"
            _say(f"{process.name} {reason}; its log: {log}")
            found = True
    return found


def _stop(ray: ModuleType, plan: RayPlan) -> None:
    """Kill every actor of the run for good (workers first), and free its GPUs."""
    for process in sorted(plan.processes, key=lambda p: p.scheduler):
        try:
            actor = ray.get_actor(process.name, namespace=plan.namespace)
        except ValueError:
            continue  # ended already
        ray.kill(actor, no_restart=True)
    for gang in plan.gangs:
        try:
            ray.util.remove_placement_group(
                ray.util.get_placement_group(f"{plan.namespace}-{gang}")
            )
        except ValueError:
            continue


def _alive(ray: ModuleType, plan: RayPlan, name: str) -> bool:
    """Whether the actor is alive or being started again (a dead one's name is free)."""
    try:
        ray.get_actor(name, namespace=plan.namespace)
    except ValueError:
        return False
    return True


def _say(line: str) -> None:
    print(f"asyncrl launch: {line}", file=sys.stderr, flush=True)
