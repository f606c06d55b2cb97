"""A model's skeleton (checks before anything loads): the model's own parameters and
shapes on the meta device, built without what makes a process start slowly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.skeleton import skeleton
from tests.support.hf_families import SMALL, TASK_MODEL_KINDS, VARIANTS

transformers = pytest.importorskip("transformers")

# name -> (model_type, config fields beyond SMALL)
FAMILIES = VARIANTS | {
    model_type: (model_type, fields) for model_type, (_, fields) in TASK_MODEL_KINDS.items()
}


def _config(name: str) -> dict:
    """config.json's fields, as a saved model of the family has them."""
    model_type, fields = FAMILIES[name]
    config = transformers.AutoConfig.for_model(model_type, **(SMALL | fields))
    architecture = transformers.AutoModelForCausalLM.from_config(config).__class__.__name__
    return config.to_dict() | {"architectures": [architecture]}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_skeleton_has_the_model_s_parameters_and_shapes_and_no_memory(name: str) -> None:
    config = ModelConfig.from_hf(_config(name))
    bones = skeleton(config)
    built = CausalLM(config)
    assert [(n, p.shape) for n, p in bones.named_parameters()] == [
        (n, p.shape) for n, p in built.named_parameters()
    ]
    assert {p.device.type for p in bones.parameters()} == {"meta"}
    assert {b.device.type for b in bones.buffers()} == {"meta"}
    # The model built as before is unchanged: its frequencies where the model is.
    assert built.rotary.inv_freq.device.type == "cpu"


def test_making_a_skeleton_imports_neither_dynamo_nor_the_distributed_packages() -> None:
    """Every worker checks its model directory as it starts: torch's reference kernels on
    the meta device would import torch._dynamo, sympy and torch.distributed's tensor
    packages there, about a second of CPU per process. (A fresh interpreter: this one has
    imported them already.)"""
    configs = json.dumps({name: _config(name) for name in FAMILIES})
    code = (
        "import json, sys\n"
        "from asyncrl.actors.policy.model import ModelConfig\n"
        "from asyncrl.actors.policy.skeleton import skeleton\n"
        f"for raw in json.loads({configs!r}).values():\n"
        "    skeleton(ModelConfig.from_hf(raw))\n"
        "heavy = ('torch._dynamo', 'sympy', 'torch.distributed.tensor')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
