"""A plain model of the default pipeline, written without the core's table or indexes.

It knows the pipeline by heart (below) rather than reading ``DEFAULT_PIPELINE``: if a wrong
row were planted in the core's table, the model would still say what should happen, and
the state-machine test would see the two disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GENERATE, LOGP, REF_LOGP, REWARD, TRAIN = "generate", "logp", "ref_logp", "reward", "train"
VALUES, CRITIC = "values", "critic"
# "superseded": trained by a step that training rolled back; trained again as a new group;
# "filtered": its rewards carried no signal (dynamic sampling), never trained
FINAL = frozenset({"trained", "dead", "superseded", "filtered"})


@dataclass(frozen=True)
class Table:
    """One pipeline, by heart: its rows, its moves, and who reads what."""

    rows: dict[str, tuple[str, str | None, str]]  # role -> (source, working or None, target)
    branches: frozenset[str]
    # every move a group may make: forward, back after a lost lease, and into dead
    edges: frozenset[tuple[str, str]]
    # role -> the roles downstream of it: a lost payload of its takes their work down too
    readers: dict[str, frozenset[str]]
    reads: dict[str, frozenset[str]]  # role -> the roles whose payloads its lease carries
    after_logp: frozenset[str]  # where a group is once logp is done with it (joined)


_SCORERS = frozenset({LOGP, REF_LOGP, REWARD})
DEFAULT_TABLE = Table(
    rows={
        GENERATE: ("pending", "generating", "generated"),
        LOGP: ("generated", None, "ready"),
        REF_LOGP: ("generated", None, "ready"),
        REWARD: ("generated", None, "ready"),
        TRAIN: ("ready", "training", "trained"),
    },
    branches=_SCORERS,
    edges=frozenset(
        {
            ("pending", "generating"),
            ("generating", "generated"),
            ("generating", "pending"),
            ("generated", "ready"),
            ("ready", "training"),
            ("training", "trained"),
            ("training", "ready"),
            # a payload lost with its holder: back to the stage that made it
            ("generated", "pending"),
            ("ready", "pending"),
            ("training", "pending"),
            ("ready", "generated"),
            ("training", "generated"),
            ("generated", "filtered"),  # the reward said it carries no signal
        }
        | {(s, "dead") for s in ("pending", "generating", "generated", "ready", "training")}
    ),
    readers={
        GENERATE: frozenset({LOGP, REF_LOGP, REWARD, TRAIN}),
        LOGP: frozenset({TRAIN}),
        REF_LOGP: frozenset({TRAIN}),
        REWARD: frozenset({TRAIN}),
    },
    reads={
        LOGP: frozenset({GENERATE}),
        REF_LOGP: frozenset({GENERATE}),
        REWARD: frozenset({GENERATE}),
        TRAIN: frozenset({GENERATE, LOGP, REF_LOGP, REWARD}),
    },
    after_logp=frozenset({"ready", "training"}),
)

# PPO's: a values branch beside the scorers, the critic's step between ready and train.
_CRITIC_ALIVE = (
    "pending", "generating", "generated", "ready", "critic_training", "critic_trained", "training"
)  # fmt: skip
CRITIC_TABLE = Table(
    rows={
        GENERATE: ("pending", "generating", "generated"),
        LOGP: ("generated", None, "ready"),
        REF_LOGP: ("generated", None, "ready"),
        REWARD: ("generated", None, "ready"),
        VALUES: ("generated", None, "ready"),
        CRITIC: ("ready", "critic_training", "critic_trained"),
        TRAIN: ("critic_trained", "training", "trained"),
    },
    branches=_SCORERS | {VALUES},
    edges=frozenset(
        {
            ("pending", "generating"),
            ("generating", "generated"),
            ("generating", "pending"),
            ("generated", "ready"),
            ("ready", "critic_training"),
            ("critic_training", "critic_trained"),
            ("critic_training", "ready"),
            ("critic_trained", "training"),
            ("training", "trained"),
            ("training", "critic_trained"),
            ("generated", "filtered"),  # the reward said it carries no signal
        }
        # a payload lost with its holder: back to the stage that made it
        | {(s, "pending") for s in _CRITIC_ALIVE[2:]}
        | {(s, "generated") for s in _CRITIC_ALIVE[3:]}
        | {(s, "ready") for s in ("critic_trained", "training")}
        | {(s, "dead") for s in _CRITIC_ALIVE}
    ),
    readers={
        GENERATE: frozenset({LOGP, REF_LOGP, REWARD, VALUES, CRITIC, TRAIN}),
        **{scorer: frozenset({CRITIC, TRAIN}) for scorer in (LOGP, REF_LOGP, REWARD, VALUES)},
        CRITIC: frozenset({TRAIN}),
    },
    reads={
        LOGP: frozenset({GENERATE}),
        REF_LOGP: frozenset({GENERATE}),
        REWARD: frozenset({GENERATE}),
        VALUES: frozenset({GENERATE}),
        CRITIC: frozenset({GENERATE, REWARD, VALUES}),
        TRAIN: frozenset({GENERATE, LOGP, REF_LOGP, REWARD, VALUES}),
    },
    after_logp=frozenset({"ready", "critic_training", "critic_trained", "training"}),
)

# PPO's with the values made by the critic's step in its update's forward pass: no values
# branch; the train step reads the critic's payload for its advantages.
CRITIC_MAKES_VALUES_TABLE = Table(
    rows={role: row for role, row in CRITIC_TABLE.rows.items() if role != VALUES},
    branches=_SCORERS,
    edges=CRITIC_TABLE.edges,
    readers={
        GENERATE: frozenset({LOGP, REF_LOGP, REWARD, CRITIC, TRAIN}),
        **{scorer: frozenset({CRITIC, TRAIN}) for scorer in _SCORERS},
        CRITIC: frozenset({TRAIN}),
    },
    reads={
        LOGP: frozenset({GENERATE}),
        REF_LOGP: frozenset({GENERATE}),
        REWARD: frozenset({GENERATE}),
        CRITIC: frozenset({GENERATE, REWARD}),
        TRAIN: frozenset({GENERATE, LOGP, REF_LOGP, REWARD, CRITIC}),
    },
    after_logp=CRITIC_TABLE.after_logp,
)


@dataclass
class ModelLease:
    lid: int
    fence: int
    role: str
    worker: str
    expires_at: float
    gids: set[int]
    version: int | None
    dropped: set[int] = field(default_factory=set)  # filtered by a sibling while held


@dataclass
class ModelGroup:
    state: str = "pending"
    done: set[str] = field(default_factory=set)
    leased: set[str] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)
    suspects: set[str] = field(default_factory=set)  # roles whose worker died holding it
    behaviour: tuple[int, int] | None = None
    admitted: int | None = None  # the version its generator had loaded when it started
    step: int | None = None
    critic_version: int | None = None  # the critic version its values were made with
    critic_step: int | None = None  # the critic's step that trained on it


@dataclass
class PipelineModel:
    max_staleness: int
    batch: int
    max_attempts: int
    lease_timeout: float
    worker_timeout: float
    groups: dict[int, ModelGroup] = field(default_factory=dict)
    leases: dict[int, ModelLease] = field(default_factory=dict)
    ended: list[tuple[int, int]] = field(default_factory=list)  # (lid, fence) of past leases
    workers: dict[str, str] = field(default_factory=dict)  # worker -> role
    loaded: dict[str, int | None] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    steps_done: int = 0
    policy_version: int = 0
    batches: list[list[int]] = field(default_factory=list)  # the groups of steps 1, 2, ...
    durable_step: int = 0
    table: Table = DEFAULT_TABLE
    critic_steps_done: int = 0
    critic_version: int = 0
    critic_batches: list[list[int]] = field(default_factory=list)
    filtered_in_a_row: int = 0  # filtered since the last group judged to carry signal

    # --- questions -------------------------------------------------------------------

    def takeable(self, role: str) -> list[int]:
        source = self.table.rows[role][0]
        return sorted(
            gid
            for gid, g in self.groups.items()
            if g.state == source and role not in g.done and role not in g.leased
        )

    def takeable_for(self, role: str, worker: str, n: int) -> list[int]:
        """What a claim of ``n`` by ``worker`` gets: the oldest takeable groups, with at
        most one suspect in the worker's hands (a step takes its batch whole)."""
        if role in (TRAIN, CRITIC):
            return self.takeable(role)[:n]
        holds = any(
            role in self.groups[gid].suspects
            for lease in self.leases.values()
            if lease.worker == worker
            for gid in lease.gids
        )
        taken = []
        for gid in self.takeable(role):
            if len(taken) == n:
                break
            if role in self.groups[gid].suspects:
                if holds:
                    continue
                holds = True
            taken.append(gid)
        return taken

    def suspects_held(self, worker: str, role: str) -> int:
        return sum(
            role in self.groups[gid].suspects
            for lease in self.leases.values()
            if lease.worker == worker
            for gid in lease.gids
        )

    def alive_untrained(self) -> list[int]:
        return sorted(gid for gid, g in self.groups.items() if g.state not in FINAL)

    def overdue(self) -> list[int]:
        """Started groups that can no longer be trained within the staleness bound."""
        return [
            gid
            for gid, g in self.groups.items()
            if g.state not in FINAL
            and g.admitted is not None
            and self.steps_done >= g.admitted + self.max_staleness + 1
        ]

    def train_leased(self) -> bool:
        return self.leased(TRAIN)

    def leased(self, role: str) -> bool:
        return any(lease.role == role for lease in self.leases.values())

    def oldest_critic_allowed(self) -> int:
        return self.critic_steps_done - self.max_staleness

    # --- what happens ----------------------------------------------------------------

    def add(self, first_gid: int, count: int) -> None:
        for gid in range(first_gid, first_gid + count):
            self.groups[gid] = ModelGroup()

    def lease(self, lease: ModelLease) -> None:
        source, working, _ = self.table.rows[lease.role]
        for gid in lease.gids:
            group = self.groups[gid]
            assert group.state == source, f"{lease.role} leased group {gid} in {group.state}"
            assert lease.role not in group.done | group.leased, f"group {gid} taken twice"
            group.leased.add(lease.role)
            if lease.role == GENERATE:
                group.admitted = lease.version
            if working:
                group.state = working
        self.leases[lease.lid] = lease

    def complete(
        self,
        lid: int,
        gids: list[int],
        behaviour: list[tuple[int, int]] | None,
        filtered: frozenset[int] = frozenset(),
    ) -> None:
        """``filtered``: groups of a reward lease whose rewards carry no signal."""
        lease = self.leases[lid]
        gids = [gid for gid in gids if gid not in lease.dropped]  # ignored: filtered away
        if lease.role == TRAIN:
            self.steps_done += 1
            self.batches.append(sorted(gids))
        if lease.role == CRITIC:
            self.critic_steps_done += 1
            self.critic_batches.append(sorted(gids))
        for i, gid in enumerate(gids):
            group = self.groups[gid]
            group.leased.discard(lease.role)
            group.suspects.discard(lease.role)
            if behaviour is not None:
                group.behaviour = behaviour[i]
            if lease.role == VALUES:
                group.critic_version = lease.version
            if gid in filtered:
                assert lease.role == REWARD, f"a {lease.role} result filtered group {gid}"
                self._filter(gid, lid)
                continue
            if lease.role == REWARD:  # judged to carry signal
                self.filtered_in_a_row = 0
            self._advance(gid, group, lease.role)
        self._drop(lease, gids)

    def _filter(self, gid: int, judged_by: int) -> None:
        """Out of the pipeline, never trained: its other leases let go of it (the lease
        whose result filtered it has completed it: a second result for it there is a
        result for a group not in the lease, not a late one)."""
        group = self.groups[gid]
        assert group.state == "generated", f"group {gid} filtered in {group.state}"
        group.state, group.done, group.leased = "filtered", set(), set()
        self.filtered_in_a_row += 1
        for other in list(self.leases.values()):
            if gid in other.gids and other.lid != judged_by:
                other.dropped.add(gid)
                self._drop(other, [gid])

    def _advance(self, gid: int, group: ModelGroup, role: str) -> None:
        if role in self.table.branches:
            group.done.add(role)
            if group.done == self.table.branches:
                group.done.clear()
                group.state = "ready"
            return
        group.state = self.table.rows[role][2]
        if role == CRITIC:  # again after a roll back made its proximal log-probs again
            group.critic_step = self.critic_steps_done
        if role == TRAIN:
            assert group.step is None, f"group {gid} trained twice"
            group.step = self.steps_done

    def fail(self, lid: int, gids: list[int], suspect: bool = False) -> None:
        """The groups are blamed for a try: back to the lease's source, or dead."""
        lease = self.leases[lid]
        source = self.table.rows[lease.role][0]
        for gid in gids:
            group = self.groups[gid]
            group.leased.discard(lease.role)
            tries = group.attempts.get(lease.role, 0) + 1
            group.attempts[lease.role] = tries
            if tries >= self.max_attempts:
                self._kill(gid)
            else:
                group.state = source
                group.admitted = None if source == "pending" else group.admitted
                if suspect:
                    group.suspects.add(lease.role)
        self._drop(lease, gids)

    def died(self, worker: str) -> None:
        """The worker died holding what it held: a lone group, or the suspects among
        several, are blamed; the rest become suspects, unblamed."""
        leases = sorted((x for x in self.leases.values() if x.worker == worker), key=_lid)
        held = [(x, gid) for x in leases for gid in sorted(x.gids)]
        blamed = {gid for x, gid in held if x.role in self.groups[gid].suspects}
        if not blamed and len(held) == 1:
            blamed = {held[0][1]}
        for lease in leases:
            spared = [gid for gid in sorted(lease.gids) if gid not in blamed]
            for gid in spared:
                self.groups[gid].suspects.add(lease.role)
            self._give_back(lease, spared)
            if lease.lid in self.leases:
                self.fail(lease.lid, sorted(lease.gids), suspect=True)

    def payload_lost(self, lid: int, gid: int, role: str, counted: bool = True) -> None:
        """A reader of ``lid`` found ``role``'s payload of ``gid`` gone; the lease's other
        groups go back uncounted, and so does ``gid`` when its holder died."""
        lease = self.leases[lid]
        group = self.groups[gid]
        tries = group.attempts.get(role, 0) + counted
        if counted:
            group.attempts[role] = tries
        if counted and tries >= self.max_attempts:
            self._kill(gid)
        else:
            for other in list(self.leases.values()):
                if gid in other.gids and other.role in self.table.readers[role]:
                    group.leased.discard(other.role)
                    self._drop(other, [gid])
            if role in (GENERATE, VALUES):
                group.critic_version = None
            if role == GENERATE:
                group.state, group.done, group.admitted = "pending", set(), None
            elif role == CRITIC:  # the values its step made: the critic's step again
                group.state, group.done = "ready", set()
            elif group.state == "generated":
                group.done.discard(role)
            else:
                group.state, group.done = "generated", set(self.table.branches - {role})
        rest = sorted(lease.gids)
        source = self.table.rows[lease.role][0]
        for other_gid in rest:
            other = self.groups[other_gid]
            other.leased.discard(lease.role)
            other.state = source
            other.admitted = None if source == "pending" else other.admitted
        self._drop(lease, rest)

    def _kill(self, gid: int) -> None:
        group = self.groups[gid]
        group.state, group.done, group.leased = "dead", set(), set()
        for lease in list(self.leases.values()):
            if gid in lease.gids:
                self._drop(lease, [gid])

    def _drop(self, lease: ModelLease, gids: list[int]) -> None:
        lease.gids.difference_update(gids)
        if not lease.gids and lease.lid in self.leases:
            del self.leases[lease.lid]
            self.ended.append((lease.lid, lease.fence))

    def roll_back(self, step: int) -> int:
        """Training returns to ``step`` (RolledBack's rule, core/transitions.py); the first new gid
        is next, one per group the lost steps trained. Returns how many were added."""
        # a values worker follows the critic's versions, which stay
        lost = sorted(
            w for w, v in self.loaded.items() if (v or 0) > step and self.workers[w] != VALUES
        )
        for lease in sorted(self.leases.values(), key=lambda x: x.lid):
            if lease.lid in self.leases and (lease.worker in lost or lease.role in (TRAIN, CRITIC)):
                self._give_back(lease)
        for worker in lost:
            del self.workers[worker]
            self.loaded.pop(worker, None)
            self.last_seen.pop(worker, None)
        for group in self.groups.values():
            if group.state in FINAL or group.behaviour is None:
                continue
            if group.behaviour[1] > step:
                self._drop_readers(group, self.table.readers[GENERATE] | {GENERATE})
                group.state, group.done, group.admitted, group.behaviour = (
                    "pending",
                    set(),
                    None,
                    None,
                )
                group.critic_version = None
            elif LOGP in group.done or group.state in self.table.after_logp:
                self._drop_readers(group, self.table.readers[LOGP] | {LOGP})
                if group.state == "generated":
                    group.done.discard(LOGP)
                else:
                    group.state, group.done = "generated", set(self.table.branches - {LOGP})
        lost_batches, self.batches = self.batches[step:], self.batches[:step]
        again = [gid for batch in lost_batches for gid in batch]
        for gid in again:
            self.groups[gid].state = "superseded"
        self.add(len(self.groups), len(again))
        self.steps_done = step
        self.policy_version = min(self.policy_version, step)
        return len(again)

    def roll_back_critic(self, step: int) -> int:
        """The critic returns to ``step`` (core/transitions.py, _critic_rolled_back): values
        workers on a lost version leave, a critic step in flight goes back, and values of a lost
        version not yet used by the critic are made again. Returns how many were."""
        lost = sorted(
            w for w, v in self.loaded.items() if self.workers[w] == VALUES and (v or 0) > step
        )
        for lease in sorted(self.leases.values(), key=lambda x: x.lid):
            if lease.lid in self.leases and (lease.worker in lost or lease.role == CRITIC):
                self._give_back(lease)
        for worker in lost:
            del self.workers[worker]
            self.loaded.pop(worker, None)
            self.last_seen.pop(worker, None)
        redone = 0
        for group in self.groups.values():
            if group.critic_version is None or group.critic_version <= step:
                continue
            if group.state == "ready":
                group.state, group.done = "generated", set(self.table.branches - {VALUES})
            elif group.state == "generated":
                group.done.discard(VALUES)
            else:
                continue  # the critic trained it: it keeps its values
            group.critic_version = None
            redone += 1
        self.critic_steps_done = step
        self.critic_batches = self.critic_batches[:step]
        self.critic_version = min(self.critic_version, step)
        return redone

    def _give_back(self, lease: ModelLease, gids: list[int] | None = None) -> None:
        """Uncounted: the groups (all the lease's by default) go back to its source."""
        source = self.table.rows[lease.role][0]
        gids = sorted(lease.gids) if gids is None else gids
        for gid in gids:
            group = self.groups[gid]
            group.leased.discard(lease.role)
            group.state = source
            group.admitted = None if source == "pending" else group.admitted
        self._drop(lease, gids)

    def _drop_readers(self, group: ModelGroup, roles: frozenset[str]) -> None:
        gid = next(g for g, x in self.groups.items() if x is group)
        for lease in list(self.leases.values()):
            if gid in lease.gids and lease.role in roles:
                group.leased.discard(lease.role)
                self._drop(lease, [gid])

    def redo_stale_values(self) -> None:
        """A critic claim: values made with a critic older than the bound allows are made
        again (the group waits for its values branch alone)."""
        oldest = self.oldest_critic_allowed()
        for group in self.groups.values():
            version = group.critic_version
            if group.state == "ready" and version is not None and version < oldest:
                group.state, group.done = "generated", set(self.table.branches - {VALUES})
                group.critic_version = None

    def lose(self, worker: str, died: bool = True) -> None:
        """The worker is gone: died (timed out, killed) or left on purpose (nobody blamed)."""
        if died:
            self.died(worker)
        for lease in [x for x in self.leases.values() if x.worker == worker]:
            self._give_back(lease)
        del self.workers[worker]
        self.loaded.pop(worker, None)
        self.last_seen.pop(worker, None)

    def tick(self, now: float) -> None:
        for lease in sorted(self.leases.values(), key=lambda x: (x.expires_at, x.lid)):
            if lease.expires_at <= now and lease.lid in self.leases:
                if self.last_seen[lease.worker] + self.lease_timeout <= now:
                    self.died(lease.worker)  # silent as long as a lease lasts
                else:  # alive, and never said it held the lease: its grant was lost
                    self._give_back(lease)
        for worker, seen in list(self.last_seen.items()):
            if seen + self.worker_timeout <= now:
                self.lose(worker)

    def heartbeat(self, worker: str, now: float) -> None:
        self.last_seen[worker] = now
        for lease in self.leases.values():
            if lease.worker == worker:
                lease.expires_at = now + self.lease_timeout


def _lid(lease: ModelLease) -> int:
    return lease.lid
