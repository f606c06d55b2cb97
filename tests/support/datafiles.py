"""Small data files in verl's layout, written the way verl's preprocessing writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.actors.tasks.arithmetic import task as arithmetic


def addition_rows(split: str, count: int) -> list[dict[str, Any]]:
    """The embedded task's sums as chat prompts with their sums as ground truths."""
    rows = []
    for index in range(count):
        sample = arithmetic.sample(split, index)
        rows.append(
            {
                "data_source": "addition",
                "prompt": [{"role": "user", "content": sample.prompt}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": sample.answer},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as JSON lines or Parquet, by ``path``'s suffix."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
