"""megatron-core's ``GPTModel`` built from a Hugging Face model directory, and presented
to the learner and the scorers as a model of Hugging Face weights.

How the model is built (layer spec, attention, rotary frequencies, process groups) is in
:mod:`.build`. Pipeline stages pass activations through :mod:`.stages`; a mixture of
experts (its router, token dispatcher and expert-parallel weights) is in :mod:`.experts`;
the distributed optimizer's split of AdamW's state in :mod:`.optimizer`; the weights by
Hugging Face name, whole, to and from this rank's part of them in :mod:`.hf_weights`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.moe.router_replay import RouterReplayAction
from torch import nn

from asyncrl.actors.policy.checkpoint import model_dir, read_weights
from asyncrl.actors.policy.model import Entropy, ModelConfig, entropy_of
from asyncrl.actors.policy.sampling import PLAIN, Sampling
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.runtime.contract.config import MegatronSection

from .experts import is_expert
from .gpt_build import ParallelSizes, build_gpt, layout_of, te_available
from .hf_weights import HfWeights
from .logprobs import gather_vocab, vocab_parallel_logprobs_and_entropy
from .optimizer import DistributedOptimizer, Share
from .schedule import one_forward_one_backward
from .stage_links import Stages

__all__ = ["MegatronLM", "load_megatron"]


class MegatronLM(HfWeights, nn.Module):
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
        # Training overlaps the stages (1F1B); False runs one micro-batch at a time through
        # them all, the schedule before 1F1B (kept for tests.bench.pipeline_schedule).
        self.overlap_stages = True
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
        sampling: Sampling = PLAIN,
        entropy: Entropy = "off",
        routes: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """log p(``targets`` [batch, k]) at ``columns`` of each row, float32, without any
        rank holding whole rows of logits (the vocabulary stays split); with ``entropy``
        other than "off", also each position's entropy of that distribution. ``routes``
        [layers, batch, tokens, per_token]: each token through those experts (router
        replay), their weights from this model's routers."""
        with self._replaying(routes):
            return self._token_logprobs(input_ids, columns, targets, sampling, entropy)

    @contextlib.contextmanager
    def _replaying(self, routes: torch.Tensor | None) -> Iterator[None]:
        """This stage's routers replay ``routes`` (megatron's RouterReplay) while inside.
        No replay is needed in backward: no layer's forward is recomputed there, and the
        gate weights' gather stays in the graph."""
        if routes is None:
            yield
            return
        routers = [layer.mlp.router for layer in self.gpt.decoder.layers]
        for layer, router in zip(self.gpt.decoder.layers, routers, strict=True):
            # megatron's tokens are [tokens, batch] flattened, ours [batch, tokens].
            mine = routes[layer.layer_number - 1].transpose(0, 1)
            router.router_replay.set_target_indices(mine.reshape(-1, mine.shape[-1]))
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        try:
            yield
        finally:
            for router in routers:
                router.router_replay.clear_indices()
                router.router_replay.clear_router_replay_action()

    def _token_logprobs(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor,
        targets: torch.Tensor,
        sampling: Sampling,
        entropy: Entropy,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if entropy == "off":

            def chosen(logits: torch.Tensor) -> torch.Tensor:
                return self._picked(logits, targets, sampling)[0]

            shape = tuple(targets.shape)
            return self._through_stages(input_ids, columns, chosen, shape, torch.float32)

        def both(logits: torch.Tensor) -> torch.Tensor:  # one tensor between the stages
            picked, spread = self._picked(logits, targets, sampling, entropy)
            return torch.stack([picked, spread], dim=-1)

        shape = (*targets.shape, 2)
        stacked = self._through_stages(input_ids, columns, both, shape, torch.float32)
        return stacked[..., 0], stacked[..., 1]

    def _stage_output(
        self, input_ids: torch.Tensor, received: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This stage's output for ``input_ids`` [batch, tokens]: the hidden states
        [tokens, batch, hidden] to send on, or on the last stage this rank's vocabulary
        slice of the logits [batch, tokens, slice]. ``received`` is the previous stage's
        output (None on the first)."""
        batch, tokens = input_ids.shape
        positions = torch.arange(tokens, device=input_ids.device).expand(batch, tokens)
        if received is not None:
            self.gpt.set_input_tensor(received)
        return self.gpt(input_ids, positions, None, runtime_gather_output=False)

    def _picked(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        sampling: Sampling,
        entropy: Entropy = "off",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(``targets``) from this rank's vocabulary slice of ``logits``, and the
        entropy of each row's distribution unless ``entropy`` is "off" (then None)."""
        group = None
        if self.sizes.tensor > 1:
            group = parallel_state.get_tensor_model_parallel_group()
        vocab = self.config.vocab_size
        if sampling.truncates:
            # Truncation ranks a row's whole vocabulary: the slices are joined (each
            # rank then holds whole rows, the price of truncating), padding columns cut.
            whole = logits if group is None else gather_vocab(logits, group)
            logprobs = sampling.logprobs(whole[..., :vocab], keep=targets)
            picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            if entropy == "off":
                return picked, None
            with torch.set_grad_enabled(entropy == "trained" and torch.is_grad_enabled()):
                return picked, entropy_of(logprobs)
        return vocab_parallel_logprobs_and_entropy(
            logits, targets, group, vocab, sampling.temperature, entropy
        )

    # --- training through pipeline stages ---------------------------------------------

    @property
    def pipelined(self) -> bool:
        """Whether training runs through :meth:`train_in_stages` (pipeline stages)."""
        return self.stages is not None and self.overlap_stages

    def train_in_stages(
        self,
        batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        loss_of: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor],
        sampling: Sampling,
        autocast: Callable[[], AbstractContextManager],
        entropy: Entropy = "off",
    ) -> None:
        """Forward and backward of every micro-batch (token ids, columns, targets, as
        :meth:`token_logprobs` takes them), the stages overlapping in 1F1B order. On the
        last stage ``loss_of(m, log-probs, entropies)`` gives micro-batch m's loss (the
        entropies None when ``entropy`` is "off"); the forward runs under ``autocast()``,
        the loss outside it."""
        stages = self.stages
        assert stages is not None

        def forward(m: int, received: torch.Tensor | None) -> torch.Tensor:
            input_ids, columns, targets = batches[m]
            with autocast():
                out = self._stage_output(input_ids, received)
                if not stages.last:
                    return out
                picked, spread = self._picked(_at(out, columns), targets, sampling, entropy)
            return loss_of(m, picked.float(), spread)

        def shape_of(m: int) -> tuple[int, ...]:
            batch, tokens = batches[m][0].shape  # megatron's activations: [tokens, batch, hidden]
            return (tokens, batch, self.config.hidden_size)

        one_forward_one_backward(stages, len(batches), shape_of, forward, self.dtype, self.device)

    def from_last_stage(self, tensor: torch.Tensor) -> None:
        """``tensor`` as the last stage has it, on every stage (in place; a collective)."""
        stages = self.stages
        assert stages is not None
        dist.broadcast(tensor, src=stages.last_rank, group=stages.group)

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
        stages = self.stages
        received = None
        if stages is not None and not stages.first:
            # megatron's activations between layers are [tokens, batch, hidden]
            hidden = (tokens, batch, self.config.hidden_size)
            received = stages.receive(hidden, self.dtype, self.device)
        out = self._stage_output(input_ids, received)
        if stages is not None and not stages.last:
            link = stages.send(out.to(self.dtype))
            return stages.from_last(None, link, shape, dtype)
        if columns is not None:
            out = _at(out, columns)
        result = head(out).to(dtype)
        return result if stages is None else stages.from_last(result, None, shape, dtype)

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


def _summed(squares: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack(squares).sum() if squares else torch.zeros((), device=device)


def _at(out: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Rows of ``out`` [batch, tokens, ...] at ``columns`` [batch, k] of each row."""
    return out[torch.arange(out.shape[0], device=out.device)[:, None], columns]


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
