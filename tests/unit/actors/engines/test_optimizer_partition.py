"""The distributed optimizer's split of parameters among a group's ranks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("megatron.core")

from asyncrl.actors.engines.megatron.optimizer import partition

SIZES = st.dictionaries(st.text(min_size=1, max_size=8), st.integers(1, 10_000), min_size=1)


@given(SIZES, st.integers(1, 8))
def test_every_name_has_one_owner_and_no_rank_holds_more_than_its_share_and_one(sizes, ranks):
    owners = partition(list(sizes.items()), ranks)
    assert set(owners) == set(sizes)
    assert all(0 <= owner < ranks for owner in owners.values())
    load = [sum(sizes[n] for n, owner in owners.items() if owner == r) for r in range(ranks)]
    # Largest first to the least loaded: no rank is above the mean by more than one item.
    assert max(load) <= sum(sizes.values()) / ranks + max(sizes.values())


@given(SIZES, st.integers(1, 8))
def test_the_split_does_not_depend_on_the_order_the_names_come_in(sizes, ranks):
    items = list(sizes.items())
    assert partition(items, ranks) == partition(items[::-1], ranks)


def test_equal_parameters_alternate_between_two_ranks() -> None:
    owners = partition([("a", 4), ("b", 4), ("c", 4), ("d", 4)], 2)
    assert owners == {"a": 0, "b": 1, "c": 0, "d": 1}
