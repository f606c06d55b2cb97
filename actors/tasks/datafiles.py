"""Data files as a task: rows of JSONL or Parquet files in verl's layout
(:mod:`.rows`), training rows in a seeded shuffled order (:mod:`.order`), validation rows
in file order, and the math verifier as the reward.

Each row's chat messages become prompt text once, when the files are read (``prepare``:
the model's chat template, and a length check), so a row the template refuses or that
is too long fails at the start naming its file and row, not in the middle of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .base import Sample
from .math_reward import math_reward
from .order import ShuffledOrder
from .rows import DataFileError, Row, read_rows

__all__ = ["DataFiles"]

_SPLITS = ("train", "validation")


@dataclass(frozen=True)
class DataFiles:
    """Samples from data files: ``train`` rows reshuffled every epoch, ``validation`` rows
    in order (a finite split)."""

    train: Sequence[Sample]
    validation: Sequence[Sample]
    order: ShuffledOrder
    name: str = "data files"

    @classmethod
    def read(
        cls,
        train_files: Sequence[str],
        val_files: Sequence[str],
        *,
        seed: int,
        prepare: Callable[[Row], str],
    ) -> DataFiles:
        """Read and check every row; ``prepare`` turns a row's messages into prompt text
        (raising ValueError to refuse it)."""
        train = _samples(read_rows(train_files, "data.train_files"), prepare)
        validation = _samples(read_rows(val_files, "data.val_files"), prepare) if val_files else []
        return cls(train, validation, ShuffledOrder(len(train), seed))

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
