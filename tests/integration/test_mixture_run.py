"""A mixture of two training files weighted 3:1 (``data.train_weights``) with real
processes: the real dataloader drawing from the files, the demo pipeline's other roles
taking its groups on, a scheduler journaling every group it is offered. The dataloader
is killed with SIGKILL once it has drawn what the backlog holds; the one started after
it offers keys from 0 again, and the groups of the whole run, read from the journal,
must be the draw of the order's pure function, index by index, and 3:1 to within one
prompt in every run of them (docs/pages/guides/data.md states the tolerance)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from asyncrl.actors.workload import load_workload
from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.core import journal_records as r
from asyncrl.runtime.scheduler.journal import replay
from asyncrl.transport import protocol as p
from tests.support.cluster import Cluster, wait_for
from tests.support.datafiles import addition_rows, write_rows

# A dataloader killed with kill -9 mid-run: chaos with real processes, CI's heavy stage.
pytestmark = [pytest.mark.heavy, pytest.mark.timeout(120)]

STEPS, BATCH, STALENESS = 11, 100, 2  # 1,100 prompts; 400 wait to be generated at most


def rows_of(source: str, count: int, offset: int) -> list[dict[str, Any]]:
    rows = addition_rows("train", offset + count)[offset:]
    for row in rows:
        row["data_source"] = source
    return rows


def drawn(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every group the scheduler was offered, by index: its dataloader payload."""
    found = replay(RunDir(run_dir).journal)
    assert found.snapshot is None, "a snapshot would hide the first groups' records"
    groups: dict[int, dict[str, Any]] = {}
    for added in (x for x in map(r.from_journal, found.records) if isinstance(x, r.Added)):
        for key, blob in zip(added.keys, added.data or (), strict=True):
            payload = p.unpack_payload(blob) if isinstance(blob, bytes) else blob
            assert key not in groups and key == f"train-{payload['index']:09d}"
            groups[payload["index"]] = payload
    return groups


def test_a_3_to_1_mixture_is_drawn_exactly_across_a_killed_dataloader(
    cluster, tmp_path: Path
) -> None:
    many = write_rows(tmp_path / "many.jsonl", rows_of("many", 90, 0))
    few = write_rows(tmp_path / "few.parquet", rows_of("few", 30, 90))
    c: Cluster = cluster(
        run={"total_steps": STEPS},
        pipeline={
            "actors": "tests.support.mixture_roles",
            "train_batch_groups": BATCH,
            "max_staleness": STALENESS,
        },
        scheduler={"snapshot_every": 1_000_000},
        payloads={"inline_bytes": 1 << 20},
        data={
            "train_files": [str(many), str(few)],
            "train_weights": {str(many): 3.0, str(few): 1.0},
            "val_every_versions": 0,
        },
    )
    c.scheduler()
    c.worker("dataloader")
    backlog = BATCH * (STALENESS + 2)
    wait_for(lambda: c.status()["groups"].get("pending", 0) >= backlog, 60, "a full backlog")
    c.signal("dataloader-0", signal.SIGKILL)
    c.wait("dataloader-0", 10)
    before = drawn(c.run_dir)
    assert len(before) == backlog  # mid-way: the run needs STEPS * BATCH

    for role in ("generate", "logp", "ref_logp", "reward", "train"):
        c.worker(role)
    c.worker("dataloader")  # offers keys from 0 again; the scheduler skips what it holds
    assert c.wait("scheduler", 90) == 0, c.log_text("scheduler")[-3000:]

    groups = drawn(c.run_dir)
    assert sorted(groups) == list(range(STEPS * BATCH))
    task = load_workload(load_config(c.config_path))
    for index, payload in groups.items():  # the pure function's draw, index by index
        sample = task.sample("train", index)
        assert (payload["data_source"], payload["prompt"]) == (sample.data_source, sample.prompt)
    assert {i: groups[i] for i in before} == before
    sources = [groups[i]["data_source"] for i in range(STEPS * BATCH)]
    assert sources[:1000].count("many") == 750 and sources[:1000].count("few") == 250
    for start in range(0, len(sources) - 100):  # any 100 in a row: 75 and 25
        assert sources[start : start + 100].count("few") == 25
    steps = [line["step"] for line in c.metrics()]
    assert steps == list(range(1, STEPS + 1))
