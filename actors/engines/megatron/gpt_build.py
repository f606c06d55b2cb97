"""megatron-core's ``GPTModel`` of one of our model configurations, and the process
groups it is split over.

The layer spec is megatron's local one (Transformer Engine's when ``transformer_engine``
imports), with the core attention replaced by :class:`SdpaAttention`: torch's
``scaled_dot_product_attention`` runs on CPU and picks a fused kernel on GPU, where the
local spec's own attention needs a CUDA buffer and materialises every score. Rotary
frequencies are ours (``asyncrl.actors.policy.rotary.rotary_frequencies``): the same
float32 arithmetic as the torch engine and transformers, every scaling they support.

Parallel sizes come from ``backends.megatron``; megatron's process groups are made over
the default ``torch.distributed`` group (a one-rank group is made for a worker alone).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from asyncrl.actors.policy.model import ModelConfig
from asyncrl.actors.policy.rotary import rotary_frequencies
from asyncrl.runtime.contract.config import MegatronSection

from .experts import moe_fields, use_our_dispatchers, use_our_router
from .mapping import Layout
from .parallel import tensor_parallel_dim

__all__ = [
    "ParallelSizes",
    "SdpaAttention",
    "build_gpt",
    "ensure_parallel_state",
    "layout_of",
    "te_available",
]


@dataclass(frozen=True)
class ParallelSizes:
    tensor: int = 1
    pipeline: int = 1
    expert: int = 1

    @classmethod
    def of(cls, section: MegatronSection) -> ParallelSizes:
        return cls(section.tensor_parallel, section.pipeline_parallel, section.expert_parallel)


def te_available() -> bool:
    """Whether Transformer Engine can be used (its spec then replaces the local one)."""
    return importlib.util.find_spec("transformer_engine") is not None


def layout_of(config: ModelConfig, tensor_parallel: int = 1) -> Layout:
    """The mapping's view of a model of ours."""
    return Layout(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        ffn=config.intermediate_size,
        vocab=config.vocab_size,
        tied=config.tie_word_embeddings,
        qkv_bias=config.attention_bias,
        proj_bias=config.output_bias,
        mlp_bias=config.mlp_bias,
        qk_norm=config.qk_norm,
        experts=config.experts.count if config.experts else 0,
        expert_ffn=config.experts.intermediate_size if config.experts else 0,
    ).padded_for(tensor_parallel)


# --- process groups ----------------------------------------------------------------------


def ensure_parallel_state(sizes: ParallelSizes, device: torch.device) -> None:
    """megatron's tensor/pipeline/expert groups over the default group (made here with
    one rank when this process is not in a group)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        made = ParallelSizes(
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        if made != sizes:  # megatron's groups are per process: one split per process
            raise ValueError(f"megatron's groups in this process are {made}, not {sizes}")
        return
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=sizes.tensor,
        pipeline_model_parallel_size=sizes.pipeline,
        expert_model_parallel_size=sizes.expert,
        # Only the groups asked for: gloo twins of NCCL groups are for CPU-side checkpoints.
        create_gloo_process_groups=device.type != "cuda",
    )
    if device.type == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(0)


# --- the modules ---------------------------------------------------------------------------


class SdpaAttention(MegatronModule):
    """Core attention (megatron's ``DotProductAttention`` interface) by torch's SDPA:
    causal, grouped key/value heads, an optional sliding window per layer."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type=None,
        attention_type: str = "self",
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
        windows: tuple[int | None, ...] = (),
    ) -> None:
        super().__init__(config=config)
        # megatron numbers layers from 1
        self.window = windows[layer_number - 1] if windows else None
        self.scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """[tokens, batch, heads, dim] each in; [tokens, batch, heads * dim] out."""
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("packed sequences and attention biases are not used here")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        tokens = q.shape[2]
        mask = None
        if self.window is not None:  # query i sees keys i - window + 1 .. i
            span = torch.arange(tokens, device=q.device)
            mask = (span[None, :] <= span[:, None]) & (span[None, :] > span[:, None] - self.window)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=True
        )
        batch, heads, _, dim = out.shape
        return out.permute(2, 0, 1, 3).reshape(tokens, batch, heads * dim)


class _Rotary(RotaryEmbedding):
    """megatron's rotary embedding on our frequencies, computed where they are (megatron's
    own moves them to the current CUDA device, which a CPU run has not)."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(
            kv_channels=config.head_dim, rotary_percent=1.0, use_cpu_initialization=True
        )
        self.inv_freq = rotary_frequencies(config).to(device)

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


def transformer_config(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, sizes: ParallelSizes
) -> TransformerConfig:
    """megatron's configuration of our architecture; fusions that need CUDA kernels off
    on CPU (and the ones that need apex off everywhere: it is not installed)."""
    if config.output_bias != config.mlp_bias:
        # megatron's add_bias_linear covers the attention output and the MLP together.
        raise ValueError(
            f"{config.architecture} with attention_bias={config.attention_bias} and "
            f"mlp_bias={config.mlp_bias}: megatron-core biases every linear layer or none"
        )
    if config.experts is not None and sizes.tensor > 1:
        # megatron's MoE layer trains over tensor-parallel ranks only with sequence
        # parallelism; train_engine_problems refuses this at start, with the key.
        raise ValueError(
            f"{config.architecture} (a mixture of experts) over {sizes.tensor} "
            "tensor-parallel ranks: needs sequence parallelism, which is not wired"
        )
    cuda = device.type == "cuda"
    return TransformerConfig(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        ffn_hidden_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=config.num_key_value_heads,
        kv_channels=config.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=config.mlp_bias,
        add_qkv_bias=config.attention_bias,
        qk_layernorm=config.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=sizes.tensor,
        pipeline_model_parallel_size=sizes.pipeline,
        expert_model_parallel_size=sizes.expert,
        sequence_parallel=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,  # megatron asks for it with stages; ours send the weights' dtype
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not cuda,
        perform_initialization=False,  # the checkpoint's weights replace them at once
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        **moe_fields(config),
    )


def layer_spec(config: ModelConfig) -> ModuleSpec:
    windows = tuple(config.window(i) for i in range(config.num_hidden_layers))
    experts = config.experts.count if config.experts else None
    if te_available():
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        if any(w is not None for w in windows):
            raise ValueError("sliding-window attention with Transformer Engine is not wired")
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=False, qk_layernorm=config.qk_norm
        )
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=experts,
            moe_grouped_gemm=False,
            qk_layernorm=config.qk_norm,
            normalization="RMSNorm",
        )
        attention = spec.submodules.self_attention.submodules
        attention.core_attention = ModuleSpec(module=SdpaAttention, params={"windows": windows})
    if experts:
        use_our_router(spec)
    return spec


def build_gpt(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, sizes: ParallelSizes
) -> GPTModel:
    """An uninitialised ``GPTModel`` of ``config`` on ``device`` (parallel state made)."""
    ensure_parallel_state(sizes, device)
    layout = layout_of(config, sizes.tensor)
    model = GPTModel(
        transformer_config(config, dtype, device, sizes),
        layer_spec(config),
        vocab_size=layout.rows,
        max_sequence_length=config.max_position_embeddings,
        # megatron numbers a stage's layers from 0 in its state and offsets them by
        # stage * (layers / stages) in layer_number (get_transformer_layer_offset), as
        # parallel.split_pipeline_parallel does.
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        # With stages, megatron's tie copies the embedding to the last stage with
        # ``.cuda()`` (LanguageModule.setup_embeddings_and_output_layer): untied there,
        # the last stage's output layer is loaded with the embedding's copy and
        # MegatronLM.finish_gradients sums the two copies' gradients instead.
        share_embeddings_and_output_weights=config.tie_word_embeddings and sizes.pipeline == 1,
        position_embedding_type="rope",
    )
    model.rotary_pos_emb = _Rotary(config, device)
    use_our_dispatchers(model)
    _mark_split(model)
    # The local spec's norms are torch modules made in float32 whatever params_dtype is;
    # every weight in ``dtype``, as the torch engine and transformers hold them. (The
    # rotary frequencies are no parameter: they stay float32.)
    return model.to(device=device, dtype=dtype)


def _mark_split(model: GPTModel) -> None:
    """Mark each parameter split over the tensor-parallel ranks as megatron's own
    initialisation would have (skipped: the checkpoint replaces the weights), so that
    megatron's helpers count a split one on every rank and a whole one once."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for name, param in model.named_parameters():
        dim = tensor_parallel_dim(name)
        if dim is not None and not hasattr(param, "tensor_model_parallel"):
            set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)
