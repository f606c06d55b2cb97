"""``asyncrl run`` of PPO (algorithm.estimator=gae, real processes) with the critic as a
group of 2 ranks (its value model sharded with FSDP2 over gloo, rank 0 leading): every
policy step completes once, the critic steps as one group whose weights move, its values
workers load the versions the group staged (each rank's shard, joined) or, without a
values stage, the group makes the values in its step, and checkpoints of the critic land
in ``critic/`` as value models.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.actors.critic import load_value_model
from asyncrl.runtime.contract.rundir import RunDir
from tests.support import default_run

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

_STEPS, _BATCH, _EVERY = 6, 4, 2


@pytest.mark.parametrize("values", ["stage", "step"])
def test_a_critic_group_of_two_ranks_trains_beside_the_policy(tmp_path: Path, values: str) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = default_run.start_ppo(
        run_dir,
        log,
        _STEPS,
        _BATCH,
        "pipeline.workers.critic=2",
        f"pipeline.checkpoint_every={_EVERY}",
        "run.keep_checkpoints=0",  # the first is loaded below
        f"critic.values={values}",
        # FSDP2 with frozen parameters beside learning ones in a unit (the embeddings with
        # the value head): with the values the step makes.
        f"critic.frozen_layers={1 if values == 'step' else 0}",
        # Cut to its lowest layers, as ppo.yaml runs it: with a values stage, its workers
        # build the same cut critic to load the group's versions into.
        f"critic.layers={2 if values == 'step' else 1}",
    )
    default_run.finish(proc, log, 360)
    text = log.read_text()
    assert "started critic-0" in text and "started critic-1" in text
    joined = default_run.records(run_dir, "critic-1", "joined the training group")
    assert [(r["rank"], r["size"]) for r in joined] == [(1, 2)]

    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH  # every group trained once
    critic_lines = [s for s in steps if "value_loss" in s]
    assert critic_lines and all(s["critic_ranks"] == 2 for s in critic_lines)
    # Its loss is not compared step to step: each step's targets are a new batch's returns
    # under a moving policy (CI saw 0.094 then 0.143). That the values move towards fixed
    # returns is tested on a fixed batch in tests/unit/actors/critic/test_critic_learner.py.
    assert all(0 < s["value_loss"] < float("inf") for s in critic_lines), critic_lines
    if values == "stage":
        # The values workers followed the group's versions, read from both ranks' shards.
        loaded = [
            r["version"]
            for r in default_run.records(run_dir, "values-0", "loaded a critic version")
        ]
        assert loaded and max(loaded) >= 2, loaded
        for line in steps:
            assert 0 <= line["critic_staleness_max"] <= 2, line
    else:  # every rank made the batch's values with the group's shards, before the update
        assert "started values-" not in text
        assert all(line["critic_staleness_max"] == 0 for line in critic_lines), critic_lines

    run = RunDir(run_dir)
    assert run.critic_checkpoint_steps()[:1] == [_EVERY]
    models = [
        load_value_model(str(p))[0] for p in [run.critic_checkpoint(_EVERY), run.final_critic]
    ]
    for model in models:  # Hugging Face names, the value head's too, and only its layers
        assert any(name.startswith("score.") for name, _ in model.named_parameters())
        assert len(model.model.layers) == (2 if values == "step" else 1)
    # The group's later steps changed the value model it checkpointed at step 2.
    early, final = (dict(m.named_parameters()) for m in models)
    assert any(not torch.equal(early[name], final[name]) for name in final)
    if values == "step":  # layer 0 and the embeddings kept as the critic started
        kept = [n for n in final if n.startswith(("model.embed_tokens.", "model.layers.0."))]
        assert kept and all(torch.equal(early[name], final[name]) for name in kept)
    assert not run.critic_staged_state.exists()  # the run ended: nothing left in memory
