"""Why a run makes no progress, read from the core's state (starvation.py), and the
service's warning when no step has come for a while."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.effects import Grant
from asyncrl.runtime.scheduler.core.starvation import why_no_step
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.transport import protocol as p


def core_with(workers: dict[str, str], **settings: object) -> SchedulerCore:
    core = SchedulerCore(CoreSettings(**{"train_batch_groups": 2, **settings}))
    for name, role in workers.items():
        core.register(name, role, 0.0)
    return core


def why(core: SchedulerCore) -> str:
    return why_no_step(core.state, core.settings, core.pipeline)


def test_generated_groups_waiting_for_a_role_nobody_serves_name_that_role() -> None:
    core = core_with({"gen": "generate", "ref": "ref_logp", "rw": "reward", "tr": "train"})
    core.add_groups(["a", "b"])
    core.loaded_version("gen", 0)
    lease = core.claim("generate", "gen", 2, 0.0)
    assert isinstance(lease, Grant)
    core.complete(lease.lease_id, lease.fence, list(lease.groups), [(0, 0), (0, 0)])
    said = why(core)
    assert said.startswith("0 groups ready of 2")
    assert "2 waiting for logp, no logp worker registered" in said
    assert "2 waiting for ref_logp (1 workers, 0 leases out)" in said


def test_a_generator_without_a_loaded_version_and_the_staleness_bound_are_named() -> None:
    core = core_with({"gen": "generate"}, max_staleness=0, train_batch_groups=1)
    core.add_groups(["a", "b"])
    assert "2 waiting for generate, no generate worker has reported a loaded version" in why(core)
    core.loaded_version("gen", 0)
    assert isinstance(core.claim("generate", "gen", 1, 0.0), Grant)
    said = why(core)
    assert "1 waiting for generate: generate refused by the staleness bound" in said
    assert "max_staleness 0" in said


def test_an_empty_run_without_a_dataloader_says_so() -> None:
    said = why(core_with({}))
    assert said == "0 groups ready of 2; no groups and no dataloader worker registered"


def test_the_service_warns_once_a_minute_while_no_step_comes(tmp_path: Path) -> None:
    cfg = config_from_dict({"run": {"dir": str(tmp_path / "run"), "total_steps": 2}})
    service = open_service(cfg, resume=False, now=0.0)
    service.handle(p.Hello("lp", "logp", p.PROTOCOL_VERSION, 1), 0.0)
    try:
        with capture_logs() as logs:
            for now in (30.0, 61.0, 90.0, 122.0):
                service.tick(now)
    finally:
        service.durable.close()
        service.close_files()
    warned = [e["event"] for e in logs if e["event"].startswith("no train step")]
    assert warned == [
        "no train step for 61 s: 0 groups ready of 8; no groups and no dataloader worker "
        "registered",
        "no train step for 122 s: 0 groups ready of 8; no groups and no dataloader worker "
        "registered",
    ]
