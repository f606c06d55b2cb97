"""Mixtures of training data (``data.train_weights``; actors/tasks/order.py's MixedOrder,
datafiles.py): the draw is a pure function of (seed, index) that gives each part its
share of every run of consecutive indexes (two parts: floor or ceil of it; up to four:
within two), each part's rows in a shuffle of its own, and a weight that covers no row,
a row under no weight or under two, is one line naming it."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.actors.startup.role_checks import check_task
from asyncrl.actors.tasks.datafiles import DataFiles
from asyncrl.actors.tasks.order import MixedOrder, Part, ShuffledOrder
from asyncrl.actors.workload import load_workload
from asyncrl.runtime.contract.config import ConfigError, RunConfig, config_from_dict
from tests.support.datafiles import addition_rows, write_rows


def mixture(weights: list[float], sizes: list[int] | None = None, seed: int = 0) -> MixedOrder:
    """Parts named p0, p1... of ``sizes`` rows each (10 by default), rows numbered on."""
    sizes = sizes or [10] * len(weights)
    starts = list(itertools.accumulate([0, *sizes]))
    parts = [
        Part(f"p{i}", w, range(starts[i], starts[i] + n))
        for i, (w, n) in enumerate(zip(weights, sizes, strict=True))
    ]
    return MixedOrder(parts, seed)


def worst_window_error(order: MixedOrder, stop: int) -> float:
    """The largest gap between a part's draws in a run of indexes and its share of them,
    over every run within ``0 .. stop-1``."""
    weights = [part.weight for part in order.parts]
    shares = [w / sum(weights) for w in weights]
    taken = [[0] * len(shares)]
    for index in range(stop):
        part, _ = order.locate(index)
        taken.append(list(taken[-1]))
        taken[-1][part] += 1
    worst = 0.0
    for a, b in itertools.combinations(range(stop + 1), 2):
        for part, share in enumerate(shares):
            worst = max(worst, abs(taken[b][part] - taken[a][part] - (b - a) * share))
    return worst


def test_three_to_one_gives_750_and_250_of_1000_and_every_window_its_share() -> None:
    order = mixture([3.0, 1.0], sizes=[60, 20])
    parts = [order.locate(i)[0] for i in range(1000)]
    assert parts.count(0) == 750 and parts.count(1) == 250
    assert parts[:8] == [0, 0, 1, 0, 0, 0, 1, 0]  # pinned: a change of the draw shows here
    for start in range(0, 1000 - 100):  # any 100 in a row: 75 and 25
        assert parts[start : start + 100].count(1) == 25
    assert worst_window_error(order, 200) < 1


@pytest.mark.parametrize(("parts", "bound"), [(2, 1), (3, 2), (4, 2), (5, 3), (8, 3)])
def test_any_weights_give_each_part_its_share_of_every_window(parts: int, bound: int) -> None:
    rng = random.Random(parts)
    for _ in range(5):
        weights = [rng.uniform(0.05, 20.0) for _ in range(parts)]
        assert worst_window_error(mixture(weights), 240) < bound, weights


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(
        st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=2, max_size=8
    ),
    start=st.integers(min_value=0, max_value=10**9),
)
def test_every_window_anywhere_is_within_one_prompt_per_halving(
    weights: list[float], start: int
) -> None:
    order = mixture(weights)
    bound = math.ceil(math.log2(len(weights)))  # 2 parts: 1, 3-4: 2, 5-8: 3
    exact = [Fraction(w) for w in weights]  # as the order splits: no rounding to blame
    shares = [w / sum(exact) for w in exact]
    base = order.counts(start)
    for length in range(1, 120):
        taken = order.counts(start + length)
        for part, share in enumerate(shares):
            assert abs(taken[part] - base[part] - length * share) < bound


def test_counts_and_locate_agree_on_any_index_far_out() -> None:
    order = mixture([0.7, 0.2, 0.1], sizes=[7, 5, 3])
    for index in [0, 1, 2, 999, 10**6 + 3, 10**12 + 17]:
        part, position = order.locate(index)
        assert order.counts(index)[part] == position
        assert order.counts(index + 1)[part] == position + 1
        assert sum(order.counts(index)) == index
    assert order.counts(10**12) == [7 * 10**11, 2 * 10**11, 10**11]


def test_the_draw_is_a_function_of_seed_and_index_alone() -> None:
    first = [mixture([3.0, 1.0], [60, 20], seed=5).row(i) for i in range(500)]
    restarted = mixture([3.0, 1.0], [60, 20], seed=5)  # offering keys from 0 again
    assert [restarted.row(i) for i in range(500)] == first
    resumed = mixture([3.0, 1.0], [60, 20], seed=5)  # or asked from the middle on
    assert [resumed.row(i) for i in range(321, 500)] == first[321:]
    assert [mixture([3.0, 1.0], [60, 20], seed=6).row(i) for i in range(500)] != first


def test_each_part_takes_its_rows_once_per_epoch_of_its_own_in_a_new_shuffle() -> None:
    order = mixture([3.0, 1.0], sizes=[60, 20])
    small = [order.row(i) for i in range(480) if order.locate(i)[0] == 1]  # 120 draws
    epochs = [small[e * 20 : e * 20 + 20] for e in range(6)]
    assert all(sorted(epoch) == list(range(60, 80)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 6  # reshuffled every epoch
    large = [order.row(i) for i in range(480) if order.locate(i)[0] == 0]
    assert sorted(large[:60]) == list(range(60)) and large[:60] != large[60:120]


def test_parts_of_one_size_are_shuffled_apart() -> None:
    order = mixture([1.0, 1.0], sizes=[30, 30])
    a = [order.row(i) for i in range(60) if order.locate(i)[0] == 0]
    b = [order.row(i) - 30 for i in range(60) if order.locate(i)[0] == 1]
    assert a != b


def test_without_weights_the_order_is_the_plain_shuffle(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "t.jsonl", addition_rows("train", 30))
    task = load_workload(files_config(tmp_path, [train]))
    assert isinstance(task, DataFiles) and isinstance(task.order, ShuffledOrder)
    assert [task.order.row(i) for i in range(30)] == ShuffledOrder(30, seed=0).permutation(0)


# ------------------------------------------------------------------ from data files


def source_rows(source: str, count: int, offset: int = 0) -> list[dict[str, Any]]:
    rows = addition_rows("train", offset + count)[offset:]
    for row in rows:
        row["data_source"] = source
    return rows


def files_config(tmp_path: Path, train: list[Path], **weights: float) -> RunConfig:
    data: dict[str, Any] = {"train_files": [str(t) for t in train], "val_every_versions": 0}
    if weights:
        data["train_weights"] = weights
    return config_from_dict({"run": {"dir": str(tmp_path / "run")}, "data": data})


def test_files_weighted_3_to_1_are_drawn_750_and_250(tmp_path: Path) -> None:
    big = write_rows(tmp_path / "big.jsonl", source_rows("big", 40))
    small = write_rows(tmp_path / "small.parquet", source_rows("small", 8, offset=40))
    cfg = files_config(tmp_path, [big, small], **{str(big): 3.0, str(small): 1.0})
    task = load_workload(cfg)
    sources = [task.sample("train", i).data_source for i in range(1000)]
    assert sources.count("big") == 750 and sources.count("small") == 250
    assert check_task(cfg) == []


def test_data_sources_may_be_the_keys_across_files(tmp_path: Path) -> None:
    first = write_rows(tmp_path / "a.jsonl", source_rows("gsm", 10) + source_rows("math", 10, 10))
    second = write_rows(tmp_path / "b.jsonl", source_rows("math", 10, 20))
    task = load_workload(files_config(tmp_path, [first, second], gsm=1.0, math=4.0))
    sources = [task.sample("train", i).data_source for i in range(100)]
    assert sources.count("gsm") == 20 and sources.count("math") == 80
    # A file for one part and a data source for another, as long as no row has both.
    only = write_rows(tmp_path / "c.jsonl", source_rows("other", 5, 30))
    mixed = load_workload(files_config(tmp_path, [first, only], **{str(only): 1.0}, gsm=1, math=2))
    assert {mixed.sample("train", i).data_source for i in range(8)} == {"gsm", "math", "other"}


def test_a_weight_no_row_falls_under_is_named(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "a.jsonl", source_rows("gsm", 4))
    (line,) = check_task(files_config(tmp_path, [train], gsm=1.0, **{"a.json": 2.0}))
    assert line == (
        "data.train_weights: 'a.json' is neither a file of data.train_files nor a "
        "data_source of their rows (data sources: 'gsm')"
    )


def test_a_row_under_no_weight_is_named(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "a.jsonl", source_rows("gsm", 3) + source_rows("math", 2, 3))
    (line,) = check_task(files_config(tmp_path, [train], gsm=1.0))
    assert line == (
        f"data.train_weights: {train} row 3 (data_source 'math') has no weight; give its "
        "file or its data_source one"
    )


def test_a_row_under_two_weights_is_named(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "a.jsonl", source_rows("gsm", 3))
    (line,) = check_task(files_config(tmp_path, [train], gsm=1.0, **{str(train): 1.0}))
    assert line == (
        f"data.train_weights: {train} row 0 falls under both {str(train)!r} (its file) and "
        "'gsm' (its data_source); weight one or the other"
    )


def test_a_weighted_file_without_rows_is_named(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "a.jsonl", source_rows("gsm", 3))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    (line,) = check_task(files_config(tmp_path, [train, empty], gsm=1.0, **{str(empty): 1.0}))
    assert line == f"data.train_weights: {str(empty)!r} holds no rows"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"train_weights": {"a.jsonl": 1}},
            "data.train_weights: got {'a.jsonl': 1.0} with no data.train_files; allowed: "
            "empty, or weights of the training files or their data sources",
        ),
        (
            {"train_files": ["a.jsonl"], "train_weights": {"a.jsonl": 0}},
            "data.train_weights.a.jsonl: got 0; allowed: a number > 0",
        ),
        (
            {"train_files": ["a.jsonl"], "train_weights": {"a.jsonl": -2.5}},
            "data.train_weights.a.jsonl: got -2.5; allowed: a number > 0",
        ),
        (
            {"train_files": ["a.jsonl"], "train_weights": {"a.jsonl": float("nan")}},
            "data.train_weights.a.jsonl: got nan; allowed: a number > 0",
        ),
        (
            {"train_files": ["a.jsonl"], "train_weights": {"a.jsonl": float("inf")}},
            "data.train_weights.a.jsonl: got inf; allowed: a finite number > 0",
        ),
        (
            {"train_files": ["a.jsonl"], "train_weights": ["a.jsonl"]},
            "data.train_weights: got ['a.jsonl'] (list); allowed: a mapping of (a string) "
            "to (a number > 0)",
        ),
    ],
)
def test_weights_the_config_alone_refuses(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"data": {"val_every_versions": 0, **data}})
    assert str(caught.value) == message


def test_a_mixture_needs_parts_with_positive_weights() -> None:
    with pytest.raises(ValueError, match="at least one part"):
        MixedOrder([], seed=0)
    with pytest.raises(ValueError, match=r"part 'b': weight 0.0; expected a finite number > 0"):
        MixedOrder([Part("a", 1.0, [0]), Part("b", 0.0, [1])], seed=0)
    with pytest.raises(ValueError, match="index -1"):
        mixture([1.0, 1.0]).locate(-1)
