"""The validation sets of a workload: its validation prompts grouped by data source.

A data source is a row's ``data_source`` column (verl's layout), or, for a validation
file whose rows leave it empty, the file's name (:class:`~..tasks.datafiles.DataFiles`
fills it in); a task plug-in's samples without one form one set named after the task.
Each set is validated on its first ``per_set`` prompts, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tasks import Sample, Task

__all__ = ["ValidationSet", "validation_sets"]


@dataclass(frozen=True, slots=True)
class ValidationSet:
    name: str
    samples: tuple[Sample, ...]


def validation_sets(task: Task, per_set: int) -> list[ValidationSet]:
    """The sets of ``task``'s validation split, in the order their sources first appear.

    Data files hold their validation rows in memory: they are read whole and grouped, so
    a source that starts late in the files is found. A task's split may be endless (a
    generated task): its first ``per_set`` samples are read.
    """
    if per_set < 1:
        raise ValueError(f"data.val_prompts={per_set}: expected an integer >= 1")
    finite = getattr(task, "validation", None)
    samples = list(finite) if finite is not None else _first(task, per_set)
    grouped: dict[str, list[Sample]] = {}
    for sample in samples:
        kept = grouped.setdefault(source_name(sample, task), [])
        if len(kept) < per_set:
            kept.append(sample)
    return [ValidationSet(name, tuple(kept)) for name, kept in grouped.items()]


def _first(task: Task, count: int) -> list[Sample]:
    samples = []
    for index in range(count):
        try:
            samples.append(task.sample("validation", index))
        except IndexError:  # a finite split shorter than ``count``
            break
    return samples


def source_name(sample: Sample, task: Task) -> str:
    """The data source ``sample`` is counted under."""
    return sample.data_source or task.name
