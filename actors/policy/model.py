"""A decoder-only transformer of the Llama / Mistral / Qwen2 / Qwen3 / Qwen3-MoE
families, with Hugging Face parameter names.

One implementation serves every role, so the generator's behaviour log-probs and the
trainer's recomputed ones come from the same arithmetic. Parameter names match
``transformers``' ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM`` and the checkpoints of ``Qwen3MoeForCausalLM`` (one module per
expert, as those files name them) exactly, so a checkpoint loads in either direction
without renaming. The families' differences are switches of :class:`ModelConfig` (config.py).
Rotary positions are rotary.py's, the MLP and the mixture of experts feed_forward.py's.

Two ways in:

- :meth:`CausalLM.forward`: whole right-padded sequences, causal attention (train, logp);
- :meth:`CausalLM.step`: new tokens of many independent sequences against a
  :class:`KVCache`, each at its own position (the continuous-batching decoder).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from .attention_runs import attention_runs
from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .feed_forward import MLP, MixtureOfExperts, Routing
from .rotary import Rotary, rotate
from .sampling import PLAIN, Sampling

if TYPE_CHECKING:
    from .adapters import MergedAdapters

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "CausalLM",
    "Decoder",
    "Entropy",
    "KVCache",
    "ModelConfig",
    "Routing",
    "entropy_of",
]


class KVCache:
    """Keys and values for ``slots`` sequences of up to ``max_len`` tokens each.

    Laid out [layer, slot, position, head, dim]: slot and position side by side make
    writing one token per sequence a single indexed copy.
    """

    def __init__(
        self,
        config: ModelConfig,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        shape = (config.num_hidden_layers, slots, max_len, config.num_key_value_heads)
        self.keys = torch.zeros(*shape, config.head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(*shape, config.head_dim, dtype=dtype, device=device)
        self.max_len = max_len


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        inner, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.output_bias)
        if config.qk_norm:  # Qwen3: each head's query and key RMS-normed before rotary
            self.q_norm = _RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = _RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotate(q.transpose(1, 2), *rope), rotate(k.transpose(1, 2), *rope), v

    def _out(self, attended: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, -1))

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Causal attention over ``x``; ``mask`` [tokens, tokens] replaces plain causality
        (a sliding window)."""
        q, k, v = self._project(x, rope)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
        return self._out(attended)

    def step(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        rows_of: slice | torch.Tensor,
        runs: list[tuple[int, int, int]] | None = None,
    ) -> torch.Tensor:
        """Attend new tokens (at ``positions`` of ``slots``) to the cached keys ``visible``
        [rows, tokens, span] to them; ``rows_of`` picks the slots' rows of the cache.
        ``runs`` (first row, end row, span): rows that attend together, each run over its
        own span (attention_runs.py); None: all rows over the whole of ``visible``."""
        q, k, v = self._project(x, rope)
        keys, values = cache
        rows = slots[:, None].expand_as(positions)
        keys[rows, positions] = k.transpose(1, 2)
        values[rows, positions] = v.transpose(1, 2)
        # The query heads that share a key/value head become that head's rows, so that
        # attention runs one head per key/value head: no copy of the cache per query head
        # (SDPA's enable_gqa with a mask falls back to the kernel that makes one on CUDA).
        count, _, tokens, dim = q.shape
        group = self.heads // self.kv_heads
        q = q.reshape(count, self.kv_heads, group * tokens, dim)
        parts = []
        for first, end, span in runs or [(0, count, visible.shape[-1])]:
            n = end - first
            cached = _rows(rows_of, first, end)
            mask = visible[first:end, None, None, :, :span].expand(n, 1, group, tokens, span)
            parts.append(
                F.scaled_dot_product_attention(
                    q[first:end],
                    keys[cached, :span].transpose(1, 2),
                    values[cached, :span].transpose(1, 2),
                    attn_mask=mask.reshape(n, 1, group * tokens, span),
                )
            )
        attended = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self._out(attended.reshape(count, self.heads, tokens, dim))


def _rows(rows_of: slice | torch.Tensor, first: int, end: int) -> slice | torch.Tensor:
    """Rows ``first:end`` of a step's rows of the cache (a slice stays a slice: a view)."""
    if isinstance(rows_of, slice):
        return slice(rows_of.start + first, rows_of.start + end)
    return rows_of[first:end]


def _run(slots: torch.Tensor) -> slice | None:
    """``slots`` (in CPU memory) as a slice when they are consecutive and ascending: a run
    of the cache is read as a view, not a copy."""
    first, last = int(slots[0]), int(slots[-1])
    if last - first + 1 == len(slots) and bool((slots[1:] > slots[:-1]).all()):
        return slice(first, last + 1)
    return None


class _Layer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = MLP(config) if config.experts is None else MixtureOfExperts(config)
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        attend: Callable[[_Attention, torch.Tensor], torch.Tensor],
        replay: torch.Tensor | None = None,
        recorded: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``replay``/``recorded``: this layer's routes (see :class:`Routing`)."""
        x = x + attend(self.self_attn, self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, MixtureOfExperts):
            return x + self.mlp(h, replay, recorded)
        return x + self.mlp(h)


class _Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    """The decoder stack a head reads: token ids in, final-normed hidden states out. The
    language model (:class:`CausalLM`) and the critic's value model share it, so any
    family the policy runs in also gives a critic."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Backbone(config)
        self.rotary = Rotary(config)
        self.windows = [config.window(i) for i in range(config.num_hidden_layers)]
        # Training only: recompute each layer in backward instead of keeping its activations
        # (model.gradient_checkpointing), about a third more compute for far less memory.
        self.gradient_checkpointing = False

    def hidden(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor | None = None,
        routing: Routing | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [batch, tokens, hidden] of right-padded sequences
        (padding never leaks back); ``columns`` [batch, k]: only those positions' states.
        ``routing``: the experts to route through, or to record (a mixture of experts)."""
        batch, tokens = input_ids.shape
        device = input_ids.device
        positions = torch.arange(tokens, device=device).expand(batch, tokens)
        rope = self.rotary(positions)
        # None: plain causal attention, which SDPA does without a mask tensor.
        masks = {
            w: None if w is None else _sliding_mask(tokens, w, device) for w in set(self.windows)
        }
        x = self.model.embed_tokens(input_ids)
        recompute = self.gradient_checkpointing and torch.is_grad_enabled()
        recorded = None if routing is None else routing.recorded
        for i, (layer, window) in enumerate(zip(self.model.layers, self.windows, strict=True)):
            mask = masks[window]
            replay = None if routing is None else routing.layer(i)

            def attend(attn, h, mask=mask):
                return attn(h, rope, mask)

            # Recomputing keeps only each layer's input; the rest comes back in backward.
            if recompute:
                x = checkpoint(layer, x, attend, replay, recorded, use_reentrant=False)
            else:
                x = layer(x, attend, replay, recorded)
        if columns is not None:
            x = x[torch.arange(batch, device=device)[:, None], columns]
        return self.model.norm(x)


class CausalLM(Decoder):
    """The model: token ids in, next-token logits out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.lm_head = _OutputLayer(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A LoRA run's generators and scorers: versions are adapters, merged onto the base
        # weights these keep (adapters.py); None: versions are whole weights.
        self.adapters: MergedAdapters | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        sampling: Sampling = PLAIN,
        entropy: Entropy = "off",
        routing: Routing | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [batch, tokens, vocab] of right-padded sequences (padding never leaks back).

        ``columns`` [batch, k]: only the logits at those positions of each row, [batch, k,
        vocab]. Scoring a response needs none of its prompt's, and at a vocabulary of
        tens of thousands the logits are most of a step's activations.

        ``targets`` [batch, k] (with ``columns``): instead of logits, the float32
        log-probability of each target token at its column under the distribution
        ``sampling`` draws from those logits (sampling.py). Then no more than
        :data:`HEAD_CHUNK_ELEMENTS` logits exist at once (see :class:`_OutputLayer`).
        ``entropy`` (with ``targets``): also the entropy of that distribution at each
        column, ``(log-probs, entropies)``; see :data:`Entropy`. ``routing``: the experts
        each token goes through, or a record of them (:class:`Routing`).
        """
        h = self.hidden(input_ids, columns, routing)
        if targets is not None:
            return self.lm_head(h, targets, sampling, entropy)
        return self.lm_head(h)

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        weight = self.lm_head.weight
        return KVCache(self.config, slots, max_len, weight.dtype, weight.device)

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: KVCache,
        span: int | None = None,
        recorded: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits [rows, tokens, vocab] for ``input_ids`` [rows, tokens] placed at ``positions``
        of cache ``slots`` [rows]; each token sees its slot's cache up to its own position
        (within its layer's sliding window, if any).

        ``positions`` and ``slots`` may be in CPU memory whatever the model's device (the
        decoder passes them so): what the step's shapes depend on is then read without
        waiting for the device, which can go on with the previous step meanwhile.
        ``span`` fixes how many cache positions are attended over (masked beyond each
        row's own), so that nothing is read back from the device: a step captured in a
        CUDA graph (graphs.py) passes the cache's length, the decoder its rows' longest
        real prefix (padding tokens sit at the cache's last position, beyond it).
        ``recorded``: each mixture-of-experts layer's chosen experts [rows, tokens,
        per_token] are appended to it, in order (router replay's record).
        """
        device = input_ids.device
        # Attend over the longest prefix any row needs, not the whole cache.
        longest = span if span is not None else int(positions.max()) + 1
        rows_of = _run(slots) if slots.device.type == "cpu" else None
        positions = positions.to(device, non_blocking=True)
        slots = slots.to(device, non_blocking=True)
        if rows_of is None:
            rows_of = slots
        # On CPU, a decode step's rows attend in runs of like length (attention_runs.py); a
        # GPU's one kernel for all rows costs less than several calls would.
        runs = None
        if device.type == "cpu" and positions.shape[1] == 1:
            runs = attention_runs([p + 1 for p in positions[:, 0].tolist()])
        rope = self.rotary(positions)
        span = torch.arange(longest, device=device)
        causal = span[None, None, :] <= positions[:, :, None]  # [rows, tokens, span]
        visible = {
            w: causal if w is None else causal & (span > positions[..., None] - w)
            for w in set(self.windows)
        }
        x = self.model.embed_tokens(input_ids)
        with sdpa_kernel(_DECODE_ATTENTION):
            for i, layer in enumerate(self.model.layers):
                kv, seen = (cache.keys[i], cache.values[i]), visible[self.windows[i]]
                x = layer(
                    x,
                    lambda attn, h, kv=kv, seen=seen: attn.step(
                        h, rope, kv, slots, positions, seen, rows_of, runs
                    ),
                    recorded=recorded,
                )
        return self.lm_head(self.model.norm(x))


# Logits the output layer makes at once when only chosen tokens' log-probs are wanted:
# 2**30 float32 values are 4 GiB, about 7,070 tokens of a 151,936-token vocabulary. Each
# chunk costs its output layer's product once more in backward (on an H100, a 0.5B model's
# step with 1 GiB chunks took 0.551 s and 24.0 GiB against 0.510 s and 31.2 GiB unchunked,
# in one run), so chunks start only where whole logits would take more than this: a
# response of 8,192 tokens alone would hold 5 GB of float32 logits, and as much again of
# what their log-softmax keeps for backward.
HEAD_CHUNK_ELEMENTS = 2**30
TRUNCATION_MEMORY = 8  # about how many logits' worth of memory a truncated row takes

# Whether the output layer also gives each scored position's entropy: "off"; "measured"
# (computed without gradient: a metric, kept for backward by nothing); "trained" (with
# gradient: an entropy bonus in the loss).
Entropy = Literal["off", "measured", "trained"]


class _OutputLayer(nn.Linear):
    """The output layer (``lm_head``): logits, or with ``targets`` the log-probs of those
    tokens (:func:`_head_logprobs`). Both in its own forward, so that when FSDP shards it
    its weight is gathered once for all the chunks, and once more in backward for their
    recompute, whatever the number of chunks (which differs between ranks)."""

    def forward(
        self,
        x: torch.Tensor,
        targets: torch.Tensor | None = None,
        sampling: Sampling = PLAIN,
        entropy: Entropy = "off",
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if targets is None:
            return super().forward(x)
        return _head_logprobs(self.weight, x, targets, sampling, entropy)


def _head_logprobs(
    weight: torch.Tensor,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    sampling: Sampling,
    entropy: Entropy = "off",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log_softmax(hidden @ weight.T / temperature)[target], float32, shaped like
    ``targets``; with top-k or top-p, over the tokens they keep (the target always among
    them: see ``sampled_logprobs``). With ``entropy`` other than "off", also the entropy
    of that same distribution at each position (:func:`entropy_of`), shaped alike.

    Tokens go through the output layer in chunks of at most HEAD_CHUNK_ELEMENTS logits.
    When gradients are wanted each chunk is recomputed in backward instead of kept (one
    more product of the output layer: the price of never holding every token's logits).
    """
    rows, k, size = hidden.shape
    flat, wanted = hidden.reshape(rows * k, size), targets.reshape(rows * k)

    def chunk_logprobs(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, weight)
        # log_softmax, not gather minus logsumexp: its backward is one fused kernel where
        # logsumexp's makes two more vocabulary-wide tensors (3.4 GiB more at the peak of
        # a 0.5B model's step on an H100).
        logprobs = sampling.logprobs(logits, keep=t if sampling.truncates else None)
        picked = logprobs.gather(-1, t[:, None]).squeeze(-1)
        if entropy == "off":
            return picked
        # From the log-probs the chosen tokens' come from: no second pass over the
        # vocabulary's logits. "measured" keeps nothing more for backward.
        with torch.set_grad_enabled(entropy == "trained" and torch.is_grad_enabled()):
            spread = entropy_of(logprobs, truncated=sampling.truncates)
        return torch.stack([picked, spread], dim=-1)

    if entropy != "off":
        both = _in_chunks(chunk_logprobs, flat, wanted, weight.shape[0], sampling)
        return both[:, 0].view(rows, k), both[:, 1].view(rows, k)
    return _in_chunks(chunk_logprobs, flat, wanted, weight.shape[0], sampling).view(rows, k)


def entropy_of(logprobs: torch.Tensor, truncated: bool = True) -> torch.Tensor:
    """``-sum(p * log p)`` over the last dimension of log-probs; ``truncated``: they may
    hold -inf (tokens truncation left out: those add 0, and no NaN reaches a gradient).

    A batched dot product rather than a product then a sum: no third vocabulary-wide
    tensor beside the log-probs and their exponentials."""
    finite = logprobs.masked_fill(torch.isinf(logprobs), 0.0) if truncated else logprobs
    dot = logprobs.exp().unsqueeze(-2) @ finite.unsqueeze(-1)
    return -dot.squeeze(-1).squeeze(-1)


def _in_chunks(
    chunk_logprobs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    flat: torch.Tensor,
    wanted: torch.Tensor,
    vocab: int,
    sampling: Sampling,
) -> torch.Tensor:
    """``chunk_logprobs`` over ``flat``'s tokens, a chunk of logits at a time."""
    # Truncating sorts each row: its values, their int64 order and the probabilities take
    # several times the logits' memory, so chunks are that much smaller.
    budget = HEAD_CHUNK_ELEMENTS // (TRUNCATION_MEMORY if sampling.truncates else 1)
    step = max(1, budget // vocab)
    if flat.shape[0] <= step:
        return chunk_logprobs(flat, wanted)
    recompute = torch.is_grad_enabled()
    parts = []
    for start in range(0, flat.shape[0], step):
        h, t = flat[start : start + step], wanted[start : start + step]
        if recompute:
            parts.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False))
        else:
            parts.append(chunk_logprobs(h, t))
    return torch.cat(parts)


# Not cuDNN's attention for decode steps: it builds an execution plan for every new shape,
# and a decode step's shapes change at every step (the span grows, sequences come and go).
# On an H100 that was 2.5 ms of CPU per layer and step: 61% of a 0.5B model's CPU time.
_DECODE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _sliding_mask(tokens: int, window: int, device: torch.device) -> torch.Tensor:
    """[tokens, tokens]: query i sees keys i - window + 1 .. i (transformers' convention)."""
    span = torch.arange(tokens, device=device)
    query, key = span[:, None], span[None, :]
    return (key <= query) & (key > query - window)
