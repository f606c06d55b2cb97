"""Episodes on the embedded model with real environments: turns, observations, versions,
and every way an environment can fail its group."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch

from asyncrl.actors.episodes import EpisodeDone, EpisodeLimits, Episodes
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder
from asyncrl.actors.tasks import Sample
from asyncrl.actors.tasks.calculator import Calculator, evaluate

SAMPLE = Sample("12+34=", "46")


@pytest.fixture(scope="module")
def embedded():
    return load_model("embedded")


def episodes_of(embedded, environment, *, max_turns=3, total=96, timeout=5.0, slots=8):
    model, codec = embedded
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=24,
        max_prompt_tokens=72,
        eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
        seed=0,
    )
    limits = EpisodeLimits(max_turns=max_turns, max_total_tokens=total, step_timeout_s=timeout)
    stop = [] if environment is None else codec.encode(";")
    return Episodes(
        decoder, codec, environment=environment, name="test", limits=limits, stop_ids=stop
    )


def run(episodes: Episodes, deadline_s: float = 60.0):
    done: dict[object, EpisodeDone] = {}
    failed: dict[object, str] = {}
    started = time.monotonic()
    while episodes.busy:
        assert time.monotonic() - started < deadline_s, "episodes did not end"
        finished, failures = episodes.step()
        done.update((e.tag, e) for e in finished)
        failed.update(failures)
        if not finished and not failures and not episodes.decoder.busy:
            time.sleep(0.001)  # only environment calls are running
    return done, failed


class TwoTurns:
    """Stops the model at ';', answers with a new question once, then pays."""

    stop = (";",)

    def reset(self, sample: Sample) -> str:
        self.turn = 0
        return sample.prompt

    def step(self, action: str):
        self.turn += 1
        if self.turn == 1:
            return "5+6=", 0.25, False
        return "", 0.5, True


def four_of_two_turns(embedded) -> tuple[Episodes, dict[object, EpisodeDone]]:
    """Four episodes of :class:`TwoTurns` run to their end, none failed."""
    episodes = episodes_of(embedded, TwoTurns)
    for j in range(4):
        episodes.begin(j, SAMPLE, ())
    done, failed = run(episodes)
    assert not failed and len(done) == 4
    return episodes, done


def test_observations_sit_between_turns_untrained_and_rewards_add_up(embedded) -> None:
    _, codec = embedded
    _, done = four_of_two_turns(embedded)
    prompt = codec.encode(SAMPLE.prompt)
    observation = codec.encode("5+6=")
    for e in done.values():
        assert e.reward == 0.75 and e.turns == 2
        assert e.tokens[: len(prompt)] == prompt and not any(e.trained[: len(prompt)])
        # The first turn ends at the stop token; the observation follows it, untrained.
        first_end = e.tokens.index(codec.encode(";")[0], len(prompt))
        assert all(e.trained[len(prompt) : first_end + 1])
        at = first_end + 1
        assert e.tokens[at : at + len(observation)] == observation
        assert not any(e.trained[at : at + len(observation)])
        assert all(e.trained[at + len(observation) :])
        assert e.last_turn == e.tokens[at + len(observation) :]
        assert len(e.tokens) == len(e.logprobs) == len(e.versions) == len(e.trained)


def test_a_next_turn_computes_only_what_follows_the_turn_before(embedded) -> None:
    """The decoder keeps a turn's cache for the episode's next turn, which is fed only the
    observation (and the turn's last token); its log-probs are still the model's own."""
    model, codec = embedded
    episodes, done = four_of_two_turns(embedded)
    prompt = len(codec.encode(SAMPLE.prompt))
    first_turns = [e.trained.index(False, prompt) - prompt for e in done.values()]
    decoder = episodes.decoder
    assert isinstance(decoder, Decoder)
    assert decoder.cached_prompt_tokens == sum(prompt + turn - 1 for turn in first_turns)
    with torch.no_grad():
        for e in done.values():
            logprobs = torch.log_softmax(model(torch.tensor([e.tokens]))[0].float(), -1)
            for at in (i for i, trained in enumerate(e.trained) if trained):
                assert abs(e.logprobs[at] - logprobs[at - 1, e.tokens[at]].item()) < 1e-4


def test_a_trajectory_records_the_version_of_each_turn_across_a_weight_update(embedded) -> None:
    model, _ = embedded
    released = threading.Event()

    class Waits(TwoTurns):
        def step(self, action: str):
            released.wait(10)  # the update lands while the environment holds the episode
            return super().step(action)

    episodes = episodes_of(embedded, Waits)
    episodes.begin(0, SAMPLE, ())
    while not any(e.call is not None and e.kind == "step" for e in episodes.running.values()):
        episodes.step()
    episodes.decoder.load(model.state_dict(), 7)
    released.set()
    done, _ = run(episodes)
    e = done[0]
    model_versions = [v for v, t in zip(e.versions, e.trained, strict=True) if t]
    first_turn = e.tokens.index(embedded[1].encode(";")[0]) - len(SAMPLE.prompt) + 1
    assert set(model_versions[:first_turn]) == {0}
    assert set(model_versions[first_turn:]) == {7}


def test_environment_calls_never_stall_the_other_sequences(embedded) -> None:
    release = threading.Event()

    class SlowForOne(TwoTurns):
        def reset(self, sample: Sample) -> str:
            self.slow = sample.answer == "slow"
            return super().reset(sample)

        def step(self, action: str):
            if self.slow:
                release.wait(20)
            return "", 1.0, True

    episodes = episodes_of(embedded, SlowForOne)
    episodes.begin("slow", Sample("9+9=", "slow"), ())
    for j in range(6):
        episodes.begin(j, SAMPLE, ())
    finished: set = set()
    started = time.monotonic()
    while len(finished) < 6:
        assert time.monotonic() - started < 60
        done, _ = episodes.step()
        finished |= {e.tag for e in done}
    assert "slow" not in finished and "slow" in episodes.running  # still in its tool call
    release.set()
    done, _ = run(episodes)
    assert done["slow"].reward == 1.0


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (lambda action: 1 / 0, r"step raised ZeroDivisionError"),
        (lambda action: "just text", r"step returned str .*not \(observation, reward, done\)"),
        (lambda action: ("", "1.0", True), r"reward is str, not a number"),
        (lambda action: ("", float("nan"), True), r"reward is nan"),
        (lambda action: (3, 1.0, True), r"observation is int, not str"),
        (lambda action: ("", 1.0, "yes"), r"done is str, not bool"),
    ],
)
def test_an_environment_that_raises_or_returns_garbage_fails_its_episode(
    embedded, step, reason
) -> None:
    class Broken(TwoTurns):
        pass

    Broken.step = lambda self, action: step(action)
    episodes = episodes_of(embedded, Broken)
    episodes.begin(0, SAMPLE, ())
    done, failed = run(episodes)
    assert not done
    assert list(failed) == [0]
    assert failed[0].startswith("environment 'test': ")
    assert re.search(reason, failed[0]), failed[0]


def test_an_environment_call_past_its_time_fails_and_is_counted_as_stuck(embedded) -> None:
    hang = threading.Event()

    class Hangs(TwoTurns):
        def step(self, action: str):
            hang.wait(30)
            return "", 0.0, True

    episodes = episodes_of(embedded, Hangs, timeout=0.3)
    episodes.begin(0, SAMPLE, ())
    done, failed = run(episodes)
    assert not done and "step did not return within 0.3 s" in failed[0]
    assert episodes.stuck == 1
    hang.set()


def test_a_bad_reset_fails_the_episode_before_any_decoding(embedded) -> None:
    class EmptyPrompt(TwoTurns):
        def reset(self, sample: Sample) -> str:
            return ""

    episodes = episodes_of(embedded, EmptyPrompt)
    episodes.begin(0, SAMPLE, ())
    _, failed = run(episodes)
    assert "reset returned str '', not a non-empty str" in failed[0]


def test_turn_and_token_limits_end_an_episode_as_truncated(embedded) -> None:
    class Endless(TwoTurns):
        def step(self, action: str):
            return "1+1=", 0.1, False

    episodes = episodes_of(embedded, Endless, max_turns=2)
    episodes.begin(0, SAMPLE, ())
    done, _ = run(episodes)
    assert done[0].truncated and done[0].turns == 2 and done[0].reward == pytest.approx(0.2)

    episodes = episodes_of(embedded, Endless, max_turns=50, total=40)
    episodes.begin(0, SAMPLE, ())
    done, _ = run(episodes)
    assert done[0].truncated and len(done[0].tokens) <= 40


def test_cancelled_episodes_leave_the_decoder_and_their_calls_are_ignored(embedded) -> None:
    episodes = episodes_of(embedded, TwoTurns)
    for j in range(3):
        episodes.begin(j, SAMPLE, ())
    episodes.step()
    episodes.cancel([0, 1])
    done, failed = run(episodes)
    assert set(done) == {2} and not failed
    assert not episodes.decoder.busy


def test_without_an_environment_an_episode_is_one_turn(embedded) -> None:
    _, codec = embedded
    episodes = episodes_of(embedded, None)
    prompt = tuple(codec.encode(SAMPLE.prompt))
    episodes.begin(0, SAMPLE, prompt)
    done, _ = run(episodes)
    e = done[0]
    assert e.reward is None and e.turns == 1
    assert e.tokens[: len(prompt)] == list(prompt) and all(e.trained[len(prompt) :])


def test_the_calculator_answers_calls_and_pays_only_the_right_final_answer() -> None:
    env = Calculator()
    assert env.reset(Sample("34*56+12=", "1916")) == "34*56+12="
    assert env.step("[34*56+12]") == ("1916;", 0.0, False)
    assert env.step("[34*56]") == ("1904;", 0.0, False)
    assert env.step("[34*]") == ("?;", 0.0, False)
    assert env.step("34]") == ("?;", 0.0, False)
    assert env.step("1904") == ("", 0.0, True)
    assert env.step("1916") == ("", 1.0, True)
    assert evaluate("2*3*4-5+6") == 25 and evaluate("1++2") is None
