"""Roles that do no tensor work import neither torch nor transformers.

``ROLES`` imports a role's module only when that role is asked for, and the modules of
the dataloader, the reward role (with a rule-based reward) and the harness role reach
the model's files (tokenizer, chat template) through torch-free modules. Checked in a
fresh interpreter, after the work such a worker does at start and per group.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.actors.roles import ROLES

_AFTER_WORK = """
import json, sys
from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.worker.preflight import load_actor_class
from asyncrl.actors.workload import load_workload, reward_for
from asyncrl.runtime.contract.config import RunConfig

cfg = RunConfig()
for role in ("dataloader", "reward", "harness"):
    load_actor_class(cfg.pipeline.actors, role).check(cfg)
task = load_workload(cfg)
sample = task.sample("train", 0)
codec = TextCodec.from_dir(model_dir(cfg.model.path))
reward_for(cfg).score_all(sample, [codec.decode(codec.encode(sample.answer))])
heavy = ("torch", "transformers", "safetensors")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def test_the_light_roles_import_no_torch_at_start_nor_at_work() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _AFTER_WORK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_is_found_under_its_own_name(role: str) -> None:
    assert ROLES[role].role == role
    assert ROLES[role] is ROLES[role]
