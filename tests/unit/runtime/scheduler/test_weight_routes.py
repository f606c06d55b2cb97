"""The weight route planner: relay trees without cycles, fan-out kept, failed sources shunned."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.runtime.scheduler.service.weight_routes import NO_SOURCE, NoRoute, WeightRoutes

MANIFEST = {"buckets": [[0, 64]], "sha": "ab"}


def announced(fanout: int, version: int = 3) -> WeightRoutes:
    routes = WeightRoutes(fanout)
    assert routes.announce(version, "trainer", MANIFEST, b"T")
    return routes


def addr(worker: str) -> bytes:
    return f"@{worker}".encode()


def test_receivers_fill_the_shallowest_node_first_in_order_of_arrival() -> None:
    routes = announced(2)
    sources = [routes.route(g, 3, addr(g)).source for g in ("g1", "g2", "g3", "g4", "g5", "g6")]
    # Publisher takes two, then g1 (first to arrive) two, then g2 two.
    assert sources == ["trainer", "trainer", "g1", "g1", "g2", "g2"]
    plan = routes.route("g7", 0, addr("g7"))
    assert (plan.version, plan.source, plan.source_address) == (3, "g3", b"@g3")
    assert plan.manifest == MANIFEST


def test_within_a_level_the_first_to_arrive_relays_first() -> None:
    routes = announced(2)
    for g in ("g1", "g2", "g3", "g4", "g5"):  # trainer <- g1, g2; g1 <- g3, g4; g2 <- g5
        routes.route(g, 3, addr(g))
    routes.forget("g3")
    assert routes.route("g6", 3, addr("g6")).source == "g1"  # g1's children: g4, g6
    assert routes.route("g7", 3, addr("g7")).source == "g2"
    sources = [routes.route(g, 3, addr(g)).source for g in ("g8", "g9", "g10", "g11")]
    assert sources == ["g4", "g4", "g5", "g5"]  # g5 came before g6, though g1 came first


def test_the_publisher_address_and_manifest_reach_its_receivers() -> None:
    plan = announced(2).route("g1", 3)
    assert (plan.source, plan.source_address, plan.manifest) == ("trainer", b"T", MANIFEST)


def test_fanout_zero_sends_everyone_to_the_publisher() -> None:
    routes = announced(0)
    assert {routes.route(f"g{i}", 3, addr(f"g{i}")).source for i in range(9)} == {"trainer"}


def test_receivers_without_an_address_never_relay() -> None:
    routes = announced(1)
    assert routes.route("mute", 3).source == "trainer"
    # The publisher is full and the only other node cannot relay: the publisher serves.
    assert routes.route("g2", 3, addr("g2")).source == "trainer"
    assert routes.route("g3", 3, addr("g3")).source == "g2"


def test_asking_again_gives_the_same_source() -> None:
    routes = announced(1)
    first = [routes.route(g, 3, addr(g)) for g in ("g1", "g2", "g3")]
    assert [routes.route(g, 3, addr(g)) for g in ("g1", "g2", "g3")] == first
    assert [routes.route(g, 0) for g in ("g1", "g2", "g3")] == first


def test_a_failed_source_leaves_the_tree_and_its_receivers_are_reattached() -> None:
    routes = announced(1)
    for g in ("g1", "g2", "g3"):  # a chain: trainer <- g1 <- g2 <- g3
        routes.route(g, 3, addr(g))
    assert routes.tree() == {"g1": "trainer", "g2": "g1", "g3": "g2"}
    # g2 says g1 failed it: g1 is out, which frees the trainer's one place for g2.
    assert routes.route("g2", 3, failed="g1").source == "trainer"
    assert routes.tree() == {"g2": "trainer", "g3": "g2"}
    # g2 says the trainer failed it: g3 has room but fetches through g2 (no cycles).
    with pytest.raises(NoRoute) as caught:
        routes.route("g2", 3, failed="trainer")
    assert caught.value.code == NO_SOURCE
    routes = announced(2)
    for g in ("g1", "g2", "g3", "g4"):  # trainer <- g1, g2; g1 <- g3, g4
        routes.route(g, 3, addr(g))
    plan = routes.route("g3", 3, failed="g1")
    assert plan.source == "trainer" and "g1" not in routes.tree()
    assert routes.tree()["g4"] is None  # orphaned until it asks
    assert routes.route("g4", 3).source == "g2"  # depth 1, and before g3
    # g1 may come back as a receiver, but never serves this version again.
    assert routes.route("g1", 3, addr("g1")).source == "g2"
    later = [routes.route(g, 3, addr(g)).source for g in ("g5", "g6", "g7", "g8", "g9")]
    assert later == ["g3", "g3", "g4", "g4", "g5"]  # g1 (depth 2, before g5) is passed over
    assert "g1" not in routes.tree().values()


def test_a_publisher_that_failed_one_receiver_stays_the_root_for_the_others() -> None:
    routes = announced(2)
    for g in ("g1", "g2"):
        routes.route(g, 3, addr(g))
    assert routes.route("g2", 3, failed="trainer").source == "g1"
    assert routes.route("g3", 3, addr("g3")).source == "trainer"
    with pytest.raises(NoRoute) as caught:
        announced(0).route("g1", 3, failed="trainer")
    assert caught.value.code == NO_SOURCE and "g1" in caught.value.detail


def test_lost_workers_leave_the_tree_and_a_lost_publisher_takes_the_announcement() -> None:
    routes = announced(1)
    for g in ("g1", "g2"):
        routes.route(g, 3, addr(g))
    routes.forget("g1")
    assert routes.tree() == {"g2": None}
    assert routes.route("g2", 3).source == "trainer"
    routes.forget("nobody")  # unknown workers are no error
    routes.forget("trainer")
    assert routes.newest is None and routes.tree() == {}
    with pytest.raises(NoRoute, match="version 3: none is held"):
        routes.route("g2", 3)


def test_the_newest_version_announced_again_with_weights_replaces_what_is_held() -> None:
    # A trainer that restarted serves the current version from a new address.
    routes = announced(2, version=5)
    routes.route("g1", 5, addr("g1"))
    assert routes.announce(5, "trainer", {"again": 1}, b"T-new")
    assert routes.tree() == {}
    route = routes.route("g1", 5, addr("g1"))
    assert route.manifest == {"again": 1} and route.source_address == b"T-new"


def test_versions_only_go_forward_and_only_the_newest_is_routed() -> None:
    routes = announced(2, version=5)
    routes.route("g1", 5, addr("g1"))
    assert not routes.announce(5, "trainer", None, b"")  # the newest again, no weights
    assert not routes.announce(4, "trainer", {"other": 1}, b"T")
    assert routes.route("g1", 0).manifest == MANIFEST
    assert routes.announce(6, "trainer", {"v": 6}, b"T2")
    assert routes.tree() == {}  # a fresh tree per version
    with pytest.raises(NoRoute, match="version 5: the newest held is 6") as caught:
        routes.route("g1", 5)
    assert caught.value.code == "bad_version"
    assert routes.route("g1", 0).source_address == b"T2"
    # A newer version without weights: nothing to hand out as the newest.
    assert routes.announce(7, "trainer", None, b"")
    with pytest.raises(NoRoute, match="none is held"):
        routes.route("g1", 0)
    assert not routes.announce(6, "trainer", {"v": 6}, b"T2")


def test_nonsense_requests_are_value_errors() -> None:
    routes = announced(2)
    with pytest.raises(ValueError, match="published version 3"):
        routes.route("trainer", 3)
    with pytest.raises(ValueError, match="names itself"):
        routes.route("g1", 3, failed="g1")
    with pytest.raises(ValueError, match=">= 0"):
        WeightRoutes(-1)


def test_the_summary_holds_no_manifest_or_addresses() -> None:
    routes = announced(2)
    routes.route("g1", 3, addr("g1"))
    assert routes.summary() == {
        "version": 3,
        "publisher": "trainer",
        "relay_fanout": 2,
        "tree": {"g1": "trainer"},
    }


# --- random sequences --------------------------------------------------------------------

WORKERS = [f"g{i}" for i in range(8)]
asks = st.tuples(
    st.just("ask"),
    st.sampled_from(WORKERS),
    st.booleans(),  # gives an address
    st.sampled_from(["", "", "trainer", *WORKERS]),  # the source it says failed it
)
ops = st.one_of(
    asks,
    st.tuples(st.just("lose"), st.sampled_from(WORKERS)),
    st.tuples(st.just("publish")),
)


class Model:
    """What a correct plan must respect, kept beside the planner from the outside."""

    def __init__(self, fanout: int) -> None:
        self.fanout = fanout
        self.version = 1
        self.addressed: set[str] = set()  # receivers that gave an address at first ask
        self.failed: set[str] = set()  # named as failed for this version
        self.joined: set[str] = set()

    def new_version(self) -> None:
        self.version += 1
        self.addressed, self.failed, self.joined = set(), set(), set()


def chain(tree: dict[str, str | None], start: str) -> list[str]:
    """Sources from ``start`` up; fails the test on a cycle."""
    seen = [start]
    node = tree.get(start)
    while node is not None and node != "trainer":
        assert node not in seen, f"cycle through {[*seen, node]}"
        seen.append(node)
        node = tree.get(node)
    return seen + ([node] if node else [])


def check_tree(routes: WeightRoutes, model: Model) -> None:
    tree = routes.tree()
    assert "trainer" not in tree  # the publisher is the root, never a receiver
    served: dict[str, int] = {}
    for receiver, source in tree.items():
        chain(tree, receiver)
        if source is None:
            continue
        assert source == "trainer" or source in tree, "a source that left the tree"
        served[source] = served.get(source, 0) + 1
        if source != "trainer":
            assert source in model.addressed, f"{source} relays without an address"
            assert source not in model.failed
            assert model.fanout > 0
    for source, count in served.items():
        if source != "trainer":
            assert count <= model.fanout, f"{source} serves {count} > {model.fanout}"


@settings(max_examples=300, deadline=None)
@given(fanout=st.integers(0, 3), steps=st.lists(ops, max_size=60))
def test_random_sequences_keep_every_invariant(fanout: int, steps: list[tuple]) -> None:
    routes, model = WeightRoutes(fanout), Model(fanout)
    routes.announce(model.version, "trainer", {"v": model.version}, b"T")
    for op in steps:
        if op[0] == "publish":
            model.new_version()
            assert routes.announce(model.version, "trainer", {"v": model.version}, b"T")
        elif op[0] == "lose":
            routes.forget(op[1])
            model.joined.discard(op[1])
            model.addressed.discard(op[1])
        else:
            _, worker, has_address, failed = op
            if failed == worker:
                continue
            if worker not in model.joined:
                model.joined.add(worker)
                if has_address:
                    model.addressed.add(worker)
            if failed and failed != "trainer":
                model.failed.add(failed)
            before = routes.tree()
            try:
                plan = routes.route(worker, model.version, addr(worker) * has_address, failed)
            except NoRoute as no:
                assert no.code == NO_SOURCE and failed  # only a failure can leave none
                continue
            assert plan.version == model.version and plan.manifest == {"v": model.version}
            assert plan.source not in (worker, failed)
            assert plan.source not in model.failed
            assert plan.source_address == (b"T" if plan.source == "trainer" else addr(plan.source))
            tree = routes.tree()
            assert tree[worker] == plan.source
            assert worker not in chain(tree, plan.source)  # not under itself
            if not failed:  # idempotent
                assert routes.route(worker, 0) == plan
            newly = before.get(worker) != plan.source
            others = sum(1 for r, s in tree.items() if s == "trainer" and r != worker)
            if newly and plan.source == "trainer" and fanout and others >= fanout:
                # The trainer over its fan-out only when no relay had room for this one.
                below = set(chain_under(tree, worker))
                for relay in tree:
                    if (
                        relay in model.addressed
                        and relay not in model.failed
                        and relay not in below
                        and tree[relay] is not None
                        and chain(tree, relay)[-1] == "trainer"
                    ):
                        load = sum(1 for s in tree.values() if s == relay)
                        assert load >= fanout, f"{relay} had room ({load} < {fanout})"
        check_tree(routes, model)


def chain_under(tree: dict[str, str | None], start: str) -> list[str]:
    """``start`` and every receiver whose sources lead through it."""
    return [r for r in tree if start in chain(tree, r)]


class WalkingRoutes(WeightRoutes):
    """The planner as it was before it kept a ranking: every pick walks the tree from the
    publisher, level by level, each level in order of arrival. The reference."""

    def _pick(self, held, worker, shunned):  # type: ignore[no-untyped-def]
        banned = shunned | held.failed
        root = held.publisher
        if self.fanout > 0:
            level = [root]
            while level:
                for name in level:
                    node = held.nodes[name]
                    if name in banned or (name != root and not node.address):
                        continue
                    if len(node.downstream) < self.fanout:
                        return name
                below = [child for name in level for child in held.nodes[name].downstream]
                level = sorted(below, key=lambda name: held.nodes[name].arrival)
        if root not in banned:
            return root
        raise self._no_source(held, worker)


def outcome(routes: WeightRoutes, op: tuple, version: int) -> object:
    if op[0] == "lose":
        return routes.forget(op[1])
    _, worker, has_address, failed = op
    try:
        return routes.route(worker, version, addr(worker) * has_address, failed)
    except (NoRoute, ValueError) as error:
        return type(error), str(error)


@settings(max_examples=300, deadline=None)
@given(fanout=st.integers(1, 3), steps=st.lists(ops, max_size=80))
def test_the_kept_ranking_picks_what_walking_the_tree_picks(
    fanout: int, steps: list[tuple]
) -> None:
    kept, walking, version = WeightRoutes(fanout), WalkingRoutes(fanout), 1
    for routes in (kept, walking):
        routes.announce(version, "trainer", {"v": version}, b"T")
    for op in steps:
        if op[0] == "publish":
            version += 1
            for routes in (kept, walking):
                routes.announce(version, "trainer", {"v": version}, b"T")
            continue
        assert outcome(kept, op, version) == outcome(walking, op, version), op
        assert kept.tree() == walking.tree()


def test_a_pick_does_not_walk_the_tree_it_keeps_ranked() -> None:
    """A thousand receivers without addresses hang under the publisher; each new one used
    to walk all the others first (quadratic per version)."""
    routes = announced(2)
    for i in range(1000):
        routes.route(f"g{i}", 3)
    held = routes._held
    assert held is not None and held.ranked is not None
    # Past every node that cannot relay but the newest, which a pick looks at once.
    assert held.cursor == len(held.ranked) - 1
