"""Who fetches which weights from whom: a relay tree for the newest announced version.

Pure and deterministic (no sockets, no clock), so the service and the tests drive it alike.
The trainer announces a version with a manifest and its weight-plane address; receivers
ask for it and are told a source. So that the trainer sends each byte about once, the
sources form a tree rooted at the publisher: a new receiver hangs under the shallowest
node (the publisher first, then relays in order of arrival) that serves fewer than
``fanout`` receivers and can relay (it gave an address). ``fanout`` 0: every receiver
pulls from the publisher.

Only the newest version's tree is kept, and nothing here is journaled: after a scheduler
restart receivers are told no announcement is held, and the trainer is asked to announce
its version again (the ``version.wanted`` event, weight_requests.py).

Every follower asks within moments of a publication, so finding the shallowest node with
room must not walk the tree each time (that was O(receivers) per request, quadratic per
version: 51 µs a request at 766 receivers, 131 µs at 2,048). The attached nodes are kept
ranked by (depth, arrival) with a cursor past those that can never take another receiver
until the tree loses a node; a receiver hung under a node is inserted in its place, and
a node detached or removed makes the ranking be rebuilt at the next pick.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from asyncrl.runtime.contract.refusals import Reason

__all__ = ["NO_SOURCE", "NoRoute", "Route", "WeightRoutes"]

NO_SOURCE = "no_source"
"""Error code: the version is held, but every source the asker may use is ruled out."""


@dataclass(frozen=True, slots=True)
class Route:
    """Fetch ``version`` (described by ``manifest``) from ``source`` at ``source_address``."""

    version: int
    manifest: dict[str, Any]
    source: str
    source_address: bytes


class NoRoute(LookupError):
    """No source can be given; ``code`` is the Error code, the message says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(slots=True)
class _Node:
    address: bytes
    arrival: int  # the order receivers joined in: ties between equal depths go to the first
    source: str | None = None  # None: the publisher, or a receiver whose source went away
    downstream: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Version:
    number: int
    manifest: dict[str, Any]
    publisher: str
    nodes: dict[str, _Node]
    failed: set[str] = field(default_factory=set)  # named by a receiver: never a source again
    arrivals: int = 0
    # The attached nodes as (depth, arrival, name), sorted: the order a pick looks in. None
    # when stale (a node detached or removed), rebuilt at the next pick.
    ranked: list[tuple[int, int, str]] | None = None
    depth: dict[str, int] = field(default_factory=dict)  # of the ranked nodes
    # ranked[1:cursor] cannot take a receiver (full, or cannot relay), and only a lost node
    # gives one room again, which makes the ranking stale. ranked[0] is the publisher,
    # which a pick looks at first.
    cursor: int = 1


class WeightRoutes:
    """The newest announcement and its relay tree."""

    def __init__(self, fanout: int) -> None:
        if fanout < 0:
            raise ValueError(f"relay fan-out must be >= 0, got {fanout}")
        self.fanout = fanout
        self._held: _Version | None = None
        self._newest_published = 0  # with or without weights: older announcements lose

    @property
    def newest(self) -> int | None:
        """The version whose announcement is held, if any."""
        return None if self._held is None else self._held.number

    @property
    def publisher(self) -> str | None:
        return None if self._held is None else self._held.publisher

    def announce(
        self, version: int, publisher: str, manifest: dict[str, Any] | None, address: bytes
    ) -> bool:
        """``publisher`` published ``version``; ``manifest`` None: without weights to route.

        Versions only go forward: an older one changes nothing (returns False), and so does
        the newest again without weights. The newest again *with* weights replaces what is
        held (a restarted scheduler forgot them, or a restarted trainer serves them from a
        new address). A newer one replaces the held announcement and its tree, also when it
        carries no manifest: weights of a superseded version are not handed out as newest.
        """
        if version < self._newest_published or (
            version == self._newest_published and manifest is None
        ):
            return False
        self._newest_published = version
        if manifest is None:
            self._held = None
            return True
        root = _Node(address, arrival=-1)
        self._held = _Version(version, manifest, publisher, {publisher: root})
        return True

    def route(self, worker: str, version: int, address: bytes = b"", failed: str = "") -> Route:
        """Where ``worker`` fetches ``version`` (0: the newest held) from.

        Asking again gets the same source. ``failed`` names a source that failed the asker:
        it leaves the tree for this version (the receivers it served are reattached when
        they ask) and the asker gets another source, never itself nor one it serves.
        Raises NoRoute when no announcement for ``version`` is held, or no source is left;
        ValueError for a request that makes no sense (the publisher asking, say).
        """
        held = self._version(version)
        if worker == held.publisher:
            raise ValueError(f"{worker!r} published version {held.number}: it has the weights")
        if failed == worker:
            raise ValueError(f"{worker!r} names itself as the source that failed it")
        node = held.nodes.get(worker)
        if node is None:
            node = held.nodes[worker] = _Node(address, arrival=held.arrivals)
            held.arrivals += 1
        shunned: set[str] = set()
        if failed == held.publisher:
            shunned.add(failed)  # the root stays: the others still pull from it
            if node.source == failed:
                self._detach(held, worker)
        elif failed:
            held.failed.add(failed)
            self._remove(held, failed)
        if node.source is None:
            node.source = self._pick(held, worker, shunned)
            held.nodes[node.source].downstream.append(worker)
            _ranked_attach(held, worker, node)
        source = held.nodes[node.source]
        return Route(held.number, held.manifest, node.source, source.address)

    def forget(self, worker: str) -> None:
        """``worker`` is gone (lost or left): it serves and receives nothing any more.

        The publisher gone takes its announcement with it: the tree has no root.
        """
        held = self._held
        if held is None or worker not in held.nodes:
            return
        if worker == held.publisher:
            self._held = None
        else:
            self._remove(held, worker)

    def forget_after(self, version: int) -> None:
        """Training rolled back to ``version``: later versions are lost, and ``version``
        itself is published again by the trainer that rolled back."""
        if self._held is not None and self._held.number >= version:
            self._held = None
        self._newest_published = min(self._newest_published, version)

    def tree(self) -> dict[str, str | None]:
        """Each receiver's source (None: waiting to be reattached), in order of arrival."""
        held = self._held
        if held is None:
            return {}
        receivers = sorted(
            (n.arrival, name) for name, n in held.nodes.items() if name != held.publisher
        )
        return {name: held.nodes[name].source for _, name in receivers}

    def summary(self) -> dict[str, Any]:
        """For the status reply: no manifest or addresses, which can be large."""
        return {
            "version": self.newest,
            "publisher": self.publisher,
            "relay_fanout": self.fanout,
            "tree": self.tree(),
        }

    # --- the tree --------------------------------------------------------------------

    def _version(self, version: int) -> _Version:
        held = self._held
        if held is not None and version in (0, held.number):
            return held
        newest = "none is held" if held is None else f"the newest held is {held.number}"
        raise NoRoute(
            Reason.BAD_VERSION.value,
            f"no weights announced for version {version}: {newest} (superseded, published "
            "without weights, or forgotten by a scheduler restart; ask for the newest)",
        )

    def _pick(self, held: _Version, worker: str, shunned: set[str]) -> str:
        """The shallowest attached node that may serve ``worker`` and has room.

        ``worker`` has no source now, so the nodes it serves are not reached from the root:
        it is never put under itself, and no cycle can form.
        """
        banned = shunned | held.failed
        root = held.publisher
        if self.fanout > 0:
            if root not in banned and len(held.nodes[root].downstream) < self.fanout:
                return root  # the shallowest node
            ranked = _ranking(held)
            for i in range(held.cursor, len(ranked)):  # by depth, each level by arrival
                name = ranked[i][2]
                node = held.nodes[name]
                if not node.address or len(node.downstream) >= self.fanout:
                    if i == held.cursor:
                        held.cursor += 1  # it stays so until a node is lost
                    continue
                if name not in banned:
                    return name
        if root not in banned:
            # Fan-out 0, or every relay is full (receivers without addresses add no room):
            # the trainer serves one more rather than leave a receiver without weights.
            return root
        raise self._no_source(held, worker)

    def _no_source(self, held: _Version, worker: str) -> NoRoute:
        return NoRoute(
            NO_SOURCE,
            f"no source left for {worker!r} to fetch version {held.number} from (the "
            "publisher and every relay it may use failed it): wait for the next version",
        )

    def _detach(self, held: _Version, worker: str) -> None:
        node = held.nodes[worker]
        if node.source is not None:
            held.nodes[node.source].downstream.remove(worker)
            node.source = None
            held.ranked = None

    def _remove(self, held: _Version, worker: str) -> None:
        node = held.nodes.get(worker)
        if node is None:
            return
        self._detach(held, worker)
        for orphan in node.downstream:
            held.nodes[orphan].source = None
        del held.nodes[worker]
        held.ranked = None


def _ranking(held: _Version) -> list[tuple[int, int, str]]:
    """The attached nodes by (depth, arrival), rebuilt if stale."""
    if held.ranked is None:
        held.ranked, held.depth, held.cursor = [], {}, 1
        level, depth = [held.publisher], 0
        while level:
            for name in level:
                held.ranked.append((depth, held.nodes[name].arrival, name))
                held.depth[name] = depth
            level = sorted((child for name in level for child in held.nodes[name].downstream),
                           key=lambda name: held.nodes[name].arrival)  # fmt: skip
            depth += 1
    return held.ranked


def _ranked_attach(held: _Version, worker: str, node: _Node) -> None:
    """``worker`` was hung under ``node.source``: give it its place in the ranking."""
    ranked = held.ranked
    if ranked is None:
        return
    if node.downstream:  # a subtree comes back with it: rank it afresh
        held.ranked = None
        return
    depth = held.depth[node.source] + 1  # type: ignore[index]
    held.depth[worker] = depth
    entry = (depth, node.arrival, worker)
    at = bisect_left(ranked, entry)
    ranked.insert(at, entry)
    held.cursor = min(held.cursor, at)  # a new leaf may have room
