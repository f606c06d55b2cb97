"""How long a decoding generator is held up while a new version of its weights arrives.

    python -m tests.bench.weight_stall [--versions 4] [--layers 12] [--strategy ucx-map|ucx|shm]

Two processes. The trainer holds a Llama-shaped model of about 1 GiB (fp32, random
weights) and publishes a new version of it every few seconds through the weight plane
(the default, ``ucx-map``: UCX with map_on_host, so the generator on the trainer's host
maps the staged file; ``ucx``: fetched over UCX; ``shm``: the shared-memory strategy).
The generator decodes with the same architecture on its main thread, exactly as the
``generate`` role does (continuous batching, 4 slots, prompts refilled as sequences end)
and follows the versions with the role's own ``WeightFollower``: the fetch runs in the
background, and the decode loop only polls and, once a version is whole and checked,
makes the model run on it (no copy).

Printed per version, all measured in this run:
- transfer: from the first plan to the last checked byte at the generator;
- blocked: time the decode loop spent inside weight-plane calls (polls, plan requests,
  the switch to the new weights) during that transfer, and its fraction of the transfer;
  switch: the part of it spent making the model run on the new weights;
- steps/s during the transfer against steps/s with no transfer (the two processes share
  two cores, so a transfer slows decoding even where it blocks nothing);
- recompute: the first decode step after the switch less the median step. Sequences in
  flight have their caches recomputed under the new weights; that is a property of
  continuing them, not of moving bytes, and is shown apart.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from asyncrl.transport.weights import WeightsPlan

PUBLISH_EVERY_S = 4.0


def model_config(layers: int) -> Any:
    from asyncrl.actors.policy.model import ModelConfig

    return ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=32768,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attention_bias=False,
    )


def _weights(strategy: str) -> Any:
    """The weights section a run with ``--strategy`` would have (64 MiB buckets)."""
    from asyncrl.runtime.contract.config import WeightsSection

    return WeightsSection(
        strategy="shm" if strategy == "shm" else "ucx", map_on_host=strategy == "ucx-map"
    )


def _publisher(strategy: str, workdir: str) -> Any:
    from pathlib import Path

    from asyncrl.runtime.contract.rundir import RunDir
    from asyncrl.transport.weights import make_publisher

    weights = _weights(strategy)
    return make_publisher(weights, RunDir(Path(workdir)).weight_dirs(weights))


def _receiver(strategy: str, workdir: str) -> Any:
    from pathlib import Path

    from asyncrl.runtime.contract.rundir import RunDir
    from asyncrl.transport.weights import make_receiver

    weights = _weights(strategy)
    return make_receiver(weights, RunDir(Path(workdir)).weight_dirs(weights))


def _trainer(
    layers: int, versions: int, strategy: str, workdir: str, plans: Any, done: Any
) -> None:
    from asyncrl.actors.policy.checkpoint import state_for_saving
    from asyncrl.actors.policy.model import CausalLM

    torch.set_num_threads(1)
    model = CausalLM(model_config(layers))
    publisher = _publisher(strategy, workdir)
    publisher.prepare(state_for_saving(model))  # as the train role does at its start
    for version in range(1, versions + 1):
        time.sleep(PUBLISH_EVERY_S)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.001)
        started = time.monotonic()
        announcement = publisher.publish(version, state_for_saving(model))
        plans.put((WeightsPlan(version, announcement.manifest, "trainer", announcement.address),
                   time.monotonic() - started))  # fmt: skip
    done.get()
    publisher.close()


def _generator(
    layers: int, versions: int, strategy: str, workdir: str, plans: Any, results: Any
) -> None:
    from asyncrl.actors.policy.decoder import Decoder, Request
    from asyncrl.actors.policy.model import CausalLM
    from asyncrl.actors.worker.weight_following import WeightFollower

    torch.set_num_threads(1)
    model = CausalLM(model_config(layers))
    model.requires_grad_(False)
    decoder = Decoder(
        model, slots=4, max_new_tokens=64, max_prompt_tokens=32, eos_id=-1, pad_id=0, seed=1
    )
    newest: dict[str, Any] = {}

    def ask(version: int, address: bytes, failed: str) -> WeightsPlan | None:
        return newest.get("plan")

    follower = WeightFollower(_receiver(strategy, workdir), ask)
    loaded, tag = 0, 0
    steps: list[tuple[float, float]] = []  # (start, seconds) of every decode step
    marks: dict[int, dict[str, float]] = {}  # by version
    switched: dict[str, float] | None = None  # the mark of the newest version switched to
    after_switch: int | None = None
    while loaded < versions:
        while decoder.free_slots > 0:
            tag += 1
            decoder.submit([Request(tag, tuple(range(1, 17)))])
        try:
            plan, publish_s = plans.get_nowait()
            newest["plan"] = plan
            marks[plan.version] = {"version": plan.version, "publish_s": publish_s}
        except Exception:
            pass
        received = follower.step(newest["plan"].version if newest else 0, loaded)
        if received is not None:
            switch_at = time.perf_counter()
            superseded = decoder.load(received.state, received.version, copy=False)
            cost = follower.loaded(received, time.perf_counter() - switch_at, superseded)
            loaded = received.version
            switched = marks[received.version]
            switched.update(cost, finished=time.monotonic())
            after_switch = len(steps)
        started = time.monotonic()
        decoder.step()
        steps.append((started, time.monotonic() - started))
        if after_switch is not None and len(steps) == after_switch + 1:
            assert switched is not None
            switched["first_step_s"] = steps[-1][1]
    results.put((steps, list(marks.values())))
    follower.receiver.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--strategy", choices=("ucx", "ucx-map", "shm"), default="ucx-map")
    args = parser.parse_args(argv)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    ctx = mp.get_context("spawn")
    plans, results, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="asyncrl-stall-") as workdir:
        common = (args.layers, args.versions, args.strategy)
        trainer = ctx.Process(target=_trainer, args=(*common, workdir, plans, done))
        generator = ctx.Process(target=_generator, args=(*common, workdir, plans, results))
        trainer.start()
        generator.start()
        steps, marks = results.get(timeout=600)
        done.put(True)
        generator.join(60)
        trainer.join(60)

    skipped = [int(m["version"]) for m in marks if "transfer_s" not in m]
    marks = [m for m in marks if "transfer_s" in m]  # a version can be skipped for a newer
    nbytes = marks[0]["bytes"]
    print(
        f"{nbytes / 2**30:.2f} GiB model, {args.layers} layers, 4 slots; 2 processes; "
        f"weights.strategy={args.strategy}"
    )
    quiet = [s for start, s in steps if not any(_during(start, m) for m in marks)]
    quiet_rate = 1 / statistics.median(quiet)
    median_step = statistics.median(quiet)
    print(
        f"{'version':>7} {'transfer s':>10} {'blocked s':>9} {'switch s':>9} {'blocked %':>9} "
        f"{'steps/s in':>10} {'quiet':>6} {'recompute s':>11} {'staging s':>9}"
    )
    for m in marks:
        during = [s for start, s in steps if _during(start, m)]
        rate = len(during) / m["transfer_s"] if during else 0.0
        recompute = m.get("first_step_s", median_step) - median_step
        print(
            f"{int(m['version']):7d} {m['transfer_s']:10.3f} {m['stall_s']:9.4f} "
            f"{m['load_s']:9.4f} "
            f"{100 * m['stall_s'] / m['transfer_s']:9.2f} {rate:10.1f} {quiet_rate:6.1f} "
            f"{recompute:11.3f} {m['publish_s']:9.3f}"
        )
    if skipped:
        print(f"skipped (a newer version arrived first): {skipped}")


def _during(start: float, mark: dict[str, float]) -> bool:
    finished = mark.get("finished")
    return finished is not None and finished - mark["transfer_s"] <= start < finished


if __name__ == "__main__":
    main()
