"""megatron-core's ``GPTModel`` built from a Hugging Face model directory, and presented
to the learner and the scorers as a model of Hugging Face weights.

The layer spec is megatron's local one (Transformer Engine's when ``transformer_engine``
imports), with the core attention replaced by :class:`SdpaAttention`: torch's
``scaled_dot_product_attention`` runs on CPU and picks a fused kernel on GPU, where the
local spec's own attention needs a CUDA buffer and materialises every score. Rotary
frequencies are ours (``asyncrl.actors.policy.model.rotary_frequencies``): the same
float32 arithmetic as the torch engine and transformers, every scaling they support.

Parallel sizes come from ``backends.megatron``; megatron's process groups are made over
the default ``torch.distributed`` group (a one-rank group is made for a worker alone).
Pipeline stages pass activations through :mod:`.stages`; a mixture of experts (its
router, token dispatcher and expert-parallel weights) is in :mod:`.experts`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping
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
from torch import nn

from asyncrl.actors.policy.checkpoint import model_dir, read_weights
from asyncrl.actors.policy.model import ModelConfig, rotary_frequencies
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.runtime.config import MegatronSection

from .experts import gather_experts, is_expert, moe_fields, use_our_dispatchers, use_our_router
from .logprobs import gather_vocab, vocab_parallel_logprobs
from .mapping import (
    Layout,
    from_te_names,
    hf_to_megatron,
    megatron_to_hf,
    merge_pipeline_parallel,
    merge_tensor_parallel,
    split_expert_parallel,
    split_pipeline_parallel,
    split_tensor_parallel,
    tensor_parallel_dim,
    to_te_names,
)
from .optimizer import DistributedOptimizer, Share
from .stages import Stages

__all__ = [
    "MegatronLM",
    "ParallelSizes",
    "SdpaAttention",
    "build_gpt",
    "ensure_parallel_state",
    "layout_of",
    "load_megatron",
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
        # mapping.split_pipeline_parallel does.
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


class MegatronLM(nn.Module):
    """A ``GPTModel`` as the learner and the scorers use a model: token ids in, logits out;
    weights in and out by Hugging Face name."""

    def __init__(
        self,
        config: ModelConfig,
        gpt: GPTModel,
        sizes: ParallelSizes,
        distributed_optimizer: bool = False,
    ) -> None:
        super().__init__()
        self.config = config
        self.gpt = gpt
        self.sizes = sizes
        self.distributed_optimizer = distributed_optimizer
        self._shards: DistributedOptimizer | None = None  # made with the learner's optimizer
        self.layout = layout_of(config, sizes.tensor)
        self.te = te_available()
        self.stages = Stages.current() if sizes.pipeline > 1 else None

    @property
    def device(self) -> torch.device:
        return next(self.gpt.parameters()).device  # every stage has some of the layers

    @property
    def dtype(self) -> torch.dtype:
        return next(self.gpt.parameters()).dtype

    def forward(self, input_ids: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, tokens, vocab] of right-padded sequences (causal: padding never
        leaks back), or only at ``columns`` [batch, k] of each row; over the whole
        vocabulary (gathered from the tensor-parallel ranks)."""

        def whole(logits: torch.Tensor) -> torch.Tensor:
            if self.sizes.tensor > 1:
                logits = gather_vocab(logits, parallel_state.get_tensor_model_parallel_group())
            return logits[..., : self.config.vocab_size]  # the padding rows are no tokens

        width = input_ids.shape[1] if columns is None else columns.shape[1]
        shape = (input_ids.shape[0], width, self.config.vocab_size)
        return self._through_stages(input_ids, columns, whole, shape, self.dtype)

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """log p(``targets`` [batch, k]) at ``columns`` of each row, float32, without any
        rank holding whole rows of logits (the vocabulary stays split)."""
        group = None
        if self.sizes.tensor > 1:
            group = parallel_state.get_tensor_model_parallel_group()

        def chosen(logits: torch.Tensor) -> torch.Tensor:
            return vocab_parallel_logprobs(
                logits, targets, group, vocab=self.config.vocab_size, temperature=temperature
            )

        return self._through_stages(input_ids, columns, chosen, tuple(targets.shape), torch.float32)

    def _through_stages(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor | None,
        head: Callable[[torch.Tensor], torch.Tensor],
        shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """``head`` of this rank's vocabulary slice of the logits (at ``columns``), on
        every rank: with pipeline stages the last computes it and the others receive it
        (``shape``, ``dtype``), and backward on any stage trains the whole model."""
        batch, tokens = input_ids.shape
        positions = torch.arange(tokens, device=input_ids.device).expand(batch, tokens)
        stages = self.stages
        if stages is not None and not stages.first:
            # megatron's activations between layers are [tokens, batch, hidden]
            hidden = (tokens, batch, self.config.hidden_size)
            self.gpt.set_input_tensor(stages.receive(hidden, self.dtype, self.device))
        out = self.gpt(input_ids, positions, None, runtime_gather_output=False)
        if stages is not None and not stages.last:
            link = stages.send(out.to(self.dtype))
            return stages.from_last(None, link, shape, dtype)
        if columns is not None:
            out = out[torch.arange(batch, device=out.device)[:, None], columns]
        result = head(out).to(dtype)
        return result if stages is None else stages.from_last(result, None, shape, dtype)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Every parameter by Hugging Face name, whole; a tied output layer once. With
        tensor- or expert-parallel ranks or pipeline stages a collective over them (every
        rank gets the whole)."""
        return self._whole(
            {k: t.detach() for k, t in self.gpt.state_dict().items() if _is_tensor(t)}
        )

    def load_hf_state(self, hf: Mapping[str, torch.Tensor]) -> None:
        """Whole Hugging Face weights into the model (each stage takes its layers, each
        tensor-parallel rank its part of them, each expert-parallel rank its experts); a
        missing or unexpected tensor is named."""
        state = self._mine(hf)
        params = dict(self.gpt.named_parameters())
        missing = set(params) - set(state)
        unexpected = set(state) - set(params)
        if missing or unexpected:
            raise ValueError(
                f"weights do not fit the megatron model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    # --- training in a group ------------------------------------------------------------

    def data_parallel(self) -> tuple[int, int, dist.ProcessGroup | None]:
        """This rank's place among the model's copies: (index, copies, their group).
        Ranks that hold parts of one copy train the same micro-batches."""
        copies = parallel_state.get_data_parallel_world_size()
        if copies == 1:
            return 0, 1, None
        group = parallel_state.get_data_parallel_group()
        return parallel_state.get_data_parallel_rank(), copies, group

    def optimized_parameters(self) -> list[nn.Parameter]:
        """The parameters this rank's optimizer updates: all of its part of the model, or
        with the distributed optimizer and several copies, its share of them."""
        copies = parallel_state.get_data_parallel_world_size()
        if not self.distributed_optimizer or copies == 1:
            return list(self.gpt.parameters())
        dense = Share(
            parallel_state.get_data_parallel_group(),
            parallel_state.get_data_parallel_rank(),
            copies,
            {n: p for n, p in self.gpt.named_parameters() if not is_expert(n)},
        )
        experts = None
        twins = parallel_state.get_expert_data_parallel_world_size()
        if twins > 1 and self.config.experts is not None:
            experts = Share(
                parallel_state.get_expert_data_parallel_group(),
                parallel_state.get_expert_data_parallel_rank(),
                twins,
                {n: p for n, p in self.gpt.named_parameters() if is_expert(n)},
            )
        self._shards = DistributedOptimizer(self.gpt.parameters(), dense, experts)
        return self._shards.parameters()

    def finish_gradients(self) -> None:
        """Sum the gradients over the model's copies (each trained its own micro-batches;
        the losses are normalised over the whole batch already): on every copy, or with
        the distributed optimizer on the rank that updates the parameter. An expert's
        gradient is whole already over its expert-parallel group (it computed every
        rank's tokens routed to it): it is summed only over the ranks that hold the same
        expert."""
        tied = self._tied_copy()
        if tied is not None and tied.grad is not None:
            # The embedding (first stage) and its copy as the output layer (last stage)
            # are one weight: both take the sum of their gradients, so they stay equal.
            # Before the copies' sum, which may leave a gradient on one rank only.
            dist.all_reduce(tied.grad, group=parallel_state.get_embedding_group())
        if self._shards is not None:
            self._shards.reduce_gradients()
            return
        _, copies, group = self.data_parallel()
        if copies > 1:
            for param in self._dense():
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=group)
        if parallel_state.get_expert_data_parallel_world_size() > 1:
            expert_group = parallel_state.get_expert_data_parallel_group()
            for param in self._experts():
                if param.grad is None:
                    # No token of this rank's reached the expert: its twins on the other
                    # ranks may have had some, and the sum pairs up.
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad, group=expert_group)

    def finish_step(self) -> None:
        """After the optimizer's step: with the distributed optimizer, every copy takes
        the parameters their owners updated."""
        if self._shards is not None:
            self._shards.broadcast_parameters()

    def _dense(self) -> list[nn.Parameter]:
        return [p for n, p in self.gpt.named_parameters() if not is_expert(n)]

    def _experts(self) -> list[nn.Parameter]:
        return [p for n, p in self.gpt.named_parameters() if is_expert(n)]

    def _tied_copy(self) -> nn.Parameter | None:
        """This stage's half of a tied embedding split over stages (None: not here)."""
        stages = self.stages
        if stages is None or not self.config.tie_word_embeddings:
            return None
        if stages.first:
            return self.gpt.embedding.word_embeddings.weight
        if stages.last:
            return self.gpt.output_layer.weight
        return None

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The whole model's gradient norm (each split tensor counted once over the
        tensor-parallel ranks), and the gradients scaled down to ``max_norm`` if above."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        grads = [p.grad for p in self.gpt.parameters() if p.grad is not None]
        # A tied embedding split over stages counts once: on the first stage.
        stages, tied = self.stages, self._tied_copy()
        twin = tied if stages is not None and not stages.first else None
        dense, experts = [], []
        for name, p in self.gpt.named_parameters():
            if p.grad is not None and param_is_not_tensor_parallel_duplicate(p) and p is not twin:
                (experts if is_expert(name) else dense).append(p.grad.float().pow(2).sum())
        squares = _summed(dense, self.device)
        expert_squares = _summed(experts, self.device)
        if self._shards is not None:  # each gradient is on the rank that updates it
            self._shards.sum_squares(squares, expert_squares)
        if self.sizes.tensor * self.sizes.pipeline > 1:
            dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        # Each expert is on one rank of its expert-parallel group (of one stage): the
        # experts' squares summed over those ranks and the stages, the dense ones once.
        if self.sizes.expert * self.sizes.pipeline > 1:
            group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
            dist.all_reduce(expert_squares, group=group)
        norm = (squares + expert_squares).sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.dtype))
        return norm

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """AdamW's state whole, each moment by its parameter's Hugging Face name (split,
        fused and padded as the weights are); a collective over the group."""
        params = dict(self.gpt.named_parameters())
        moments: dict[str, dict[str, torch.Tensor]] = {}
        step = None
        for name, param in params.items():
            for key, value in optimizer.state.get(param, {}).items():
                if value.dim() == 0:
                    step = value  # the same count for every parameter
                else:
                    moments.setdefault(key, {})[name] = value.detach()
        shards, keys = self._shards, list(moments)
        if shards is not None:
            keys, step = shards.agreed(keys, step, self.device)
        state: dict[str, dict[str, torch.Tensor]] = {}
        for key in keys:
            by_name = moments.get(key, {})
            if shards is not None:  # each from the rank that keeps it, one moment at a time
                by_name = shards.everywhere(by_name)
            for hf_name, tensor in self._whole(by_name).items():
                entry = state.setdefault(hf_name, {})
                entry[key] = tensor.cpu()
                if step is not None:
                    entry["step"] = step.detach().cpu()
        # torch's own layout (get_optimizer_state_dict): a group names its parameters, by
        # the Hugging Face names the torch engine's parameters have.
        (group,) = optimizer.param_groups  # the learner makes one
        settings = {k: v for k, v in group.items() if k != "params"}
        return {"state": state, "param_groups": [settings | {"params": list(state)}]}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, whole: dict) -> None:
        """What :meth:`optimizer_state` gave, into ``optimizer`` (this rank its part)."""
        params = dict(self.gpt.named_parameters())
        by_key: dict[str, dict[str, torch.Tensor]] = {}
        step = None
        for hf_name, entry in whole["state"].items():
            for key, value in entry.items():
                if value.dim() == 0:
                    step = value
                else:
                    by_key.setdefault(key, {})[hf_name] = value
        for key, hf in by_key.items():
            for name, tensor in self._mine(hf).items():
                param = params[name]
                if self._shards is not None and not self._shards.owns(param):
                    continue  # its owner keeps it
                optimizer.state.setdefault(param, {})[key] = tensor.to(param.device, param.dtype)
                if step is not None:
                    optimizer.state[param]["step"] = step.clone()
        for group, saved in zip(optimizer.param_groups, whole["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})  # ours stay

    def _whole(self, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors shaped like this rank's parameters, whole and by Hugging Face name."""
        state = dict(local)
        if self.te:
            state = from_te_names(state, self.layout)
        if self.sizes.tensor > 1:
            state = merge_tensor_parallel(_all_gathered(state, self.sizes.tensor))
        if self.sizes.expert > 1:
            group = parallel_state.get_expert_model_parallel_group()
            state = gather_experts(state, group, self.sizes.expert)
        if self.stages is not None:
            every = _every_stage(state, self.stages, self.device)
            state = merge_pipeline_parallel(every, self.layout)
        return megatron_to_hf(state, self.layout)

    def _mine(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of whole tensors named by Hugging Face, by parameter name."""
        state = hf_to_megatron(hf, self.layout)
        if self.stages is not None:
            state = split_pipeline_parallel(state, self.layout, self.stages.count)
            state = state[self.stages.stage]
        if self.sizes.expert > 1:
            rank = parallel_state.get_expert_model_parallel_rank()
            state = split_expert_parallel(state, self.sizes.expert)[rank]
        if self.sizes.tensor > 1:
            rank = parallel_state.get_tensor_model_parallel_rank()
            state = split_tensor_parallel(state, self.sizes.tensor)[rank]
        return to_te_names(state, self.layout) if self.te else state


def _summed(squares: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack(squares).sum() if squares else torch.zeros((), device=device)


def _all_gathered(state: Mapping[str, torch.Tensor], ranks: int) -> list[dict[str, torch.Tensor]]:
    """Every tensor-parallel rank's ``state``, in rank order (a collective over them)."""
    group = parallel_state.get_tensor_model_parallel_group()
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name, tensor in state.items():
        parts = [torch.empty_like(tensor) for _ in range(ranks)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        for rank, part in enumerate(parts):
            shards[rank][name] = part
    return shards


def _every_stage(
    state: Mapping[str, torch.Tensor], stages: Stages, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """Every stage's ``state``, in stage order, on every stage (a collective over the
    pipeline group). The stages hold different tensors, so their names, shapes and
    dtypes go first, then each tensor from the stage that has it."""
    described = {name: (tuple(t.shape), t.dtype) for name, t in state.items()}
    every: list[dict] = [{} for _ in range(stages.count)]
    dist.all_gather_object(every, described, group=stages.group)
    out: list[dict[str, torch.Tensor]] = []
    for stage, names in enumerate(every):
        part = {}
        for name in sorted(names):
            shape, dtype = names[name]
            if stage == stages.stage:
                tensor = state[name].contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=stages.global_rank(stage), group=stages.group)
            part[name] = tensor
        out.append(part)
    return out


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)  # megatron's _extra_state entries are not


def load_megatron(
    path: str, dtype: torch.dtype, device: torch.device, section: MegatronSection
) -> tuple[MegatronLM, TextCodec]:
    """The model at ``path`` (a directory, or a packaged name) as a megatron model."""
    directory = model_dir(path)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    sizes = ParallelSizes.of(section)
    gpt = build_gpt(config, dtype, device, sizes)
    model = MegatronLM(config, gpt, sizes, section.distributed_optimizer)
    model.load_hf_state(read_weights(directory))
    return model, TextCodec.from_dir(directory)
