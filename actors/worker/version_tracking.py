"""The policy versions (or a learned critic's) one worker follows or publishes.

PPO's critic and its values workers (``follows_critic``) do with the critic's versions
what a trainer and a generator do with the policy's, on the critic's own events
(``version.critic_published``, ``version.critic_wanted``) and its part of the status.

A generator (an actor that overrides ``on_version``) loads the newest published version
between leases and reports it with LoadedVersion, which carries the claim the worker would
make next (``claim_room``: an idle follower's load is followed by a claim, and one request
does both; its reply goes to ``claimed``); events may drop, so an idle one also asks
the scheduler's status now and then. A trainer (``publishes_versions``) announces each
version its steps make due, as the step's reply (StepDone) names it; at start or after
registering again it asks the scheduler's status what is due (see
publishing.version_due), since only that says whether weights are still held. The worker does
the talking: this keeps what was heard and loaded and decides what to send, through the
two calls it is given. Loading a version and staging one to publish are the worker's
weights time (bus.TimeBucket.WEIGHTS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.runtime.contract.bus import TimeBucket
from asyncrl.runtime.contract.child_status import STOPS_THE_RUN
from asyncrl.transport import protocol as p

from ..actor import Actor, RunCannotGoOn
from .publishing import publication, published_version, version_due
from .requests import Fatal
from .time_split import TimeSplit

__all__ = ["PolicyRolledBack", "Versions", "describe_reply"]


class PolicyRolledBack(RuntimeError):
    """The version this worker runs on was lost when training (or the critic) rolled back:
    the worker starts afresh (a new process loads a version that exists)."""


class Versions:
    """What one worker heard, loaded and must announce of the policy versions.

    ``call(message, reregister=...)`` sends a request and returns its reply (registering
    again first if the scheduler forgot the worker, unless told not to); ``status()`` is
    the scheduler's status summary, or None.
    """

    def __init__(
        self,
        actor: Actor,
        worker: str,
        call: Callable[..., p.Message],
        status: Callable[[], dict[str, Any] | None],
        clock: Callable[[], float],
        check_every_s: float,
        log: Any,
        time_split: TimeSplit | None = None,
        claim_room: Callable[[], int] = lambda: 0,
        claimed: Callable[[p.Message], None] = lambda _reply: None,
    ) -> None:
        self.actor = actor
        self.worker = worker
        self._call = call
        self._status = status
        self._clock = clock
        self._check_every_s = check_every_s
        self._log = log
        self._time = time_split or TimeSplit()  # never started: measures nothing
        self._claim_room = claim_room  # groups a report may claim now (0: claim nothing)
        self._claimed = claimed  # told the reply of each report that claimed
        self.tracks = type(actor).on_version is not Actor.on_version
        self.loaded: int | None = None
        self._newest = 0  # the newest published version this worker has heard of
        self._checked = clock()
        # A trainer must check that its current version's weights are still announced:
        # the scheduler forgot this worker and it registered again (a lost worker's are
        # dropped), or a receiver found none (the scheduler restarted since).
        self.must_announce = False

    def registered(self, ready: p.Ready, first: bool) -> None:
        """After a Ready: a new registration starts with nothing loaded, so say it again.

        A published version behind the one loaded means training (or the critic) rolled
        back past it: the loaded weights belong to no version any more (PolicyRolledBack).
        """
        critic = self.actor.follows_critic
        published = ready.critic_version if critic else ready.policy_version
        if self.loaded is not None and published < self.loaded:
            which = "the critic" if critic else "training"
            raise PolicyRolledBack(
                f"{which} rolled back to version {published}; this worker ran on "
                f"version {self.loaded}, which no longer exists: starting afresh"
            )
        self._newest = max(self._newest, published)
        if not first and self.loaded is not None:
            self.report_loaded()

    def heard_of(self, version: object) -> None:
        if isinstance(version, int):
            self._newest = max(self._newest, version)
            self._checked = self._clock()

    def check_if_due(self) -> None:
        """For an idle generator: ask for the newest version if no event said it lately.
        For an idle trainer: announce its version again if the scheduler holds none (see
        :meth:`wanted`; the event may have dropped)."""
        if self._clock() - self._checked < self._check_every_s:
            return
        if self.actor.publishes_versions:
            self._checked = self._clock()
            self.publish_trained()
            return
        if not self.tracks:
            return
        summary = self._status()
        if summary is not None:
            self.heard_of(published_version(summary, self.actor.follows_critic))
        self._checked = self._clock()
        self.load_newest()

    @property
    def behind(self) -> bool:
        """A newer version than the one loaded was heard of: a fetch may be under way."""
        return self.tracks and (self.loaded is None or self._newest > self.loaded)

    def load_newest(self) -> bool:
        """Load the newest version heard of if it is ready, and report it claiming what the
        worker has room for. True if one was loaded now and the worker should claim: the
        report carried no claim, or got a lease (there may be room for more); False too
        when its claim found nothing (the worker is queued to be woken, as after NoWork)."""
        if not self.behind:
            return False
        try:
            with self._time.spent_on(TimeBucket.WEIGHTS):
                loaded = self.actor.on_version(self._newest)
        except RunCannotGoOn as error:
            self._log.error("the run cannot go on", reason=str(error))
            raise Fatal(str(error), STOPS_THE_RUN) from error
        except Exception:
            self._log.exception("version not loaded", version=self._newest)
            return False
        if loaded is None or loaded == self.loaded:
            return False
        self.loaded = loaded
        which = "critic" if self.actor.follows_critic else "policy"  # logs are read by this
        self._log.info(f"loaded a {which} version", version=loaded)
        room = self._claim_room()
        reply = self.report_loaded(room)
        if not room:
            return True
        self._claimed(reply)
        return not isinstance(reply, p.Ack)

    def report_loaded(self, claim: int = 0) -> p.Message:
        """Tell the scheduler the version loaded, asking for up to ``claim`` groups with it;
        its reply (a Lease when the claim got work)."""
        assert self.loaded is not None
        message = p.LoadedVersion(self.worker, self.loaded, claim)
        reply = self._call(message, reregister=False)
        if not isinstance(reply, p.Ack | p.Lease):
            self._log.warning("loaded version not taken", reply=describe_reply(reply))
        return reply

    def wanted(self) -> None:
        """A receiver asked for weights the scheduler holds no announcement of (it was
        restarted since this trainer announced): announce again at the next turn."""
        if self.actor.publishes_versions:
            self.must_announce = True

    def announce_again_if_forgotten(self) -> None:
        """After registering again, a trainer publishes its version again if it must.

        The scheduler drops a lost worker's weight announcement (its address may be dead);
        without this, a trainer declared lost while alive would wait for work that needs
        generators to load weights nobody announces any more.
        """
        if self.must_announce:
            self.must_announce = False
            if self.actor.publishes_versions:
                self.publish_trained()

    def publish_trained(self) -> None:
        """Announce the version the scheduler's status says is due (see version_due).

        For a trainer that starts or registers again, and so does not know whether the
        scheduler still holds weights for the current version; after a step, the step's
        reply says what is due (:meth:`publish`).
        """
        summary = self._status()
        steps = None if summary is None else version_due(summary, self.actor.follows_critic)
        if steps is not None:
            self.publish(steps)

    def publish(self, steps: int) -> None:
        """Make version ``steps`` available (``on_publish``) and announce it."""
        try:
            with self._time.spent_on(TimeBucket.WEIGHTS):
                announcement = self.actor.on_publish(steps)
            message = publication(self.worker, steps, announcement)
        except Exception:
            self._log.exception("version not published", version=steps)
            return
        reply = self._call(message)
        if isinstance(reply, p.Ack):
            weights = message.weights is not None
            critic = self.actor.follows_critic
            self._log.info("published a version", version=steps, weights=weights, critic=critic)
        else:  # another trainer published first, or a step landed meanwhile: the next one will
            self._log.info("version not published", version=steps, reply=describe_reply(reply))


def describe_reply(reply: p.Message) -> str:
    if isinstance(reply, p.Error):
        return f"{reply.code}: {reply.detail}"
    return type(reply).__name__
