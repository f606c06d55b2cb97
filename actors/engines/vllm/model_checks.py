"""What vLLM 0.32 cannot run of the models asyncrl can, found before a worker starts: each
a line naming the field. Neither vLLM nor torch is imported (``asyncrl run`` asks this of
every run with ``backends.generate=vllm``, before any process starts).

Found by running every family's tiny variant (``tests/vllm/test_vllm_families.py``) in
vLLM and comparing its log-probs with our own forward's.
"""

from __future__ import annotations

from ...policy.config import ModelConfig

__all__ = ["CPU_HEAD_SIZES", "vllm_model_problems"]

# vLLM's attention on CPU (CPUAttentionBackend.get_supported_head_sizes in 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_QWEN3 = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def vllm_model_problems(config: ModelConfig, *, device: str) -> list[str]:
    """Why vLLM cannot generate with a model of ``config`` on ``device`` (cpu or cuda)."""
    problems = []
    if device == "cpu" and config.head_dim not in CPU_HEAD_SIZES:
        sizes = ", ".join(map(str, CPU_HEAD_SIZES))
        problems.append(
            f"backends.generate='vllm': head_dim={config.head_dim}; vLLM's attention on CPU "
            f"takes {sizes}"
        )
    kinds = set(config.layer_types)
    if len(kinds) > 1:
        problems.append(
            "backends.generate='vllm': sliding-window attention on some layers only "
            f"(layer_types {sorted(kinds)}); vLLM takes it on every layer or none"
        )
    if device == "cpu" and config.experts is not None:
        # vLLM's in-place reload of a fused mixture-of-experts layer fails on CPU ("size
        # of tensor a (64) must match the size of tensor b (16)" in its layer-wise
        # reload): the model starts and samples, but takes no second version.
        problems.append(
            "backends.generate='vllm': a mixture-of-experts model on CPU; vLLM 0.32 cannot "
            "load a new version into its expert layers there (backends.device=cuda, or "
            "backends.generate=torch)"
        )
    if config.architecture in _QWEN3 and config.attention_bias:
        # vLLM's Qwen3 gives q/k/v a bias but never o_proj, which transformers' has: its
        # log-probs were 1.28 nats off ours on a tiny model with attention_bias.
        problems.append(
            f"backends.generate='vllm': {config.architecture} with attention_bias=true; "
            "vLLM's has no bias on o_proj, which the model's weights have"
        )
    return problems
