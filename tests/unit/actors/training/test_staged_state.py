"""A trainer rank's staged state: slot files that round-trip, never look valid torn, and
keep the previous step while the next is written; and the rule that picks what to resume."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from asyncrl.actors.training import state_slot
from asyncrl.actors.training.resume import Choice, Source, choose
from asyncrl.actors.training.staged_state import StagedState
from asyncrl.actors.training.state_slot import NoRoom

pytestmark = pytest.mark.timeout(60)


def _state(step: int, rows: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "param/w": torch.randn(rows, 32, generator=g),
        "param/h": torch.randn(7, generator=g).to(torch.bfloat16),
        "adam/w/step": torch.tensor(float(step)),
        "param/empty": torch.zeros(0, 4),
        "rng/torch": torch.randint(0, 255, (13,), dtype=torch.uint8, generator=g),
    }


def _store(directory: Path, rank: int = 0, ranks: int = 1) -> StagedState:
    return StagedState(directory, rank, {"ranks": ranks})


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a
    )


def test_a_staged_step_reads_back_bit_for_bit_from_a_new_store(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    store.save(1, _state(1))
    store.close()
    found = _store(tmp_path / "s").staged()
    assert list(found) == [1]
    assert _equal(found[1].tensors(), _state(1))
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (tmp_path / "s").iterdir())


def test_the_two_slots_alternate_and_keep_the_previous_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    names = []
    for step in (1, 2, 3):
        store.save(step, _state(step))
        names.append({s.step: s.slot.path.name for s in store.staged().values()})
    assert sorted(store.staged()) == [2, 3]
    assert names[1][1] != names[1][2]  # steps 1 and 2 in different files
    # Restored at step 2 (step 3 was staged but never counted): step 3 again goes over
    # the old step 3, and step 2 stays until step 3 is whole.
    again = _store(tmp_path)
    found = again.staged()
    again.at(found[2])
    again.save(3, _state(30))
    after = again.staged()
    assert sorted(after) == [2, 3] and _equal(after[3].tensors(), _state(30))
    assert after[2].slot.path == found[2].slot.path


def test_a_restore_from_elsewhere_overwrites_the_older_slot_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for step in (4, 5):
        store.save(step, _state(step))
    fresh = _store(tmp_path)
    fresh.at(None)  # restored from a checkpoint
    fresh.save(6, _state(6))
    assert sorted(fresh.staged()) == [5, 6]


@pytest.mark.parametrize("damage", ["byte", "truncate", "header", "writing"])
def test_a_damaged_slot_is_never_taken(tmp_path: Path, damage: str) -> None:
    store = _store(tmp_path)
    store.save(1, _state(1))
    store.save(2, _state(2))
    path = next(s.slot.path for s in store.staged().values() if s.step == 2)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if damage == "byte":
            f.seek(size - 5)
            byte = f.read(1)
            f.seek(size - 5)
            f.write(bytes([byte[0] ^ 1]))
        elif damage == "truncate":
            f.truncate(size - 100)
        elif damage == "header":
            f.seek(20)  # inside the step field: the header's own checksum no longer fits
            f.write(b"\x01")
        else:
            f.write(b"\0" * 64)  # what a write begins with: no step
    assert sorted(_store(tmp_path).staged()) == [1]


def test_a_writer_killed_mid_write_never_leaves_a_torn_slot_that_looks_whole(
    tmp_path: Path,
) -> None:
    """A real process writing steps of 32 MiB in a loop, killed at random moments: the
    newest step it finished is always there, and every slot that reads as valid holds
    exactly the bytes of its step."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        from pathlib import Path
        from asyncrl.actors.training.staged_state import StagedState
        store = StagedState(Path({str(tmp_path)!r}), 0, {{"ranks": 1}})
        found = store.staged()
        step = max(found, default=0)
        store.at(found.get(step))
        while True:
            step += 1
            store.save(step, {{"param/w": torch.full((8 << 20,), float(step))}})
            print(step, flush=True)
        """
    )
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        finished = int(proc.stdout.readline())  # one step done: the kill lands in another
        time.sleep(0.01 + 0.03 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = max([finished, *(int(x) for x in proc.stdout.read().split())])
        found = _store(tmp_path).staged()
        assert max(found) >= finished
        for step, staged in found.items():
            assert torch.equal(staged.tensors()["param/w"], torch.full((8 << 20,), float(step)))


def test_a_slot_of_another_group_layout_is_ignored(tmp_path: Path) -> None:
    store = _store(tmp_path, ranks=2)
    store.save(3, _state(3))
    assert _store(tmp_path, ranks=1).staged() == {}
    assert list(_store(tmp_path, ranks=2).staged()) == [3]
    assert _store(tmp_path, rank=1, ranks=2).staged() == {}  # its own files: none yet


def test_a_slot_staged_under_another_split_of_the_model_is_ignored(tmp_path: Path) -> None:
    from asyncrl.actors.training.rank import staged_identity
    from asyncrl.runtime.contract.config import config_from_dict

    def identity(**megatron) -> dict:
        backends = {"train": "megatron", "megatron": megatron}
        cfg = {"backends": backends, "pipeline": {"workers": {"train": 2}}}
        return staged_identity(config_from_dict(cfg), 2)

    StagedState(tmp_path, 0, identity()).save(3, _state(3))
    assert list(StagedState(tmp_path, 0, identity()).staged()) == [3]
    for other in (
        identity(distributed_optimizer=False),  # the moments of every parameter, not a share
        identity(tensor_parallel=2),
        staged_identity(config_from_dict({}), 2),  # the torch engine's FSDP shards
    ):
        assert StagedState(tmp_path, 0, other).staged() == {}


def test_removing_at_the_end_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ranks = [_store(directory, rank, 2) for rank in (0, 1)]
    for store in ranks:
        store.save(1, _state(1))
    ranks[0].remove()
    assert directory.is_dir()  # rank 1's files still in it
    ranks[1].remove()
    assert not directory.exists()


def test_a_directory_others_can_open_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    with pytest.raises(PermissionError, match="not this user's alone"):
        _store(directory)


def test_no_room_says_how_much_was_needed(tmp_path: Path, monkeypatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "no space")

    monkeypatch.setattr(state_slot.os, "posix_fallocate", full)
    with pytest.raises(NoRoom, match=r"needs 1 MiB per slot .* MiB free"):
        _store(tmp_path).save(1, {"param/w": torch.zeros(1000)})


@pytest.mark.parametrize(
    ("target", "staged", "checkpoints", "expected"),
    [
        (7, {6, 7}, {3}, Choice(7, Source.STAGED)),  # the exact step, staged
        (7, {8, 9}, {7}, Choice(7, Source.CHECKPOINT)),  # staged ahead: never taken
        (7, {7}, {7}, Choice(7, Source.STAGED)),  # same step: memory before disk
        (7, {5, 6}, {3}, Choice(6, Source.STAGED)),  # none exact: the newest below
        (7, set(), {3, 6, 9}, Choice(6, Source.CHECKPOINT)),  # the newest checkpoint <= 7
        (7, set(), set(), Choice(0, Source.BASE)),
        (0, {1}, {1}, Choice(0, Source.BASE)),  # a fresh run: the base model
    ],
)
def test_the_state_to_resume_from(target, staged, checkpoints, expected) -> None:
    assert choose(target, staged, checkpoints) == expected
