"""What a process imports as it starts: on two cores, every worker of a run imports at
once, and what none of them uses is seconds before the first step.

Each check runs a fresh interpreter (this one has imported everything by now).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# torch's FSDP, DTensor and distributed checkpoint packages (and the sympy and
# torch._dynamo they bring): only a group of ranks uses them, and an optimizer's
# construction (a trainer's) imports torch._dynamo by itself.
GROUPS_ONLY = (
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch._dynamo",
    "sympy",
)
ROLES = ("critic", "dataloader", "generate", "logp", "ref_logp", "reward", "train", "values")


def _imported(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [name for name in done.stdout.strip().split(",") if name]


@pytest.mark.parametrize("role", ROLES)
def test_a_role_s_module_imports_nothing_only_groups_use(role: str) -> None:
    assert _imported(f"import asyncrl.actors.roles.{role}", GROUPS_ONLY) == []


def test_the_launcher_imports_no_torch_to_start_a_run_or_to_sweep_after_it() -> None:
    """Its preflight and workers import torch; the launcher itself only reads slot files'
    owners (``asyncrl clean``) and sweeps the weight directories a run left."""
    code = (
        "import asyncrl.runtime.launch.cli.main\n"
        "from asyncrl.transport.weights import WeightDirs\n"
        "from asyncrl.transport.weights.shm import ram_directory, sweep\n"
    )
    assert _imported(code, ("torch",)) == []
