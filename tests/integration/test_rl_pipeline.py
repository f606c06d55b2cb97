"""The RL roles end to end on the in-process scheduler, with a tiny random model.

These check the plumbing (every role's payload reaches the trainer, versions are
published and loaded, validation is reported, checkpoints are written in Hugging Face
format), not learning: the default run's learning is what README command 1 shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.actors.roles import ROLES
from asyncrl.runtime.contract.config import RunConfig, config_from_dict, pipeline_for
from tests.integration.test_inprocess_pipeline import run_pipeline
from tests.support.models import tiny_model

pytestmark = pytest.mark.timeout(120)

STEPS = 4


def rl_config(
    tmp_path: Path,
    weights: dict[str, Any] | None = None,
    algorithm: dict[str, Any] | None = None,
    **data: Any,
) -> RunConfig:
    return config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run"), "total_steps": STEPS},
            "data": {"group_size": 4, "val_every_versions": 2, "val_prompts": 4, **data},
            "model": {"path": str(tiny_model(tmp_path / "model")), "max_new_tokens": 12},
            "algorithm": {
                "lr": 1e-3,
                "micro_batch_groups": 1,
                "kl_coef": 0.01,
                **(algorithm or {}),
            },
            "pipeline": {"train_batch_groups": 2, "checkpoint_every": 2, "max_attempts": 2},
            "scheduler": {"heartbeat_interval_s": 0.2},
            "weights": weights or {},
        }
    )


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(cfg: RunConfig) -> dict[str, Any]:
    # Real models in six threads of one process: slower than the demo's arithmetic.
    roles = pipeline_for(cfg).worker_roles  # the roles this config runs (no harness)
    return run_pipeline(cfg, [ROLES[role]() for role in roles], timeout_s=90.0)


def test_the_rl_roles_train_publish_validate_and_checkpoint(tmp_path: Path) -> None:
    # logp scores every group: the generator's log-probs are compared, not reused.
    cfg = rl_config(tmp_path, algorithm={"proximal_logp": "recompute"})
    status = run(cfg)
    assert status["run"]["finished"] and status["dead"] == {}
    run_dir = Path(cfg.run.dir)
    steps = lines(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for s in steps:
        assert 0.0 <= s["reward_mean"] <= 1.0
        assert 0 <= s["staleness_max"] <= cfg.pipeline.max_staleness
        assert s["kl_ref"] >= 0 and 0 <= s["clip_frac"] <= 1
    # Behaviour and proximal log-probs of one version agree. A step whose groups logp scored
    # under another version than generated them has no token to compare (timing decides).
    measured = [s for s in steps if s["logprob_mismatch_tokens"]]
    assert measured and max(s["logprob_mismatch_max"] for s in measured) < 1e-4
    assert all(0 <= s["logprob_mismatch_kl"] < 1e-8 for s in measured)
    validated = [v["version"] for v in lines(run_dir / "validation.jsonl")]
    assert validated[0] == 0 and validated == sorted(set(validated))
    assert steps[-1]["val_version"] in validated  # step lines carry a reported validation
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step-0000002", "step-0000004"]
    transformers = pytest.importorskip("transformers")
    transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final")


def test_the_trainer_reads_the_proximal_logprobs_from_its_own_forward_pass(
    tmp_path: Path,
) -> None:
    cfg = rl_config(tmp_path, algorithm={"proximal_logp": "trainer"})
    assert "logp" not in pipeline_for(cfg).worker_roles  # no worker scores the groups
    status = run(cfg)
    assert status["run"]["finished"] and status["dead"] == {}
    steps = lines(Path(cfg.run.dir) / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for s in steps:
        # One update from the weights the proximal log-probs were read with: its ratio is
        # exactly 1, so nothing is clipped; the behaviour's distance is still weighed.
        assert s["clip_frac"] == 0.0 and s["updates"] == 1
        assert s["offpolicy_weight_mean"] > 0 and s["offpolicy_weight_max"] <= 5.0
        assert s["logprob_mismatch_tokens"] == 0  # measured only where logp scores


def test_no_validation_with_val_every_versions_zero(tmp_path: Path) -> None:
    cfg = rl_config(tmp_path, val_every_versions=0)
    status = run(cfg)
    assert status["run"]["finished"] and status["dead"] == {}
    run_dir = Path(cfg.run.dir)
    assert len(lines(run_dir / "metrics.jsonl")) == STEPS
    assert not (run_dir / "validation.jsonl").exists() or not lines(run_dir / "validation.jsonl")
    assert all("val_reward" not in s for s in lines(run_dir / "metrics.jsonl"))


def test_generate_and_logp_run_on_weights_mapped_from_shared_memory(tmp_path: Path) -> None:
    shm_dir = tmp_path / "shm"
    cfg = rl_config(tmp_path, weights={"strategy": "shm", "shm_dir": str(shm_dir)})
    status = run(cfg)
    assert status["run"]["finished"] and status["dead"] == {}
    run_dir = Path(cfg.run.dir)
    assert len(lines(run_dir / "metrics.jsonl")) == STEPS
    loads = lines(run_dir / "weights.jsonl")
    assert {x["worker"] for x in loads} == {"generate-0", "logp-0"}
    assert all(x["source"] == "mapped" and x["attempts"] == 1 for x in loads)
    assert not list(shm_dir.glob("*.weights"))  # the trainer removed its files on the way out


def test_a_reward_plug_in_that_fails_kills_only_its_groups(tmp_path: Path) -> None:
    cfg = rl_config(tmp_path, task="tests.support.tasks:misbehaving")
    status = run(cfg)
    assert status["run"]["finished"]  # the run went on around the bad groups
    reasons = status["dead"]
    assert reasons, "some sums end in 3 or 7"
    text = " ".join(reasons)
    assert "ZeroDivisionError" in text or "not a number" in text
    assert "tests.support.tasks:misbehaving" in text


def test_a_reward_plug_in_by_import_path_replaces_the_tasks(tmp_path: Path) -> None:
    cfg = rl_config(tmp_path, reward="tests.support.tasks:raising_reward")
    status = run(cfg)
    assert status["run"]["finished"]
    text = " ".join(status["dead"])
    assert "reward 'tests.support.tasks:raising_reward' raised KeyError" in text
