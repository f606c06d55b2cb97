"""The learning rate of a train step, from the step's number alone.

A pure function of the step being taken, so a trainer (or critic) restarted from a staged
state or a checkpoint, or rolled back, sets the same rate as one that never stopped:
nothing about the schedule lives in a counter a restart could lose. The rate is the same
for every optimizer step of a train step (``algorithm.mini_batches`` x ``epochs``): the
schedule counts train steps, as ``run.total_steps`` does.

With ``s`` the train steps taken before this one (the step being taken is step ``s + 1``,
whose update makes version ``s + 1``), ``W`` the warm-up steps, ``D`` the decay steps
(``decay_steps``, or the run's total steps when 0) and ``m`` the floor ratio:

- ``s < W``: ``lr * (s + 1) / W`` (the first step takes ``lr / W``, none is spent at 0;
  the warm-up's last takes the whole rate);
- then ``p = (s - W) / (D - W)``, held at 1 from ``s = D`` on; the rate is ``lr * f`` with
  constant ``f = 1``, linear ``f = 1 - (1 - m) p``, cosine
  ``f = m + (1 - m) (1 + cos(pi p)) / 2``. The decay starts at the whole rate and reaches
  the floor ``lr * m`` after ``D`` steps: with ``D`` the run's length its last step still
  learns (at ``lr * (m + (1 - m) / (D - W))``, linear), none is spent at a rate of 0.
"""

from __future__ import annotations

import math

from asyncrl.runtime.contract.config.recipes import ScheduleSection

__all__ = ["lr_at"]


def lr_at(step: int, base_lr: float, schedule: ScheduleSection, total_steps: int) -> float:
    """The rate for the train step after ``step`` steps were taken (``step`` from 0)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    warmup = schedule.warmup_steps
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if schedule.kind == "constant":
        return base_lr
    end = schedule.decay_steps or total_steps
    progress = 1.0 if end <= warmup else min(1.0, (step - warmup) / (end - warmup))
    floor = schedule.min_lr_ratio
    if schedule.kind == "linear":
        factor = 1.0 - (1.0 - floor) * progress
    elif schedule.kind == "cosine":
        factor = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"schedule kind must be constant, linear or cosine, got {schedule.kind!r}")
    return base_lr * factor
