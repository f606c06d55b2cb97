"""Rewards (actors/tasks/rewards.py and what it picks): the math verifier, a sequence
classifier made here with random weights, and a reward that raises, returns a
non-number or hangs, each failing its group with the reason, never the worker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from asyncrl.actors.actor import ActorBroken
from asyncrl.actors.payloads import PromptIn, RolloutsOut
from asyncrl.actors.policy.checkpoint import EMBEDDED_DIR
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.roles.reward import Reward
from asyncrl.actors.tasks import RewardFunction, Sample, TaskError
from asyncrl.actors.tasks.arithmetic import task as arithmetic
from asyncrl.actors.tasks.classifier import ClassifierReward
from asyncrl.actors.tasks.math_reward import final_answer, math_reward
from asyncrl.actors.tasks.rewards import check_reward_choice, load_reward
from asyncrl.transport import protocol as p

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("9+3+0=12,8+2+1=11,5+1+1=07,4+0+0=04;4712", "4712"),  # the last number
        ("I think 13, so \\boxed{12} (not 14)", "\\boxed{12}"),  # a box beats later numbers
        ("first \\boxed{1}, then \\boxed{\\frac{3}{4}}", "\\boxed{\\frac{3}{4}}"),
        ("it is 1,000.", "1000"),
        ("x = -3", "-3"),
        ("cut off in \\boxed{7", "7"),
        ("no answer", None),
    ],
)
def test_the_final_answer_is_the_last_box_or_else_the_last_number(
    response: str, answer: str | None
) -> None:
    assert final_answer(response) == answer


@pytest.mark.parametrize(
    ("truth", "response", "reward"),
    [
        ("4712", "9+3+0=12,8+2+1=11,5+1+1=07,4+0+0=04;4712", 1.0),
        ("4712", "9+3+0=12;4713", 0.0),
        ("\\frac{1}{2}", "so \\boxed{0.5}", 1.0),  # equal as numbers, not as text
        ("0.5", "that is 1/2", 1.0),
        ("x^2+1", "\\boxed{1+x^2}", 1.0),  # equal as expressions
        ("12", "12.5", 0.0),
        ("7", "", 0.0),
    ],
)
def test_the_math_verifier(truth: str, response: str, reward: float) -> None:
    assert math_reward(Sample("q", truth), response) == reward


def test_the_math_verifier_pays_the_arithmetic_tasks_right_sums_only() -> None:
    for index in range(20):
        sample = arithmetic.sample("train", index)
        assert math_reward(sample, arithmetic.reference(sample)) == 1.0
        wrong = arithmetic.reference(sample).rpartition(";")[0] + f";{int(sample.answer) + 1}"
        assert math_reward(sample, wrong) == 0.0


def test_a_ground_truth_that_does_not_parse_fails_the_group_with_the_reason() -> None:
    reward = load_reward("math", arithmetic, "t")
    with pytest.raises(TaskError, match=r"reward 'math' raised TaskError: ground truth '\}\{'"):
        reward(Sample("q", "}{"), "1")


def classifier_dir(tmp_path: Path, labels: int) -> Path:
    """A tiny Llama sequence classifier with random weights and a character tokenizer."""
    from asyncrl.actors.policy.tokenizer import build_char_tokenizer, write_tokenizer_files
    from tests.tools.warmup import ALPHABET

    directory = tmp_path / f"rm{labels}"
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        num_labels=labels, pad_token_id=0,
    )  # fmt: skip
    transformers.set_seed(0)
    transformers.LlamaForSequenceClassification(config).save_pretrained(directory)
    write_tokenizer_files(build_char_tokenizer(ALPHABET), directory)
    return directory


@pytest.mark.parametrize("labels", [1, 2])
def test_a_sequence_classifier_scores_prompt_and_response(tmp_path: Path, labels: int) -> None:
    import torch

    directory = classifier_dir(tmp_path, labels)
    reward = load_reward(f"model:{directory}", arithmetic, "t", timeout_s=30)
    sample = Sample("12+30=", "42")
    scores = [reward(sample, response) for response in ("42", "43", "0+2=2;42")]
    assert len(set(scores)) == 3  # it reads the response

    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory)
    ids = transformers.AutoTokenizer.from_pretrained(directory)("12+30=42", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0]
    expected = logits[0] if labels == 1 else logits.softmax(-1)[1]
    assert scores[0] == pytest.approx(float(expected), abs=1e-6)
    if labels == 2:
        assert all(0.0 <= s <= 1.0 for s in scores)
    # A group is scored in one padded batch, to the same numbers.
    batched = reward.score_all(sample, ["42", "43", "0+2=2;42"])
    assert batched == pytest.approx(scores, abs=1e-5)


def test_a_batch_reward_that_gives_the_wrong_count_fails_its_group() -> None:
    class Short:
        def __call__(self, sample, response):
            return 1.0

        def batch(self, sample, responses):
            return [1.0]

    with pytest.raises(TaskError, match=r"reward 'f': batch gave 1 for 2"):
        RewardFunction(Short(), "f").score_all(Sample("q", "a"), ["x", "y"])


def test_a_classifier_directory_is_checked_before_a_run(tmp_path: Path) -> None:
    check_reward_choice(f"model:{classifier_dir(tmp_path, 1)}", arithmetic, "t")
    with pytest.raises(TaskError, match=r"data\.reward='model:.*nowhere': .* holds no config"):
        check_reward_choice(f"model:{tmp_path / 'nowhere'}", arithmetic, "t")
    three = classifier_dir(tmp_path, 3)
    with pytest.raises(TaskError, match="has 3 labels; a reward model has 1"):
        check_reward_choice(f"model:{three}", arithmetic, "t")
    (three / "config.json").write_text("{")
    with pytest.raises(TaskError, match=r"config\.json is not JSON"):
        check_reward_choice(f"model:{three}", arithmetic, "t")


def test_a_reward_that_hangs_fails_its_call_and_the_next_call_runs_fresh() -> None:
    calls: list[str] = []
    released = threading.Event()

    def reward(sample: Sample, response: str) -> float:
        calls.append(response)
        if response == "hang":
            released.wait(60)  # hung until the test lets it go
        return 1.0

    guarded = RewardFunction(reward, "my.plugin:f", timeout_s=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(
            TaskError, match=r"reward 'my\.plugin:f' did not return: still running after 0\.2 s"
        ):
            guarded(Sample("q", "a"), "hang")
        assert time.monotonic() - started < 30  # not waiting for the hung call
        assert guarded.stuck == 1
        assert guarded(Sample("q", "a"), "fine") == 1.0  # on a fresh thread
    finally:
        released.set()
    deadline = time.monotonic() + 30
    while guarded.stuck and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guarded.stuck == 0  # the hung call came back and its thread left


@pytest.mark.parametrize(
    ("returned", "message"),
    [("1.0", "returned str, not a number"), (float("inf"), "not a finite number")],
)
def test_a_guarded_reward_that_returns_a_non_number_is_named(
    returned: object, message: str
) -> None:
    guarded = RewardFunction(lambda s, r: returned, "my.plugin:f", timeout_s=5)
    with pytest.raises(TaskError, match=message):
        guarded(Sample("q", "a"), "r")


def test_a_guarded_reward_that_raises_is_named_with_its_error() -> None:
    guarded = RewardFunction(lambda s, r: {}["x"], "my.plugin:f", timeout_s=5)
    with pytest.raises(TaskError, match=r"reward 'my\.plugin:f' raised KeyError"):
        guarded(Sample("q", "a"), "r")


def test_without_a_limit_a_reward_runs_on_the_callers_thread() -> None:
    seen = []
    RewardFunction(lambda s, r: seen.append(threading.current_thread()) or 0.0, "f")(
        Sample("q", "a"), "r"
    )
    assert seen == [threading.current_thread()]


def reward_lease(gid: int, answer: str) -> p.Lease:
    prompt = PromptIn(gid, "1+2=", answer).to_payload()
    rollouts = RolloutsOut.stack([4, 13, 5, 14], [([6], [-0.1], [0], False)]).to_payload()
    item = p.Item(gid, f"train-{gid:09d}", {"dataloader": prompt, "generate": rollouts})
    return p.Lease(gid, gid, "reward", 60.0, None, (item,))


def test_the_reward_role_fails_a_hung_group_and_leaves_once_calls_pile_up() -> None:
    from asyncrl.runtime.contract.config import RunConfig

    actor = Reward()
    actor.cfg = RunConfig()
    actor.codec = TextCodec.from_dir(EMBEDDED_DIR)
    actor.reward = RewardFunction(
        lambda s, r: time.sleep(3) if s.answer == "hang" else 1.0, "my.plugin:f", timeout_s=0.1
    )
    (result,) = actor.process(reward_lease(0, "3")).results
    assert result.data["rewards"].tolist() == [1.0]
    for gid in (1, 2):  # a group's failure: the worker hands its lease back with the reason
        with pytest.raises(TaskError, match="did not return"):
            actor.process(reward_lease(gid, "hang"))
    with pytest.raises(ActorBroken, match="3 reward calls stuck"):  # now a fresh process
        actor.process(reward_lease(3, "hang"))


def test_the_reward_role_scores_a_group_with_a_reward_model(tmp_path: Path) -> None:
    """The reward role as a worker runs it: started from a config naming a classifier
    directory, scoring a leased group's responses in one batch."""
    from asyncrl.actors.actor import WorkerContext
    from asyncrl.runtime.contract.config import config_from_dict

    directory = classifier_dir(tmp_path, 2)
    cfg = config_from_dict({"data": {"reward": f"model:{directory}"}})
    actor = Reward()
    actor.on_start(WorkerContext("reward-0", "reward", cfg, "run", 1.0, 60.0, 1 << 20, 0))
    prompt = PromptIn(0, "1+2=", "3").to_payload()
    rows = [([6], [-0.1], [0], False), ([7, 8], [-0.1, -0.2], [0, 0], False)]
    rollouts = RolloutsOut.stack([4, 13, 5, 14], rows).to_payload()
    item = p.Item(0, "train-000000000", {"dataloader": prompt, "generate": rollouts})
    (result,) = actor.process(p.Lease(0, 0, "reward", 60.0, None, (item,))).results
    scores = result.data["rewards"].tolist()
    codec = TextCodec.from_dir(EMBEDDED_DIR)
    single = ClassifierReward(str(directory))
    expected = [single(Sample("1+2=", "3"), codec.decode(r)) for r in ([6], [7, 8])]
    assert scores == pytest.approx(expected, abs=1e-5) and 0 < scores[0] < 1


def test_a_judge_must_be_an_async_function_and_is_checked_before_a_run() -> None:
    check_reward_choice("judge:tests.support.judges:agrees_with_greedy", None, "t")
    with pytest.raises(TaskError, match="not an async function"):
        check_reward_choice("judge:tests.support.judges:not_async", None, "t")
    with pytest.raises(TaskError, match="cannot import 'nope'"):
        check_reward_choice("judge:nope:judge", None, "t")


def test_the_reward_role_says_which_groups_carry_no_signal_with_filter_groups_on() -> None:
    from asyncrl.actors.actor import WorkerContext
    from asyncrl.runtime.contract.config import config_from_dict

    cfg = config_from_dict(
        {
            "data": {"reward": "tests.support.tasks:half_signal_reward", "group_size": 2},
            "algorithm": {"filter_groups": {"enabled": True}},
        }
    )
    actor = Reward()
    actor.on_start(WorkerContext("reward-0", "reward", cfg, "run", 1.0, 60.0, 1 << 20, 0))
    rows = [([6], [-0.1], [0], False), ([7, 8], [-0.1, -0.2], [0, 0], False)]
    rollouts = RolloutsOut.stack([4, 13, 5, 14], rows).to_payload()

    def scored(gid: int, answer: str) -> p.Result:
        prompt = PromptIn(gid, "1+1=", answer).to_payload()
        item = p.Item(gid, f"train-{gid:09d}", {"dataloader": prompt, "generate": rollouts})
        (result,) = actor.process(p.Lease(gid, gid, "reward", 60.0, None, (item,))).results
        return result

    even = scored(0, "2")  # every response paid 0.5: no signal
    assert even.data["rewards"].tolist() == [0.5, 0.5]
    assert even.filtered == "task reward 0.5 for all 2 responses"
    assert Reward().filter_reason is None  # off unless the config turns it on
