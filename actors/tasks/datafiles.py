"""Data files as a task: rows of JSONL or Parquet files in verl's layout
(:mod:`.rows`), training rows in a seeded shuffled order (:mod:`.order`), validation rows
in file order, and the math verifier as the reward.

With ``data.train_weights`` the training rows fall into weighted parts, one per key: a
file of ``data.train_files`` (as written there) or a ``data_source``; each row must fall
under exactly one key, which is checked when the files are read.

Each row's chat messages become prompt text once, when the files are read (``prepare``:
the model's chat template, and a length check), so a row the template refuses or that
is too long fails at the start naming its file and row, not in the middle of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .base import Sample
from .math_reward import math_reward
from .order import MixedOrder, Order, Part, ShuffledOrder
from .rows import DataFileError, Row, read_files

__all__ = ["DataFiles"]

_SPLITS = ("train", "validation")


@dataclass(frozen=True)
class DataFiles:
    """Samples from data files: ``train`` rows reshuffled every epoch, ``validation`` rows
    in order (a finite split)."""

    train: Sequence[Sample]
    validation: Sequence[Sample]
    order: Order
    name: str = "data files"

    @classmethod
    def read(
        cls,
        train_files: Sequence[str],
        val_files: Sequence[str],
        *,
        seed: int,
        prepare: Callable[[Row], str],
        train_weights: Mapping[str, float] | None = None,
    ) -> DataFiles:
        """Read and check every row; ``prepare`` turns a row's messages into prompt text
        (raising ValueError to refuse it). ``train_weights`` makes the order a mixture."""
        files = read_files(train_files, "data.train_files")
        order: Order
        if train_weights:
            order = _mixture(train_files, files, train_weights, seed)
        else:
            order = ShuffledOrder(sum(map(len, files)), seed)
        train = _samples([row for rows in files for row in rows], prepare)
        validation = _validation(val_files, prepare) if val_files else []
        return cls(train, validation, order)

    def sample(self, split: str, index: int) -> Sample:
        if split not in _SPLITS:
            raise ValueError(f"split {split!r}: expected one of {list(_SPLITS)}")
        if split == "train":
            return self.train[self.order.row(index)]
        if not 0 <= index < len(self.validation):
            raise IndexError(f"validation row {index}: the files hold {len(self.validation)}")
        return self.validation[index]

    def reward(self, sample: Sample, response: str) -> float:
        return math_reward(sample, response)


def _validation(paths: Sequence[str], prepare: Callable[[Row], str]) -> list[Sample]:
    """The validation rows, file by file; a row without a ``data_source`` is counted under
    its file's name (validation reports each source apart)."""
    samples = []
    for path, rows in zip(paths, read_files(paths, "data.val_files"), strict=True):
        name = Path(path).stem
        samples += [replace(s, data_source=s.data_source or name) for s in _samples(rows, prepare)]
    return samples


def _samples(rows: list[Row], prepare: Callable[[Row], str]) -> list[Sample]:
    samples = []
    for row in rows:
        try:
            prompt = prepare(row)
        except ValueError as error:
            raise DataFileError(f"{row.where}: {error}") from None
        samples.append(
            Sample(prompt, row.ground_truth, row.data_source, row.extra_info, row.messages)
        )
    return samples


def _mixture(
    paths: Sequence[str], files: Sequence[list[Row]], weights: Mapping[str, float], seed: int
) -> MixedOrder:
    """The weighted parts of the training rows (``files``, those of ``paths``), each row
    under exactly one key of ``weights``: its file's or its data source's."""
    key = "data.train_weights"
    sources = sorted({row.data_source for rows in files for row in rows})
    for name in weights:
        if name not in paths and name not in sources:
            raise DataFileError(
                f"{key}: {name!r} is neither a file of data.train_files nor a data_source "
                f"of their rows (data sources: {', '.join(map(repr, sources))})"
            )
    members: dict[str, list[int]] = {name: [] for name in weights}
    index = 0
    for path, rows in zip(paths, files, strict=True):
        for row in rows:
            under = [name for name in dict.fromkeys((path, row.data_source)) if name in weights]
            if not under:
                raise DataFileError(
                    f"{key}: {row.where} (data_source {row.data_source!r}) has no weight; "
                    "give its file or its data_source one"
                )
            if len(under) > 1:
                raise DataFileError(
                    f"{key}: {row.where} falls under both {path!r} (its file) and "
                    f"{row.data_source!r} (its data_source); weight one or the other"
                )
            members[under[0]].append(index)
            index += 1
    for name, rows in members.items():
        if not rows:
            raise DataFileError(f"{key}: {name!r} holds no rows")
    return MixedOrder([Part(name, weights[name], rows) for name, rows in members.items()], seed)
