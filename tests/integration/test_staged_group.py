"""A group of 2 ranks (real processes, gloo) resumes together: when one rank's slot for
the scheduler's step is torn, both ranks take up the older step they both staged whole,
never a mix of steps."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.training.gang import Gang
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.actors.training.rank import TrainRank
from asyncrl.actors.training.resume import Choice, Source
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.runtime.contract.rundir import RunDir
from tests.integration.test_train_group import _lease
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

pytestmark = pytest.mark.timeout(180)


def _config(run_dir: Path):
    return config_from_dict(
        {"run": {"dir": str(run_dir)}, "algorithm": {"micro_batch_groups": 2, "lr": 1e-3}}
    )


def _rank_main(rank: int, port: int, run_dir: Path, target: int | None, results) -> None:
    """Train two steps (``target`` None), or restore for the scheduler's ``target``."""
    torch.set_num_threads(1)
    gang = Gang(GangPlace(rank, 2, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        model, codec = load_model("embedded")
        cfg = _config(run_dir)
        trainer = TrainRank(cfg, Learner(model, cfg, codec.pad_id, 2), rank, 2)
        if target is None:
            trainer.restore(0)
            for seed in (0, 1):
                trainer.train([Group.of(item) for item in _lease(seed).items])
            results.put((rank, None))
        else:
            choice, _ = trainer.restore(target)
            results.put((rank, choice))
        trainer.store.close()
    finally:
        gang.close()


def _group(run_dir: Path, target: int | None) -> dict[int, Choice | None]:
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    ranks = start_ranks(_rank_main, 2, port, run_dir, target, results)
    out = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    return out


def _taken(chosen: dict[int, Choice | None]) -> set[tuple[int, Source]]:
    """What the ranks took up, once each: one element when they all agree."""
    assert len(chosen) == 2 and None not in chosen.values()
    return {(c.step, c.source) for c in chosen.values() if c is not None}


def test_a_rank_with_a_torn_slot_sends_the_whole_group_to_the_same_older_step(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path / "run")
    try:
        _group(run.root, None)
        assert _taken(_group(run.root, 2)) == {(2, Source.STAGED)}
        # Rank 1's slot of step 2 torn (a byte of its last tensor flipped): step 1 for both.
        newest = max(run.staged_state.glob("rank1-*.state"), key=lambda p: p.stat().st_mtime)
        with open(newest, "r+b") as f:
            f.seek(-3, 2)
            byte = f.read(1)
            f.seek(-3, 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert _taken(_group(run.root, 2)) == {(1, Source.STAGED)}
    finally:
        shutil.rmtree(run.staged_state, ignore_errors=True)
