"""``asyncrl run`` of deploy/configs/lora.yaml (real processes): the trainer trains
adapters on the frozen embedded model, every version that reaches the generator is the
adapters alone (its bytes are theirs), the generator and logp merge them, the run
learns, and ``final/`` loads with peft onto the base and as a merged model in
transformers, with the logits of the trainer's model at the last step.

The whole run (300 steps, validation to 0.8 or more) is ``slow``; the default suite runs
30 steps of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model, model_dir
from asyncrl.actors.policy.lora import FINAL_ADAPTER, add_adapters, read_adapters, trainer_name
from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.rundir import RunDir

pytest.importorskip("peft")
pytestmark = pytest.mark.timeout(600)

_CONFIG = "deploy/configs/lora.yaml"


def _run(run_dir: Path, *overrides: str, timeout: float) -> None:
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", _CONFIG]
    argv += [f"run.dir={run_dir}", "scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run([*argv, *overrides], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trainers_logits(run_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    """The trainer's model at the run's last step: the base with the adapters of the last
    checkpoint (written after the last step) in peft's layers, not merged."""
    cfg = load_config(run_dir / "config.yaml")
    model, _ = load_model(cfg.model.path)
    add_adapters(model, cfg.model.lora)
    last = RunDir(run_dir).latest_checkpoint()
    assert last is not None
    adapters = {trainer_name(n): t for n, t in read_adapters(last).items()}
    missing, unexpected = model.load_state_dict(adapters, strict=False)
    assert not unexpected and not [n for n in missing if ".lora_" in n]
    model.eval()
    with torch.no_grad():
        return model(tokens)


def _check_versions_are_adapters(run_dir: Path) -> None:
    adapters = read_adapters(RunDir(run_dir).latest_checkpoint())
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapters.values())
    base_bytes = sum(t.numel() * 4 for t in load_model("embedded")[0].parameters())
    loads = _lines(run_dir / "weights.jsonl")
    assert {(w["worker"].split("-")[0], w["bytes"]) for w in loads} <= {
        ("generate", adapter_bytes),
        ("logp", adapter_bytes),
    }, loads[:2]
    assert adapter_bytes < base_bytes / 4  # rank 16 on every linear of a 0.8M model


def _check_final_loads(run_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from peft import PeftModel

    final = RunDir(run_dir).final_model
    tokens = torch.tensor([[3, 7, 11, 4, 9, 2, 5, 8, 13, 6]])
    expected = _trainers_logits(run_dir, tokens)
    auto = transformers.AutoModelForCausalLM
    merged = auto.from_pretrained(final).eval()
    base = auto.from_pretrained(model_dir("embedded"))
    adapted = PeftModel.from_pretrained(base, final / FINAL_ADAPTER).eval()
    with torch.no_grad():
        for model in (merged, adapted):
            torch.testing.assert_close(model(tokens).logits, expected, rtol=0, atol=1e-4)


# With the heavy tests (20 s), to keep the default suite under its time; adapters and
# their versions have unit tests in the default suite (test_lora.py, test_lora_versions.py).
@pytest.mark.heavy
def test_a_short_lora_run_publishes_adapters_learns_and_leaves_a_loadable_final(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, "run.total_steps=30", timeout=500)
    steps = _lines(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, 31))
    _check_versions_are_adapters(run_dir)
    validations = {v["version"]: v["val_reward"] for v in _lines(run_dir / "validation.jsonl")}
    assert validations[0] < 0.6
    assert max(validations.values()) >= 0.7, validations  # learning, 30 steps in
    _check_final_loads(run_dir)


@pytest.mark.slow
def test_the_lora_run_reaches_validation_reward_0_8(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, timeout=580)
    validations = [v["val_reward"] for v in _lines(run_dir / "validation.jsonl")]
    assert validations[0] < 0.6
    assert validations[-1] >= 0.8, validations[-3:]
    _check_final_loads(run_dir)
