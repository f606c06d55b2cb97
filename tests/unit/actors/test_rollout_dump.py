"""The rollout dump writer: a step's groups as lines that decode to their token ids, with
the rewards, parts and advantages the step used; filtered groups in the writer's own file;
nothing written when the key is off."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from asyncrl.actors.payloads import PromptIn, RewardsOut, RolloutsOut
from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.rollout_dump import RolloutDump
from asyncrl.actors.training.step_advantages import step_advantages
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.runtime.contract.rollout_dumps import read_rollouts
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport import protocol as p


def _cfg(tmp_path: Path, *overrides: str) -> RunConfig:
    return config_from_dict({}, [f"run.dir={tmp_path}", "run.dump_rollouts=true", *overrides])


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec.from_dir(model_dir(RunConfig().model.path))


def _item(codec: TextCodec, gid: int, answers: list[str], rewards: list[float]) -> p.Item:
    prompt = codec.encode(f"{gid}+{gid}=")
    rows = []
    for i, answer in enumerate(answers):
        ids = codec.encode(answer)
        rows.append((ids, [-0.5] * len(ids), [gid % 3 + (j > 1) for j in range(len(ids))], i == 1))
    data = {
        "dataloader": PromptIn(gid, f"{gid}+{gid}=", str(2 * gid)).to_payload(),
        "generate": RolloutsOut.stack(prompt, rows).to_payload(),
        "reward": RewardsOut(np.asarray(rewards, np.float32)).to_payload(),
    }
    return p.Item(gid=gid, key=f"g{gid}", data=data)


def test_a_step_is_dumped_as_it_was_trained(tmp_path: Path, codec: TextCodec) -> None:
    cfg = _cfg(tmp_path)
    items = [
        _item(codec, 4, ["8", "9999", "80"], [1.0, 0.0, 0.5]),
        _item(codec, 5, ["10", "10", "11"], [1.0, 1.0, 0.0]),
    ]
    dump = RolloutDump.of(cfg, "train-0")
    assert dump.trained(3, 2, items, cfg.algorithm) > 0
    dumps = read_rollouts(RunDir.of(cfg).rollouts)
    lines = dumps.trained[3]
    assert [(x["gid"], x["row"]) for x in lines] == [(4, 0), (4, 1), (4, 2), (5, 0), (5, 1), (5, 2)]
    advantages, _ = step_advantages(
        [RolloutsOut.of(i) for i in items],
        [RewardsOut.of(i).rewards for i in items],
        cfg.algorithm,
    )
    for line in lines:
        group = 0 if line["gid"] == 4 else 1
        item = items[group]
        rollouts = RolloutsOut.of(item)
        assert line["prompt_ids"] == rollouts.prompt_ids.tolist()
        assert line["response_ids"] == rollouts.responses()[line["row"]]
        gid = line["gid"]
        assert line["prompt"] == codec.decode(line["prompt_ids"]) == f"{gid}+{gid}="
        assert line["response"] == codec.decode(line["response_ids"])
        reward = float(RewardsOut.of(item).rewards[line["row"]])
        assert line["reward"] == reward and line["reward_parts"] == {"task": reward}
        assert line["advantage"] == pytest.approx(advantages[group][line["row"], 0], abs=1e-6)
        assert line["advantage_per"] == "sequence"  # grpo: one advantage per sequence
        assert line["truncated"] is (line["row"] == 1)
        assert line["key"] == f"g{line['gid']}"
        assert line["step"] == 3 and line["resumed_at"] == 2
        assert line["trainer_start"] == dump.started
    assert [x["response"] for x in lines[:3]] == ["8", "9999", "80"]
    assert lines[0]["versions"] == [1, 1]  # gid 4: one token, version 4 % 3
    assert lines[1]["versions"] == [1, 2]  # later tokens one version newer
    assert "filtered" not in lines[0]


def test_token_level_estimators_give_the_mean_over_the_tokens(
    tmp_path: Path, codec: TextCodec
) -> None:
    cfg = _cfg(tmp_path, "algorithm.estimator=reinforce_pp")
    items = [_item(codec, 7, ["14", "1 4 1 4", "13"], [1.0, 0.0, 0.0])]
    RolloutDump.of(cfg, "train-0").trained(1, 0, items, cfg.algorithm)
    (advantages,), _ = step_advantages(
        [RolloutsOut.of(items[0])], [RewardsOut.of(items[0]).rewards], cfg.algorithm
    )
    mask = RolloutsOut.of(items[0]).trained_mask()
    for line in read_rollouts(RunDir.of(cfg).rollouts).trained[1]:
        assert line["advantage_per"] == "token_mean"
        expected = advantages[line["row"]][mask[line["row"]]].mean()
        assert line["advantage"] == pytest.approx(expected, abs=1e-5)


def test_filtered_groups_are_dumped_without_step_or_advantage(
    tmp_path: Path, codec: TextCodec
) -> None:
    cfg = _cfg(tmp_path)
    item = _item(codec, 2, ["4", "4"], [1.0, 1.0])
    dump = RolloutDump.of(cfg, "reward-1")
    reason = "task reward 1.0 for all 2 responses"
    dump.filtered(item, RolloutsOut.of(item), RewardsOut.of(item), reason)
    files = list(RunDir.of(cfg).rollouts.glob("filtered-reward-1-*.jsonl"))
    assert len(files) == 1
    dumps = read_rollouts(RunDir.of(cfg).rollouts)
    assert dumps.trained == {}
    assert [(x["gid"], x["row"], x["filtered"]) for x in dumps.filtered] == [
        (2, 0, reason),
        (2, 1, reason),
    ]
    assert not {"step", "advantage"} & set(dumps.filtered[0])
    assert dumps.filtered[0]["writer"] == "reward-1" and dumps.filtered[0]["response"] == "4"


def test_reward_parts_are_written_when_the_payload_has_them(
    tmp_path: Path, codec: TextCodec
) -> None:
    cfg = _cfg(tmp_path)
    item = _item(codec, 2, ["4", "5"], [1.0, -0.25])

    # What RewardsOut carries once the overlong penalty has its part (RewardsOut.parts).
    rewards = SimpleNamespace(
        rewards=RewardsOut.of(item).rewards,
        parts={
            "task": np.array([1.0, 0.0], np.float32),
            "overlong": np.array([0.0, -0.25], np.float32),
        },
    )
    RolloutDump.of(cfg, "reward-0").filtered(item, RolloutsOut.of(item), rewards, "why")
    lines = read_rollouts(RunDir.of(cfg).rollouts).filtered
    assert [x["reward_parts"] for x in lines] == [
        {"task": 1.0, "overlong": 0.0},
        {"task": 0.0, "overlong": -0.25},
    ]


def test_nothing_is_written_when_the_key_is_off(tmp_path: Path, codec: TextCodec) -> None:
    cfg = config_from_dict({}, [f"run.dir={tmp_path}"])
    assert cfg.run.dump_rollouts is False
    item = _item(codec, 1, ["2"], [1.0])
    dump = RolloutDump.of(cfg, "train-0")
    assert dump.trained(1, 0, [item], cfg.algorithm) == 0
    assert dump.filtered(item, RolloutsOut.of(item), RewardsOut.of(item), "why") == 0
    assert not RunDir.of(cfg).rollouts.exists()


def test_a_line_that_cannot_be_written_costs_only_itself(tmp_path: Path, codec: TextCodec) -> None:
    cfg = _cfg(tmp_path / "run")
    (tmp_path / "run").mkdir()
    RunDir.of(cfg).rollouts.write_text("a file where the directory should be")
    item = _item(codec, 1, ["2"], [1.0])
    assert RolloutDump.of(cfg, "train-0").trained(1, 0, [item], cfg.algorithm) == 0
