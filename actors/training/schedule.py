"""The learning rate of a train step, from the step's number alone.

A pure function of the step being taken, so a trainer (or critic) restarted from a staged
state or a checkpoint, or rolled back, sets the same rate as one that never stopped:
nothing about the schedule lives in a counter a restart could lose. The rate is the same
for every optimizer step of a train step (``algorithm.mini_batches`` x ``epochs``): the
schedule counts train steps, as ``run.total_steps`` does.

With ``k`` the train step being taken counted from 1 (the step whose update makes version
``k``), ``W`` the warm-up steps, ``D`` the decay's end (``decay_steps``, or the run's total
steps when 0) and ``m`` the floor ratio:

- ``k <= W``: ``lr * k / W`` (the first step takes ``lr / W``, none is wasted at 0; step
  ``W`` takes the whole rate);
- then ``p = (k - W) / (D - W)``, held at 1 past ``D``; the rate is ``lr * f`` with
  constant ``f = 1``, linear ``f = 1 - (1 - m) p``, cosine
  ``f = m + (1 - m) (1 + cos(pi p)) / 2``. Step ``D`` takes the floor ``lr * m``.
"""

from __future__ import annotations

import math

from asyncrl.runtime.contract.config.learning import ScheduleSection

__all__ = ["lr_at"]


def lr_at(step: int, base_lr: float, schedule: ScheduleSection, total_steps: int) -> float:
    """The rate for the train step after ``step`` steps were taken (``step`` from 0)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    k = step + 1
    warmup = schedule.warmup_steps
    if k <= warmup:
        return base_lr * k / warmup
    if schedule.kind == "constant":
        return base_lr
    end = schedule.decay_steps or total_steps
    progress = 1.0 if end <= warmup else min(1.0, (k - warmup) / (end - warmup))
    floor = schedule.min_lr_ratio
    if schedule.kind == "linear":
        factor = 1.0 - (1.0 - floor) * progress
    elif schedule.kind == "cosine":
        factor = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"schedule kind must be constant, linear or cosine, got {schedule.kind!r}")
    return base_lr * factor
