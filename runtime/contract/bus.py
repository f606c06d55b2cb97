"""What the scheduler and its workers agree on about the bus, beyond the messages.

- where the scheduler listens: it announces its endpoints in the run directory while it
  runs (:func:`announce_endpoints`), as other machines dial them (:func:`dialable`), and
  workers and tools read them there (:func:`read_endpoints`); the events port is the
  control port + 1 by convention; a local run's scheduler serves private ipc:// sockets,
  never its configured ports (:func:`serves_ipc`);
- that the run is finished: the scheduler says so in the run directory as it exits
  (:func:`announce_finished`), for the machines whose workers it no longer reaches
  (:func:`finished_steps`);
- which moves may mean work for which role (:func:`wakeup_topics`), derived from the
  pipeline table: the scheduler wakes its waiting workers by them (service/waiting.py);
- the key under which a completion reports where its worker's time went
  (:data:`ACTIVITY_KEY`), and the buckets it is split into (:class:`TimeBucket`).

Which role adds groups is the pipeline's ``entry_role``; both sides read it there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import IntEnum

from asyncrl.runtime.contract.config.schema import SchedulerSection
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile, read_owned, write_private
from asyncrl.runtime.contract.stages import Gate, GroupState, Pipeline
from asyncrl.transport.host import WILDCARD_HOSTS, machine_address
from asyncrl.transport.security import CurveMode, curve_required, is_loopback
from asyncrl.transport.topics import Topic, topic

__all__ = [
    "ACTIVITY_KEY",
    "Endpoints",
    "TimeBucket",
    "announce_endpoints",
    "announce_finished",
    "dialable",
    "finished_steps",
    "finished_topics",
    "next_port",
    "read_endpoints",
    "serves_ipc",
    "wakeup_topics",
]

_BUS_SCHEMES = ("tcp://", "ipc://")
ACTIVITY_KEY = "activity"  # in Complete.metrics: {"tokens": int, "us": [int per TimeBucket]}


class TimeBucket(IntEnum):
    """Where a worker's wall time goes, in disjoint buckets that add up to all of it.

    A completion's activity carries the microseconds spent in each since the worker's
    previous completion, as a list in this order (the value is the index); metrics lines
    name them in lower case. The worker's side is actors/worker/time_split.py.
    """

    COMPUTE = 0  # the role's own work: advance/process, feed, admitting a lease
    WAITING_FOR_WORK = 1  # claims that found nothing, waiting for a wake-up event
    SCHEDULER = 2  # every other request/reply round trip to the scheduler
    PAYLOADS = 3  # fetching what a lease references, keeping what a result makes
    WEIGHTS = 4  # loading a new version (followers), staging one to publish (the trainer)
    OTHER = 5  # the loop's own bookkeeping between the above

    @property
    def key(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a scheduler listens, and whether its bus is encrypted (CURVE)."""

    control: str
    events: str
    curve: bool
    pid: int | None = None  # the scheduler's process, when it announced itself


def announce_endpoints(run: RunDir, where: Endpoints) -> None:
    """Write ``where`` to the run directory whole (by rename): a reader never sees half."""
    write_private(run.endpoints, json.dumps(asdict(where)))


def dialable(endpoint: str) -> str:
    """``endpoint`` as another machine dials it: the wildcard host a socket bound to every
    interface reports (``tcp://0.0.0.0:5555``) becomes this machine's address."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    if host not in WILDCARD_HOSTS or not port.isdigit():
        return endpoint
    address = machine_address(ipv6_first=host == "::")
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


def announce_finished(run: RunDir, steps: int) -> None:
    """Say in the run directory that the run finished after ``steps`` steps."""
    write_private(run.finished, json.dumps({"steps": steps}))


def finished_steps(run: RunDir) -> int | None:
    """The steps of the run as it last finished; None if it never did (or the file is
    not this user's own). A run resumed with more ``run.total_steps`` is not finished
    until that many: compare."""
    try:
        return int(json.loads(read_owned(run.finished))["steps"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):  # UntrustedFile: a ValueError
        return None


def serves_ipc(sched: SchedulerSection) -> bool:
    """Whether ``asyncrl run`` starts this scheduler on ipc:// sockets only: every process
    is on its loopback host, so no TCP port is opened for others. Its workers must wait
    for its announcement: the configured ports are never bound."""
    return sched.local_ipc and is_loopback(sched.host)


def read_endpoints(run: RunDir, curve: CurveMode = "auto") -> Endpoints | None:
    """The running scheduler's endpoints, or None if it is not running (no file).

    Trusted only as the run's own (:func:`read_owned`) and whole; UntrustedFile (a
    ValueError naming the file and the fault) otherwise. Its ``curve`` may turn encryption
    on, never off where ``curve_required`` says it is on (``curve`` is scheduler.curve)."""
    try:
        found = json.loads(read_owned(run.endpoints))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UntrustedFile(f"{run.endpoints} is not JSON ({error}); remove it") from None
    try:
        control, events, announced = found["control"], found["events"], found["curve"]
        pid = found.get("pid")
    except (KeyError, TypeError, AttributeError):
        raise UntrustedFile(
            f"{run.endpoints} does not name control, events and curve; remove it"
        ) from None
    for name, value in (("control", control), ("events", events)):
        if not isinstance(value, str) or not value.startswith(_BUS_SCHEMES):
            raise UntrustedFile(f"{run.endpoints}: {name} {value!r} is not a bus endpoint")
    if not isinstance(announced, bool) or not (pid is None or type(pid) is int):
        raise UntrustedFile(f"{run.endpoints}: curve must be true or false, pid a number")
    return Endpoints(control, events, announced or curve_required(control, curve), pid)


def next_port(control_endpoint: str) -> str:
    """The events endpoint by convention: the control endpoint's port + 1."""
    base, _, port = control_endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"{control_endpoint!r} is not tcp://HOST:PORT")
    return f"{base}:{int(port) + 1}"


def wakeup_topics(role: str, pipeline: Pipeline) -> list[str]:
    """Topic prefixes after which ``role`` may find new work. The run's end is in all."""
    edges = list(pipeline.edges())
    topics = {topic(Topic.RUN)}
    trained = [topic(Topic.TRANSITION, a, b) for a, b in edges if b is GroupState.TRAINED]
    died = [topic(Topic.TRANSITION, a, b) for a, b in edges if b is GroupState.DEAD]
    if role == pipeline.entry_role:
        # Room for new groups opens as they are taken, trained, or die.
        entry = pipeline.entry
        topics.update(topic(Topic.TRANSITION, a, b) for a, b in edges if a == entry)
        topics.update(trained + died)
        return sorted(topics)
    for stage in pipeline.for_role(role):
        topics.update(topic(Topic.TRANSITION, a, b) for a, b in edges if b == stage.source)
        if stage.source == pipeline.entry:
            topics.add(topic(Topic.GROUPS, "added"))
        if stage.gate is Gate.ADMIT:
            # Admission widens when a step finishes or a new version can be loaded.
            topics.update(trained)
            topics.add(topic(Topic.VERSION, "published"))
        if stage.gate is Gate.STEP:
            # A step may wait for stragglers; their arrival or death unblocks it.
            topics.update(died)
        if stage.gate is Gate.CRITIC_STEP:
            # Fewer than a batch goes to the critic once the train step waits for them.
            topics.update(trained + died)
    return sorted(topics)


def finished_topics(pipeline: Pipeline) -> list[str]:
    """The topics on which groups leave the pipeline (trained, or dead): a holder frees
    their payloads at once instead of waiting to ask (events may drop; asking stays)."""
    done = (GroupState.TRAINED, GroupState.DEAD)
    return sorted({topic(Topic.TRANSITION, a, b) for a, b in pipeline.edges() if b in done})
