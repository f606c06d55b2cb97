"""Where step lines go besides ``metrics.jsonl``: the loggers users already read.

``logging.backends`` names them. ``metrics.jsonl`` is always written (progress, ``inspect``
and ``report`` read it); ``tensorboard`` writes an event file under
``run.dir/tensorboard``, ``wandb`` an offline run under ``run.dir/wandb`` (``wandb sync``
uploads it later). Each takes a step line flattened to scalars: ``roles.generate.
tokens_per_s``, ``critical_path.leased_to_trained_s``; lists (batch keys) are left out.

A sink is called on the scheduler's loop once per train step, never per request. A
rollback cuts lines from ``metrics.jsonl`` but cannot take points back from these: the
steps trained again are logged again, at the same step numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["MetricsSink", "flatten", "open_sinks"]


class MetricsSink(Protocol):
    def step(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def flatten(line: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The line's numbers, nested keys joined by dots (booleans and lists left out)."""
    for key, value in line.items():
        if isinstance(value, Mapping):
            yield from flatten(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield prefix + key, float(value)


class TensorBoardSink:
    """Scalars in a TensorBoard event file, written with tensorboard's own writer (the
    one torch's SummaryWriter wraps; the scheduler does not load torch)."""

    def __init__(self, directory: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(directory))

    def step(self, step: int, scalars: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
        self._writer.add_event(self._event(step=step, summary=self._summary(value=values)))

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """An offline Weights & Biases run: nothing leaves the machine until ``wandb sync``."""

    def __init__(self, directory: Path, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            mode="offline", dir=str(directory), name=name, config=dict(config), reinit=True
        )

    def step(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


def open_sinks(
    backends: Iterable[str], root: Path, name: str, config: Mapping[str, Any]
) -> list[MetricsSink]:
    """A sink for each backend other than jsonl (which MetricsLog itself is)."""
    sinks: list[MetricsSink] = []
    for backend in backends:
        if backend == "tensorboard":
            sinks.append(TensorBoardSink(root / "tensorboard"))
        elif backend == "wandb":
            sinks.append(WandbSink(root / "wandb", name, config))
    return sinks
