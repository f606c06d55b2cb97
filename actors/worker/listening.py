"""What a worker hears on the bus, and its wait for work.

Wake-ups that may mean work (its own ``wake.<worker>/`` topic, the run's), versions
published or wanted (version_tracking.py), groups that left the pipeline (their payloads freed,
data_plane.py). An idle worker waits for the first of them, or its slow poll.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.runtime.contract.bus import TimeBucket, finished_topics
from asyncrl.runtime.contract.stages import Pipeline
from asyncrl.transport.link import SchedulerLink
from asyncrl.transport.topics import Topic, topic, wake_topic

from ..actor import Actor
from .data_plane import WorkerPayloads
from .time_split import TimeSplit
from .version_tracking import Versions

__all__ = [
    "CRITIC_PUBLISHED",
    "CRITIC_WANTED",
    "VERSION_PUBLISHED",
    "VERSION_WANTED",
    "WorkerEvents",
]

VERSION_PUBLISHED = topic(Topic.VERSION, "published")
CRITIC_PUBLISHED = topic(Topic.VERSION, "critic_published")
VERSION_WANTED = topic(Topic.VERSION, "wanted")
CRITIC_WANTED = topic(Topic.VERSION, "critic_wanted")


class WorkerEvents:
    """One worker's events; ``link()`` is its link as it is now (it may be replaced)."""

    def __init__(
        self,
        worker: str,
        pipeline: Pipeline,
        link: Callable[[], SchedulerLink],
        actor: Actor,
        versions: Versions,
        payloads: WorkerPayloads,
        time_split: TimeSplit,
    ) -> None:
        # The scheduler wakes this worker by name when work comes for its role (one
        # wake-up per new piece of work: runtime/scheduler/service/waiting.py), and every worker
        # when the run drains or ends.
        self._wakeups = (topic(Topic.RUN), wake_topic(worker))
        self._finished = frozenset(finished_topics(pipeline))  # groups leaving the pipeline
        self._link = link
        self._actor = actor
        self._versions = versions
        self._payloads = payloads
        self._time = time_split

    def subscribe(self) -> None:
        self._link().subscribe([*self._wakeups, *self._finished])

    def idle(self, poll_s: float, fetch_poll_s: float) -> bool:
        """Nothing to do now: wait for a wake-up (or the slow poll). True if woken."""
        # A version being fetched in the background says nothing when it is ready: look
        # again soon, or an idle generator would start on it only at the next event.
        wait_s = fetch_poll_s if self._versions.behind else poll_s
        soon = self._actor.wake_within_s()
        wait_s = wait_s if soon is None else min(wait_s, soon)
        with self._time.spent_on(TimeBucket.WAITING_FOR_WORK):
            woken = self.take(wait_s)
            self._versions.check_if_due()
        return woken

    def take(self, timeout_s: float) -> bool:
        """Drain the events that came (waiting up to ``timeout_s`` for the first).

        True if one announced work (anything but a version), or a new version was loaded
        (work the staleness bound held back may be admitted under it).
        """
        woken = False
        link = self._link()
        event = link.next_event(timeout_s)
        while event is not None:
            if event.topic in (VERSION_PUBLISHED, CRITIC_PUBLISHED):  # subscribed to one
                self._versions.heard_of(event.body.get("version"))
            elif event.topic in (VERSION_WANTED, CRITIC_WANTED):  # subscribed to one
                self._versions.wanted()
            elif event.topic.startswith(self._wakeups):
                woken = True
            if event.topic in self._finished:
                with self._time.spent_on(TimeBucket.PAYLOADS):
                    self._payloads.finished(event.body.get("groups", ()))
            event = link.next_event(0)
        return self._versions.load_newest() or woken
