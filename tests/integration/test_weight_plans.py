"""Weight plans over the in-process bus: the trainer announces, two generators ask whom
to fetch each version from, and report what the loads cost."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.actors.actor import WorkerContext
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.transport import protocol as p
from asyncrl.transport.weights.base import Announcement, WeightsPlan
from tests.support.demo_pipeline import Generate, Train

from .test_inprocess_pipeline import BATCH, STEPS, check_every_value, demo_actors, run_pipeline


class AnnouncingTrain(Train):
    def on_publish(self, version: int) -> Announcement:
        return Announcement(version, {"version": version, "buckets": [[0, 8]]}, b"@train")


class PlannedGenerate(Generate):
    """Asks for a plan for each new version before "loading" it, and reports the load."""

    def __init__(self, address: bytes) -> None:
        super().__init__()
        self.address = address
        self.plans: dict[int, WeightsPlan] = {}
        self._reports: list[p.Report] = []
        self._ctx: WorkerContext | None = None

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self._ctx = ctx

    def on_version(self, version: int) -> int | None:
        if version == 0:
            return super().on_version(0)  # the base model: nothing to fetch
        assert self._ctx is not None and self._ctx.ask_weights is not None
        plan = self._ctx.ask_weights(0, self.address, "")  # the newest held
        if plan is None:
            return None
        assert plan.manifest == {"version": plan.version, "buckets": [[0, 8]]}
        self.plans[plan.version] = plan
        data = {"transfer_s": 0.01, "load_s": 0.002, "bytes": 8_000_000, "source": plan.source}
        self._reports.append(p.Report(self._ctx.worker, "weights", plan.version, data))
        return super().on_version(plan.version)

    def take_reports(self) -> list[p.Report]:
        reports, self._reports = self._reports, []
        return reports


def test_generators_get_plans_through_a_relay_tree_and_report_their_loads(
    tmp_path: Path,
) -> None:
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run"), "total_steps": STEPS},
            "pipeline": {"train_batch_groups": BATCH, "lease_timeout_s": 10.0},
            "algorithm": {"kl_coef": 0.01},  # the demo runs every stage, ref_logp included
            "scheduler": {"heartbeat_interval_s": 0.2},
            "weights": {"relay_fanout": 1},
        }
    )
    a, b = PlannedGenerate(b"@a"), PlannedGenerate(b"@b")
    actors = demo_actors(a, b, AnnouncingTrain(), replace=("generate", "train"))
    run_pipeline(cfg, actors)
    check_every_value(cfg)
    gens = {"generate-0": a, "generate-1": b}  # named in the order given, per role
    addresses = {"train-0": b"@train", "generate-0": b"@a", "generate-1": b"@b"}
    # The last version is published as the run ends: one generator may ask for it after
    # the other has left (and so left the tree), and get the trainer as its source too.
    both = (set(a.plans) & set(b.plans)) - {STEPS}
    assert both, "the two generators never fetched the same version before the last"
    for version in both:
        # Fan-out 1: whoever asked first pulls from the trainer, the other from it.
        sources = {name: g.plans[version].source for name, g in gens.items()}
        first = next(name for name, source in sources.items() if source == "train-0")
        second = next(name for name in gens if name != first)
        assert sources[second] == first
        for g in gens.values():
            assert g.plans[version].source_address == addresses[g.plans[version].source]
    run = Path(cfg.run.dir)
    loads = [json.loads(x) for x in (run / "weights.jsonl").read_text().splitlines()]
    reported = [(x["worker"], x["version"]) for x in loads]
    assert reported and len(reported) == len(set(reported))
    assert all(version in gens[worker].plans for worker, version in reported)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == STEPS
    merged = [s for s in steps if "weights_version" in s]
    assert merged and all(s["weights_mb_per_s"] == 800.0 for s in merged)
    assert all(s["weights_transfer_s"] == 0.01 and s["weights_load_s"] == 0.002 for s in merged)
