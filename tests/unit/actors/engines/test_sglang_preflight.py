"""backends.generate=sglang without SGLang (or without a GPU) fails at start, in one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.actors.startup.role_checks import check_engine
from asyncrl.runtime.contract.config import config_from_dict

ROOT = Path(__file__).resolve().parents[4]
# The check `asyncrl run` runs before it starts anything, in a process where SGLang cannot
# be imported (None in sys.modules: what an import of a missing package sees).
CHECK = (
    "import sys; sys.modules['sglang'] = None; from asyncrl.actors.cli import main; "
    "raise SystemExit(main(['check', 'backends.generate=sglang']))"
)


def test_without_sglang_the_check_before_start_says_what_to_install_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["asyncrl: backends.generate='sglang' needs SGLang: pip install 'asyncrl[gpu]'"]


def test_with_sglang_but_no_cuda_device_the_check_says_so(monkeypatch) -> None:
    import torch

    found = importlib.util.find_spec("json")  # stands in for an installed sglang
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = config_from_dict({"backends": {"generate": "sglang"}})
    (problem,) = check_engine(cfg, "generate")
    assert problem.startswith("backends.generate='sglang' needs a CUDA device")
    assert "\n" not in problem


@pytest.mark.parametrize("role", ["train", "logp", "ref_logp"])
def test_the_sglang_check_is_the_generate_roles_only(role: str) -> None:
    cfg = config_from_dict({"backends": {"generate": "sglang"}})
    assert check_engine(cfg, role) == []
    assert check_engine(config_from_dict({}), "generate") == []
