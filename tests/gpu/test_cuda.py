"""The CUDA path: logits, a short RL run, weights from a CUDA trainer to a CUDA generator.

Marked ``gpu``: each test is skipped where torch sees no CUDA device (the default CI
machine has none), and runs as is where one is present.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors.critic import load_value_model
from asyncrl.actors.policy.checkpoint import load_model
from tests.support import default_run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.timeout(600),
]


def test_bf16_logits_on_cuda_match_fp32_on_cpu_through_both_paths() -> None:
    cpu, _ = load_model("embedded")
    gpu, _ = load_model("embedded", torch.bfloat16)
    gpu = gpu.to("cuda")
    ids = torch.randint(3, cpu.config.vocab_size, (3, 24))
    with torch.no_grad():
        expected = cpu(ids)
        whole = gpu(ids.cuda()).float().cpu()
        cache = gpu.new_cache(slots=3, max_len=32)
        slots = torch.arange(3, device="cuda")
        positions = torch.arange(24, device="cuda").expand(3, 24)
        stepped = gpu.step(ids.cuda(), positions, slots, cache).float().cpu()
    scale = expected.abs().max()
    assert (whole - expected).abs().max() <= 0.05 * scale  # bf16 weights, fp32 reference
    assert (stepped - expected).abs().max() <= 0.05 * scale


def _greedy(model, graphs: bool, swap_at: int | None = None, new_state=None):
    from asyncrl.actors.policy.decoder import Decoder, Request

    decoder = Decoder(
        model,
        slots=6,
        max_new_tokens=20,
        max_prompt_tokens=16,
        eos_id=1,
        pad_id=0,
        cuda_graphs=graphs,
    )
    generator = torch.Generator().manual_seed(0)
    prompts = [
        tuple(torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist())
        for n in (4, 16, 9, 1, 12, 7, 5, 10)  # 8 sequences in 6 slots: refills too
    ]
    decoder.submit(Request(i, p, greedy=True) for i, p in enumerate(prompts))
    done, steps = {}, 0
    while decoder.busy:
        if steps == swap_at:
            decoder.load(new_state, version=1)
        done.update((f.tag, f) for f in decoder.step())
        steps += 1
    return done, decoder


def test_graphed_decode_steps_generate_what_the_plain_ones_do() -> None:
    """CUDA graphs (actors/policy/graphs.py) against the plain step, greedy, in float32 on
    the GPU: the same tokens and log-probs, through slot refills and a new version loaded
    mid-generation."""
    model, _ = load_model("embedded")
    model = model.cuda()
    new_state = {n: p.detach() + 0.01 * torch.randn_like(p) for n, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        new_state.pop("lm_head.weight", None)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    plain, _ = _greedy(model, graphs=False, swap_at=7, new_state=new_state)
    model.load_state_dict(original, strict=False)
    graphed, decoder = _greedy(model, graphs=True, swap_at=7, new_state=new_state)
    assert decoder.graphed is not None and decoder.graphed.graphs, "no step was graphed"
    assert sorted(plain) == sorted(graphed) == list(range(8))
    for tag, expected in plain.items():
        assert graphed[tag].tokens == expected.tokens, tag
        assert graphed[tag].versions == expected.versions, tag
        diffs = [abs(a - b) for a, b in zip(graphed[tag].logprobs, expected.logprobs, strict=True)]
        assert max(diffs) <= 1e-3, tag


def _conversation(model, graphs: bool, keep: bool) -> list:
    """Six sessions' three greedy turns in 4 slots (kept caches evicted and moved), each
    turn's prompt the conversation so far, a token of each session's own between turns."""
    from asyncrl.actors.policy.decoder import Decoder, Request

    decoder = Decoder(
        model,
        slots=4,
        max_new_tokens=8,
        max_prompt_tokens=48,
        eos_id=1,
        pad_id=0,
        cuda_graphs=graphs,
        reuse_min_tokens=1,
    )
    generator = torch.Generator().manual_seed(0)
    talks = [
        torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist()
        for n in (4, 9, 6, 12, 3, 7)
    ]
    turns = []
    for turn in range(3):
        decoder.submit(
            Request((s, turn), tuple(t), greedy=True, keep_cache=keep) for s, t in enumerate(talks)
        )
        done = {}
        while decoder.busy:
            done.update((f.tag, f) for f in decoder.step())
        for s, talk in enumerate(talks):
            talk += [*done[(s, turn)].tokens, 3 + s]
        turns += [done[(s, turn)] for s in range(len(talks))]
    if keep:
        assert decoder.cached_prompt_tokens > 0, "no turn reused a kept cache"
    return turns


def test_graphed_turns_that_reuse_kept_caches_sample_what_plain_recomputed_ones_do() -> None:
    """Kept caches beside CUDA graphs (whose padding rows write to a spare slot no kept
    cache may take): the same tokens and log-probs as the plain step recomputing every
    turn's prompt."""
    model, _ = load_model("embedded")
    model = model.cuda()
    expected = _conversation(model, graphs=False, keep=False)
    got = _conversation(model, graphs=True, keep=True)
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.tokens == theirs.tokens, mine.tag
        diffs = [abs(a - b) for a, b in zip(mine.logprobs, theirs.logprobs, strict=True)]
        assert max(diffs) <= 1e-3, mine.tag


def _has_ucx() -> bool:
    try:
        import ucxx  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    "strategy",
    [
        "shm",
        pytest.param(
            "ucx", marks=pytest.mark.skipif(not _has_ucx(), reason="ucxx is not installed")
        ),
    ],
)
def test_a_short_rl_run_on_cuda_trains_and_moves_weights_between_gpus(
    tmp_path: Path, strategy: str
) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}", "run.total_steps=4"]
    argv += ["backends.device=cuda", "model.dtype=bfloat16", "data.val_every_versions=0"]
    argv += [f"weights.strategy={strategy}"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["grad_norm"] > 0 for s in steps)
    # Every version the CUDA trainer published reached the CUDA generator and logp.
    moved = [json.loads(line) for line in (run_dir / "weights.jsonl").open()]
    assert {m["version"] for m in moved if m["worker"].startswith("generate")} >= {1}
    final, _ = load_model(str(run_dir / "final"), torch.bfloat16)
    assert final.lm_head.weight.dtype == torch.bfloat16


def _cuda_run(run_dir: Path, config: str, *overrides: str) -> list[dict]:
    """``asyncrl run`` of ``config`` on the GPU in bfloat16; its step lines."""
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", config]
    argv += [f"run.dir={run_dir}", "backends.device=cuda", "model.dtype=bfloat16"]
    argv += ["data.val_every_versions=0", "weights.strategy=shm"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0", *overrides]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return default_run.steps(run_dir)


def test_ppo_with_a_learned_critic_on_cuda(tmp_path: Path) -> None:
    """The critic trains and the values workers score on the GPU; the critic's versions
    reach the values workers over the weight plane."""
    run_dir = tmp_path / "run"
    steps = _cuda_run(
        run_dir,
        "deploy/configs/ppo.yaml",
        "run.total_steps=4",
        "critic.warmup_steps=1",
        "critic.values=stage",  # the values workers of their own, on the GPU too
    )
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    losses = [s["value_loss"] for s in steps if "value_loss" in s]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert any("critic_staleness_max" in s for s in steps)
    for name in ["critic-0", "values-0"]:
        (loaded,) = default_run.records(run_dir, name, "value model loaded")
        assert loaded["device"].startswith("cuda"), loaded
    versions = default_run.records(run_dir, "values-0", "loaded a critic version")
    assert versions and max(v["version"] for v in versions) >= 1
    critic, _ = load_value_model(str(run_dir / "critic" / "final"))
    assert critic.score.weight.abs().sum() > 0  # the value head learned from zero


def test_lora_adapters_train_on_cuda(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    steps = _cuda_run(run_dir, "deploy/configs/lora.yaml", "run.total_steps=4")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["grad_norm"] > 0 for s in steps)
    assert (run_dir / "final" / "adapter" / "adapter_config.json").is_file()
    moved = [json.loads(line) for line in (run_dir / "weights.jsonl").open()]
    assert {m["version"] for m in moved if m["worker"].startswith("generate")} >= {1}
