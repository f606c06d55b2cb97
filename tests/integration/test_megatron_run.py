"""``asyncrl run`` with ``backends.train=megatron`` on CPU: megatron-core's GPTModel trains,
and scores as logp (every group recomputed) and ref_logp (a KL penalty on).

Alone in bfloat16, and in float32 with the trainer and logp as groups of two ranks that
split the model by tensor parallelism, or into two pipeline stages. The generator is
the torch engine; its log-probs and megatron's for tokens of the same version must agree
(in float32 up to rounding), which checks that each version the megatron trainer
publishes is the model logp loads.
The final model is a Hugging Face directory that the torch engine loads. A stopped
trainer group resumes from what it staged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.training.resume import TRAINER_STATE
from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.rundir import RunDir

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.timeout(240)

DEFAULT = Path(__file__).parents[2] / "deploy" / "configs" / "default.yaml"


# The trainer (and logp) as groups of 2 ranks, each holding one copy of the model between
# them.
TRAINER_GROUP = ["pipeline.workers.train=2", "backends.megatron.tensor_parallel=2"]
GROUP = [*TRAINER_GROUP, "pipeline.workers.logp=2"]
STAGES = [
    "pipeline.workers.train=2",
    "pipeline.workers.logp=2",
    "backends.megatron.pipeline_parallel=2",
]
# bfloat16: scorers and generator in bfloat16, the trainer in its float32 master weights
# (on CPU megatron does not autocast); the engines' bfloat16 roundings differ.
BF16 = ["model.dtype=bfloat16"]


# Alone in bfloat16, and in groups in float32: each path once, the suite kept short. The
# groups run with the heavy tests (20-23 s each).
@pytest.mark.parametrize(
    "group",
    [
        pytest.param(BF16, id="one-rank-bfloat16"),
        pytest.param(GROUP, id="groups-float32", marks=pytest.mark.heavy),
        pytest.param(STAGES, id="pipeline-stages-float32", marks=pytest.mark.heavy),
    ],
)
def test_a_short_run_trains_with_megatron_and_writes_a_loadable_final_model(
    tmp_path: Path, group: list[str]
) -> None:
    dtype = torch.bfloat16 if group == BF16 else torch.float32
    run_dir, steps = _two_steps(tmp_path, group)
    assert all(
        s["logprob_mismatch_mean"] < (1e-4 if dtype == torch.float32 else 1e-2) for s in steps
    )
    final, _ = load_model(str(run_dir / "final"), dtype)
    base, _ = load_model("embedded", dtype)
    moved = max(
        float((a - b).abs().max())
        for a, b in zip(final.parameters(), base.parameters(), strict=True)
    )
    assert 0 < moved < 1.0
    assert final.lm_head.weight.dtype == dtype
    checkpoint = RunDir.of(load_config(run_dir / "config.yaml")).checkpoint(2)
    saved = torch.load(checkpoint / TRAINER_STATE, weights_only=True)
    assert set(saved["optimizer"]["state"]) >= {"model.layers.0.self_attn.q_proj.weight"}


def _two_steps(tmp_path: Path, overrides: list[str]) -> tuple[Path, list[dict]]:
    """``asyncrl run`` of 2 steps with megatron training and scoring (every group
    rescored, ref_logp for a KL penalty, a checkpoint after each step, which gathers the
    optimizer state too): the run directory and its steps, each checked to have trained."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(DEFAULT)]
    argv += [f"run.dir={run_dir}", "run.total_steps=2", "backends.train=megatron", *overrides]
    argv += ["pipeline.checkpoint_every=1"]
    argv += ["algorithm.proximal_logp=recompute", "algorithm.kl_coef=0.01"]
    argv += ["data.val_every_versions=0", "weights.strategy=shm"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["grad_norm"] > 0 for s in steps)
    assert set(steps[0]["roles"]) >= {"logp", "ref_logp", "train"}
    assert all(s["logprob_mismatch_tokens"] > 0 for s in steps)
    return run_dir, steps


@pytest.mark.parametrize(
    "split",
    [
        # With the heavy tests (30 s): a stopped group's resume, as the torch group's
        # test in the default suite takes it.
        pytest.param(TRAINER_GROUP, id="tensor-parallel", marks=pytest.mark.heavy),
        # Slow (40 s): the tensor- and expert-parallel groups take the same resume path in
        # every run of the suite; this one adds which layers each rank stages.
        pytest.param(
            ["pipeline.workers.train=2", "backends.megatron.pipeline_parallel=2"],
            id="pipeline-stages",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_megatron_trainer_group_stopped_resumes_from_its_staged_state(
    tmp_path: Path, split: list[str]
) -> None:
    """Ctrl-C after a few steps, then ``--resume``: every rank takes up its staged part
    (megatron's parameter names, AdamW's state; a stage's own layers) and the run goes on
    from its count."""
    _stopped_and_resumed(tmp_path, split)


@pytest.mark.heavy  # 40 s; the tensor-parallel group's resume runs by default
def test_an_expert_parallel_trainer_group_stopped_resumes_from_its_staged_state(
    tmp_path: Path,
) -> None:
    """As above for a tiny Qwen3-MoE over 2 expert-parallel ranks: each rank's staged part
    holds its own block of the experts."""
    from tests.support.hf_families import tiny_task_model

    model_dir = tiny_task_model(tmp_path / "moe", "qwen3_moe")
    split = ["pipeline.workers.train=2", "backends.megatron.expert_parallel=2"]
    split += [f"model.path={model_dir}", "model.max_new_tokens=16", "data.group_size=4"]
    _stopped_and_resumed(tmp_path, split)


def _stopped_and_resumed(tmp_path: Path, split: list[str]) -> None:
    import signal
    import time

    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(DEFAULT)]
    argv += [f"run.dir={run_dir}", "backends.train=megatron", *split]
    argv += ["data.val_every_versions=0", "weights.strategy=shm"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0"]
    metrics = run_dir / "metrics.jsonl"
    log = (tmp_path / "first.log").open("wb")
    first = subprocess.Popen([*argv, "run.total_steps=100"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and (
            not metrics.is_file() or len(metrics.read_text().splitlines()) < 2
        ):
            time.sleep(0.5)
        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 130
    finally:
        if first.poll() is None:
            first.kill()
    done = len(metrics.read_text().splitlines())
    assert done >= 2
    again = subprocess.run(
        [*argv, f"run.total_steps={done + 2}", "--resume"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    steps = [json.loads(line) for line in metrics.open()]
    assert [s["step"] for s in steps] == list(range(1, done + 3))
    restored = [
        json.loads(line)
        for line in (run_dir / "logs" / "train-0.log").read_text().splitlines()
        if '"trainer state restored"' in line
    ]
    assert restored[-1]["step"] == done and restored[-1]["source"] == "staged"


@pytest.mark.parametrize(
    "split",
    [
        # Slow (17 s): on CPU the engine computes in float32 whatever model.dtype says, and
        # the dense one-rank run above takes the same bfloat16 plumbing; on a GPU it is
        # tests/gpu/test_megatron.py's Qwen3-MoE run.
        pytest.param(BF16, id="one-rank-bfloat16", marks=pytest.mark.slow),
        pytest.param(  # with the heavy tests (19 s), as the expert-parallel group's resume
            [
                "pipeline.workers.train=2",
                "pipeline.workers.logp=2",
                "backends.megatron.expert_parallel=2",
            ],
            id="expert-parallel-groups-float32",
            marks=pytest.mark.heavy,
        ),
    ],
)
def test_a_short_run_trains_a_mixture_of_experts_with_megatron(
    tmp_path: Path, split: list[str]
) -> None:
    """A tiny Qwen3-MoE: megatron's MoE layer trains and scores (logp recomputes every
    group, ref_logp for a KL penalty), alone in bfloat16 or in float32 with the trainer and
    logp as groups of two expert-parallel ranks (2 of the 4 experts each); its log-probs
    agree with the torch generator's, and the final model loads in transformers as a
    Qwen3-MoE."""
    transformers = pytest.importorskip("transformers")
    from tests.support.hf_families import tiny_task_model

    model_dir = tiny_task_model(tmp_path / "moe", "qwen3_moe")
    small = ["model.max_new_tokens=16", "data.group_size=4", "pipeline.train_batch_groups=2"]
    task = ["data.reward=tests.support.tasks:digits_reward"]
    run_dir, steps = _two_steps(tmp_path, [f"model.path={model_dir}", *small, *task, *split])
    tolerance = 1e-2 if split == BF16 else 1e-4  # the engines' bfloat16 roundings differ
    assert all(s["logprob_mismatch_mean"] < tolerance for s in steps)
    final = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final")
    assert type(final).__name__ == "Qwen3MoeForCausalLM"
    # By the checkpoint's names (transformers 5 fuses the experts it loads).
    trained = load_model(str(run_dir / "final"))[0].state_dict()
    before = load_model(str(model_dir))[0].state_dict()
    for name in ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.3.up_proj.weight"):
        assert not torch.equal(before[name], trained[name]), name
    # A checkpoint gathers AdamW's moments of every expert, whichever rank held it.
    checkpoint = RunDir.of(load_config(run_dir / "config.yaml")).checkpoint(2)
    saved = torch.load(checkpoint / TRAINER_STATE, weights_only=True)
    assert set(saved["optimizer"]["state"]) >= {
        f"model.layers.{i}.mlp.experts.{e}.down_proj.weight" for i in (0, 1) for e in range(4)
    }
