"""Workers' measurements that belong to no lease, and what each step line takes from them.

A generator reports each validation pass (``validation``) and each weight load
(``weights``); each kind has its own JSON-lines file in the run directory, and the newest
report of each kind is merged into every line of ``metrics.jsonl``. Reports are
measurements, not pipeline state: they are not journaled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .metrics import plain

__all__ = ["ReportLog", "step_fields"]

_WEIGHTS_TIMES = ("transfer_s", "load_s", "stall_s")


class ReportLog:
    """One report kind's file, one line per report, the newest version's kept at hand.

    ``per_worker`` False: one line per version, whoever measured it (a validation pass);
    True: one per worker and version (each generator loads each version itself). A
    report seen before (sent again after a lost reply, or a restart) is not written twice.
    """

    def __init__(self, path: Path, *, per_worker: bool = False) -> None:
        self.path = path
        self.per_worker = per_worker
        self._seen: set[tuple[Any, int]] = set()
        self.latest: dict[str, Any] | None = None
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash
                if isinstance(record, dict) and type(record.get("version")) is int:
                    self._remember(record)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the service

    def record(self, version: int, line: dict[str, Any]) -> bool:
        """Append ``line`` for ``version``; False if it was reported already."""
        record = {"version": version, **line}
        if self._key(record) in self._seen:
            return False
        self._file.write(json.dumps(record, separators=(",", ":"), default=plain) + "\n")
        self._file.flush()
        self._remember(record)
        return True

    def _key(self, record: dict[str, Any]) -> tuple[Any, int]:
        return (record.get("worker") if self.per_worker else None, record["version"])

    def _remember(self, record: dict[str, Any]) -> None:
        self._seen.add(self._key(record))
        if self.latest is None or record["version"] >= self.latest["version"]:
            self.latest = record

    def close(self) -> None:
        self._file.close()


def step_fields(reports: Mapping[str, ReportLog]) -> dict[str, Any]:
    """What a step's metrics line takes from the newest report of each kind."""
    fields: dict[str, Any] = {}
    validation = reports.get("validation")
    if validation is not None and validation.latest is not None:
        fields.update(_validation_fields(validation.latest))
    weights = reports.get("weights")
    if weights is not None and weights.latest is not None:
        fields.update(_weights_fields(weights.latest))
    return fields


def _validation_fields(latest: dict[str, Any]) -> dict[str, Any]:
    """``val_reward`` (mean@k) of the newest validation and its version; with k > 1 its
    pass@k, and with several data sources each one's figures (``val_by_source``)."""
    fields: dict[str, Any] = {
        "val_reward": latest.get("val_reward"),
        "val_version": latest["version"],
    }
    ks = latest.get("val_pass_ks")
    top = f"pass@{ks[-1]}" if isinstance(ks, list) and ks and ks[-1] > 1 else None
    if top is not None and _number(latest.get(f"val_{top}")):
        fields[f"val_{top}"] = latest[f"val_{top}"]
    by_source = latest.get("val_by_source")
    if isinstance(by_source, dict) and (len(by_source) > 1 or top is not None):
        fields["val_by_source"] = {
            name: {key: figures[key] for key in ("reward", top) if key and key in figures}
            for name, figures in by_source.items()
            if isinstance(figures, dict)
        }
    return fields


def _weights_fields(latest: dict[str, Any]) -> dict[str, Any]:
    """``weights_*`` from a weight-load report: whichever of the times it carries, and the
    transfer rate in MB/s (10^6 bytes) when it says how many bytes moved in how long."""
    fields: dict[str, Any] = {"weights_version": latest["version"]}
    for name in _WEIGHTS_TIMES:
        if _number(latest.get(name)):
            fields[f"weights_{name}"] = latest[name]
    nbytes, seconds = latest.get("bytes"), latest.get("transfer_s")
    if _number(nbytes) and _number(seconds) and seconds > 0:
        fields["weights_mb_per_s"] = round(nbytes / seconds / 1e6, 3)
    return fields


def _number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)
