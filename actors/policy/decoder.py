"""A continuous-batching decoder: many sequences share a KV cache, each at its own length.

Sequences wait in a queue; every :meth:`Decoder.step` first admits waiting sequences
into free cache slots, then advances every active sequence by one token. A sequence that
ends frees its slot for the next waiting one at the very next step, so short responses
never hold the batch for the longest one (the long tail).

Weights change between steps (:meth:`Decoder.load`). Sequences in flight are not
dropped: their cached keys and values are recomputed under the new weights at the next
step, then they go on. Every sampled token records the policy version whose
distribution it was drawn from, and that distribution's log-probability of it, so a
trainer recomputing log-probs of the same version gets the same numbers. The distribution
is the logits tempered and truncated (min-p, top-k, top-p) as sampling.py defines it, the
scorers' definition too: the request's settings, or the decoder's where it names none. A
request with a seed draws from a generator of its own.

A response ends with an end-of-sequence or stop id, or with the token that completes one
of the decoder's stop texts (``stop``) in its decoded text: the response is every token up
to and including that one, all of them trained, the text after the stop text within that
token too. Every engine's decoder ends a response so, through :class:`StopTexts`, on the
text our codec decodes (not an engine's own detokenizer), so that the same tokens end the
same response whichever engine samples them.

Each slot keeps its tokens and how many of them are in the cache ("fed"). One step feeds
each slot its unfed tokens (one, usually; a whole prompt for a new sequence; everything
after a reload) and samples a next token from the last position's logits.

Two things keep a step's work to what its sequences need. The running sequences hold the
cache's first slots, with no gaps: a sequence that ends hands its slot to the one in the
last slot (a copy of that sequence's cached prefix), so that a step reads its rows of the
cache as a view, not a copy (on CPU a gathered copy of the cache took half of each
decode step of the long-tail run). And sequences catching up (new prompts, or every
sequence after a reload) are fed in runs of like length, each run padded only to its own
longest: a reload lays the sequences out longest first, so the runs come out sorted, and
new sequences (the shortest) join at the end, so that a decode step's rows stay roughly
by length too, for attention in runs of like span (attention_runs.py).

A conversation's next turn extends its last one: its prompt is that turn's prompt and
response, then new tokens (a tool's answer, the user's next message). A request that asks
for it (``keep_cache``) leaves its cached prefix in its slot when it ends (kept_caches.py);
a later prompt that starts with the same tokens takes those keys and values (copied into
its own slot, unless it is that very slot) and is fed only the rest. Kept slots are free:
a new sequence that needs one moves the kept prefix to an empty slot, or else the least
recently used is dropped; a sequence moving down to close a gap trades places with a kept
one in the way; a new version drops them all (they are the old weights' keys and values).
``prompt_tokens``, ``cached_prompt_tokens`` and ``fed_tokens`` count what was asked for,
what was reused and what was computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .checkpoint import load_state
from .graphs import GraphedSteps
from .kept_caches import Kept, KeptCaches
from .model import CausalLM
from .padding import like_width_runs
from .sampling import PLAIN, Sampling, sampled_logprobs, sampling_problem

__all__ = [
    "Decoder",
    "Decoding",
    "Finished",
    "Request",
    "StopTexts",
    "check_request",
    "end_ids",
    "route_dtype",
]

# Sequences catching up are fed in runs padded to at most this many times their tokens.
CATCH_UP_SLACK = 1.25
# Tokens decoded beyond a stop text's length in characters when looking for it at a
# response's end: a token holds at least one character, and a window that starts inside
# a character's bytes decodes them as replacement characters.
STOP_MARGIN_TOKENS = 4
# A prompt reuses a kept cache when they share at least this many leading tokens: fewer
# are not worth a copy, nor refreshing that cache's place in the eviction order.
REUSE_MIN_TOKENS = 8


@dataclass(frozen=True)
class Request:
    """One sequence to generate: a prompt, and how to pick tokens and when to stop."""

    tag: Any  # the caller's handle for the result
    prompt: tuple[int, ...]
    greedy: bool = False
    max_new_tokens: int | None = None  # fewer than the decoder's (a turn's share of a budget)
    # Tokens that end this sequence besides end-of-sequence (a tool call's closing token):
    # the sequence ends with it, and the caller decides what comes next.
    stop_ids: frozenset[int] = frozenset()
    # Ends this sequence when it says so of the response so far (an API caller's stop text,
    # which may span tokens); asked after every token.
    stop_when: Callable[[list[int]], bool] | None = None
    # How this sequence samples (sampling.py); None: the decoder's. A greedy one ignores them.
    temperature: float | None = None
    top_p: float | None = None  # 1: the whole distribution
    top_k: int | None = None  # 0: every token
    min_p: float | None = None  # 0: off
    # Draws this sequence's tokens from a generator of its own, seeded so: the same seed
    # gives the same tokens whatever other sequences share its steps. None: the decoder's.
    seed: int | None = None
    # Keep this sequence's cached prefix when it ends, for a next turn that extends it
    # (a conversation's); engines with a prefix cache of their own ignore it.
    keep_cache: bool = False


def end_ids(eos_id: int | Collection[int]) -> frozenset[int]:
    """The ids that end a response: one, or several (a chat model may end with any of
    them); ValueError for none."""
    ids = frozenset([eos_id] if isinstance(eos_id, int) else eos_id)
    if not ids:
        raise ValueError("eos_id: expected at least one end-of-sequence id")
    return ids


def check_request(request: Request, max_prompt_tokens: int) -> None:
    """ValueError naming what is wrong with ``request`` for a decoder of that prompt limit."""
    if not 0 < len(request.prompt) <= max_prompt_tokens:
        raise ValueError(
            f"prompt of {len(request.prompt)} tokens: expected 1.."
            f"{max_prompt_tokens} (raise model.max_prompt_tokens)"
        )
    if request.max_new_tokens is not None and request.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={request.max_new_tokens}: expected >= 1")
    # Each given field alone: a field left None stands for the decoder's valid default.
    problem = sampling_problem(
        1.0 if request.temperature is None else request.temperature,
        1.0 if request.top_p is None else request.top_p,
        0 if request.top_k is None else request.top_k,
        0.0 if request.min_p is None else request.min_p,
    )
    if problem is not None:
        raise ValueError(problem)
    seed = request.seed
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"seed={seed!r}: expected an integer >= 0")
    if seed is not None and seed >= 2**64:
        raise ValueError(f"seed={seed}: expected below 2**64")


class StopTexts:
    """Whether a response so far ends a stop text: one of ``texts`` is in the decoded text
    of its last tokens. Asked after every token, so the first token that completes one
    ends the response."""

    def __init__(self, texts: Iterable[str], decode: Callable[[list[int]], str]) -> None:
        self.texts = tuple(texts)
        if not self.texts or not all(isinstance(t, str) and t for t in self.texts):
            raise ValueError(f"stop={self.texts!r}: expected one or more non-empty texts")
        self.decode = decode
        self.window = max(len(t) for t in self.texts) + STOP_MARGIN_TOKENS

    def __call__(self, response: list[int]) -> bool:
        text = self.decode(response[-self.window :])
        return any(t in text for t in self.texts)

    @classmethod
    def of(
        cls, texts: Iterable[str], decode: Callable[[list[int]], str] | None
    ) -> StopTexts | None:
        """The rule for ``texts``, None for none; ValueError if there are texts but no
        ``decode`` to find them with."""
        texts = tuple(texts)
        if not texts:
            return None
        if decode is None:
            raise ValueError(f"stop={texts!r}: stop texts need decode= (the codec's)")
        return cls(texts, decode)


def ends_by_rule(request: Request, stop_texts: StopTexts | None, response: list[int]) -> bool:
    """Whether ``response`` ends by a rule beyond its last token's id: the decoder's stop
    texts or the request's own ``stop_when``."""
    if stop_texts is not None and stop_texts(response):
        return True
    return request.stop_when is not None and request.stop_when(response)


@dataclass(frozen=True)
class Finished:
    """A generated response: per token, its id, log-probability and policy version."""

    tag: Any
    prompt: tuple[int, ...]
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    truncated: bool  # stopped by the length limit rather than end-of-sequence or a stop id
    stopped_by: int | None = None  # the end-of-sequence or stop id it ended with
    # Router replay's record (a decoder that records them): the experts each mixture-of-
    # experts layer chose for every token the model read, [prompt + response - 1, layers,
    # per_token] (the last token is sampled, never read); None: not recorded.
    routes: np.ndarray | None = None
    # Leading prompt tokens whose keys and values came from a kept cache, not computed.
    cached_tokens: int = 0


@runtime_checkable
class Decoding(Protocol):
    """What episodes, validation and the served API use of a decoder: :class:`Decoder`'s
    public surface, which another engine's decoder has too (``backends.generate``)."""

    max_new_tokens: int
    max_prompt_tokens: int

    @property
    def version(self) -> int: ...

    def submit(self, requests: Iterable[Request]) -> None: ...

    def step(self) -> list[Finished]: ...

    def cancel(self, tags: Collection[Any]) -> None: ...

    def close(self) -> None: ...

    @property
    def busy(self) -> bool: ...

    @property
    def free_slots(self) -> int: ...

    def load(
        self, state: Mapping[str, torch.Tensor], version: int, *, copy: bool = True
    ) -> list[torch.Tensor]: ...


@dataclass
class _Sequence:
    request: Request
    tokens: list[int]  # prompt + response so far
    fed: int = 0  # leading tokens whose keys/values are in the cache
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    sampling: Sampling = PLAIN  # the request's, or the decoder's (the same object)
    generator: torch.Generator | None = None  # a seeded request's own
    routes: np.ndarray | None = None  # [context, layers, per_token]: see Finished.routes
    cached: int = 0  # leading prompt tokens taken from a kept cache

    @property
    def response(self) -> list[int]:
        return self.tokens[len(self.request.prompt) :]


class Decoder:
    """Generates from ``model`` for up to ``slots`` sequences at a time."""

    def __init__(
        self,
        model: CausalLM,
        *,
        slots: int,
        max_new_tokens: int,
        max_prompt_tokens: int,
        eos_id: int | Collection[int],
        pad_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        stop: tuple[str, ...] = (),
        decode: Callable[[list[int]], str] | None = None,
        seed: int = 0,
        version: int = 0,
        cuda_graphs: bool = False,
        record_routes: bool = False,
        reuse_min_tokens: int = REUSE_MIN_TOKENS,
    ) -> None:
        """``stop``: texts that end every response (:class:`StopTexts`), found with
        ``decode`` (token ids to text). ``record_routes``: each finished sequence carries
        the experts its tokens were routed to (:attr:`Finished.routes`; a
        mixture-of-experts model). ``reuse_min_tokens``: the fewest leading tokens a
        prompt must share with a kept cache to take it."""
        # The defaults of requests that name none (ValueError naming a bad one).
        self.sampling = Sampling(temperature, top_p, top_k, min_p)
        self.stop_texts = StopTexts.of(stop, decode)
        self.model = model.eval()
        self.slots = slots
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.eos_ids = end_ids(eos_id)
        self.pad_id = pad_id
        self.version = version
        self.device = model.lm_head.weight.device  # inputs go there; tokens come back
        # CUDA graphs (graphs.py) only where they can run: on a GPU, for a model whose
        # step reads nothing back to the host (not a mixture of experts).
        graphed = cuda_graphs and self.device.type == "cuda" and model.config.experts is None
        # A graphed step's padding rows write to one more slot, which no sequence takes.
        spare = 1 if graphed else 0
        self.cache = model.new_cache(slots + spare, max_prompt_tokens + max_new_tokens)
        self.graphed = GraphedSteps(model, self.cache, slots) if graphed else None
        self.generator = torch.Generator(self.device).manual_seed(seed)
        experts = model.config.experts
        if record_routes and experts is None:
            raise ValueError("record_routes: the model has no mixture-of-experts layers")
        self.routes_dtype = (
            None if not record_routes else route_dtype(experts.count)  # type: ignore[union-attr]
        )
        self.waiting: deque[Request] = deque()
        self.active: dict[int, _Sequence] = {}  # slot → sequence
        self.kept = KeptCaches(reuse_min_tokens)  # free slots' finished sequences
        self.prompt_tokens = 0  # of the sequences admitted
        self.cached_prompt_tokens = 0  # of those, taken from a kept cache
        self.fed_tokens = 0  # tokens the model computed keys and values for

    # --- the caller's side ------------------------------------------------------------

    def submit(self, requests: Iterable[Request]) -> None:
        for request in requests:
            check_request(request, self.max_prompt_tokens)
            if request.tag in self._tags():
                raise ValueError(f"request {request.tag!r} is already running")
            self.waiting.append(request)

    def _tags(self) -> set[Any]:
        return {r.tag for r in self.waiting} | {s.request.tag for s in self.active.values()}

    def cancel(self, tags: Collection[Any]) -> None:
        """Drop the sequences tagged ``tags``, waiting or running (their group failed)."""
        self.waiting = deque(r for r in self.waiting if r.tag not in tags)
        for slot in [s for s, seq in self.active.items() if seq.request.tag in tags]:
            del self.active[slot]
        self._close_gaps()

    def close(self) -> None:
        """Drop every sequence (a new decoder replaces this one)."""
        self.waiting.clear()
        self.active.clear()
        self.kept.clear()

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    @property
    def free_slots(self) -> int:
        """Slots that no sequence, running or waiting, will take."""
        return self.slots - len(self.active) - len(self.waiting)

    @torch.no_grad()
    def load(
        self, state: Mapping[str, torch.Tensor], version: int, *, copy: bool = True
    ) -> list[torch.Tensor]:
        """Take new weights now; sequences in flight go on under them from the next token.

        ``copy=False`` runs the model on ``state``'s own tensors and returns the ones it
        ran on before (see ``load_state``).
        """
        superseded = load_state(self.model, state, copy=copy)
        self.version = version
        self.kept.clear()
        # Every cache entry was computed by the old weights: all are recomputed, so the
        # sequences may take any slots. Longest first, so that catching up runs by length,
        # and so do decode steps' attention runs: new sequences, the shortest, come last.
        running = sorted(self.active.values(), key=lambda seq: -len(seq.tokens))
        for sequence in running:
            sequence.fed = 0
        self.active = dict(enumerate(running))
        return superseded

    # Inference mode, not just no_grad: no version counters or view tracking on the
    # decode path's small tensors (measured 8-14% less CPU per step's generation here).
    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """Admit waiting sequences, advance every active one by a token; return those done."""
        self._admit()
        if not self.active:
            return []
        # Ascending slot order lets the model read a run of slots from the cache as a view.
        slots = sorted(self.active)
        unfed = {s: len(self.active[s].tokens) - self.active[s].fed for s in slots}
        catching_up = [s for s in slots if unfed[s] > 1]
        current = [s for s in slots if unfed[s] == 1]
        finished: list[Finished] = []
        widths = [unfed[s] for s in catching_up]
        apart = [i > 0 and s != catching_up[i - 1] + 1 for i, s in enumerate(catching_up)]
        for run in like_width_runs(widths, CATCH_UP_SLACK, apart=apart):
            finished += self._advance([catching_up[i] for i in run])
        if current:
            finished += self._advance(current)
        self._close_gaps()
        return finished

    # --- inside a step ------------------------------------------------------------------

    def _close_gaps(self) -> None:
        """Move the sequences in the last slots into the free slots below them (their
        cached prefix with them), so that the running sequences hold slots 0..n-1. A kept
        cache in such a free slot trades places with the sequence."""
        keys, values = self.cache.keys, self.cache.values
        holes = (slot for slot in range(len(self.active)) if slot not in self.active)
        for hole in holes:
            last = max(self.active)
            sequence = self.active.pop(last)
            kept = self.kept.slots.get(hole)
            if kept is not None:
                size = len(kept.tokens)
                saved = keys[:, hole, :size].clone(), values[:, hole, :size].clone()
            self._copy_rows(last, hole, sequence.fed)
            if kept is not None:
                keys[:, last, :size], values[:, last, :size] = saved
                self.kept.move(hole, last)
            self.active[hole] = sequence

    def _copy_rows(self, source: int, target: int, count: int) -> None:
        """The first ``count`` cached positions of slot ``source`` into slot ``target``."""
        keys, values = self.cache.keys, self.cache.values
        keys[:, target, :count] = keys[:, source, :count]
        values[:, target, :count] = values[:, source, :count]

    def _admit(self) -> None:
        free = [slot for slot in range(self.slots) if slot not in self.active]
        count = min(len(free), len(self.waiting))
        requests = [self.waiting.popleft() for _ in range(count)]
        places = self._places(requests, free[:count])
        for done, (slot, request, _) in enumerate(places):
            sequence = self._sequence_of(request)
            # The kept caches the requests still to place will read stay; the slots
            # they will take are no place to move a kept cache to.
            later = places[done + 1 :]
            needed = {kept for _, _, kept in later if kept is not None}
            self._take_kept(slot, sequence, needed, {s for s, _, _ in later})
            self.active[slot] = sequence
            self.prompt_tokens += len(request.prompt)
            self.cached_prompt_tokens += sequence.cached

    def _places(
        self, requests: list[Request], slots: list[int]
    ) -> list[tuple[int, Request, Kept | None]]:
        """The slot each request takes, and the kept cache it will read (if any): the slot
        that cache is in, if that is among ``slots`` (no copy), the others the rest in
        order. Those in their cache's slot come first: they move nothing that the others
        might read."""
        if not self.kept:
            return [(slot, request, None) for slot, request in zip(slots, requests, strict=True)]
        targets = set(slots)
        at_home: dict[int, tuple[Request, Kept]] = {}
        elsewhere: list[tuple[Request, Kept | None]] = []
        for request in requests:
            found = self.kept.best(np.asarray(request.prompt), prefer=targets)
            kept = None if found is None else self.kept.slots[found[0]]
            if found is not None and found[0] in targets and found[0] not in at_home:
                at_home[found[0]] = request, kept
            else:
                elsewhere.append((request, kept))
        rest = [s for s in slots if s not in at_home]
        return [(slot, request, kept) for slot, (request, kept) in at_home.items()] + [
            (slot, request, kept) for slot, (request, kept) in zip(rest, elsewhere, strict=True)
        ]

    def _sequence_of(self, request: Request) -> _Sequence:
        sequence = _Sequence(request, list(request.prompt), sampling=self._sampling_of(request))
        if request.seed is not None:
            sequence.generator = torch.Generator(self.device).manual_seed(request.seed)
        if self.routes_dtype is not None:
            # Room for the tokens this sequence may read: its prompt and its budget.
            config = self.model.config
            budget = min(self.max_new_tokens, request.max_new_tokens or self.max_new_tokens)
            tokens = len(request.prompt) + budget
            shape = (tokens, config.num_hidden_layers, config.experts.per_token)
            sequence.routes = np.zeros(shape, self.routes_dtype)
        return sequence

    def _take_kept(
        self, slot: int, sequence: _Sequence, needed: set[Kept], reserved: set[int]
    ) -> None:
        """Before ``sequence`` runs in ``slot``: the longest kept prefix of its prompt
        becomes its cache, and the kept cache in the slot, if any, leaves it (``needed``:
        kept caches to spare; ``reserved``: slots to leave empty)."""
        prompt = sequence.request.prompt
        found = self.kept.best(np.asarray(prompt), prefer=(slot,)) if self.kept else None
        # The last prompt token is fed all the same: its logits give the first new token.
        reused = 0 if found is None else min(found[1], len(prompt) - 1)
        if found is None or reused == 0:
            self._vacate(slot, needed, reserved)
            return
        source = found[0]
        kept = self.kept.slots[source]
        if source != slot:
            self._vacate(slot, needed | {kept}, reserved)
            self._copy_rows(source, slot, reused)
            self.kept.touch(source)
        elif found[1] == len(kept.tokens) and kept not in needed:
            # This prompt extends it, and no other one reads it: this sequence will keep
            # more than it holds.
            self.kept.pop(slot)
        else:
            self._vacate(slot, needed, reserved)  # its rows stay here all the same
        if sequence.routes is not None and kept.routes is not None:
            sequence.routes[:reused] = kept.routes[:reused]
        sequence.fed = sequence.cached = reused

    def _vacate(self, slot: int, needed: set[Kept], reserved: set[int]) -> None:
        """Move ``slot``'s kept cache, if any, to an empty slot (not ``reserved``), or
        else to the slot of the least recently used one not ``needed``, which is dropped;
        if that is this one, or every one is needed, it is dropped. The slot's rows are
        left as they are."""
        here = self.kept.slots.get(slot)
        if here is None:
            return
        taken = self.active.keys() | self.kept.slots.keys() | reserved
        empty = [s for s in range(self.slots) if s not in taken and s != slot]
        if empty:
            target = max(empty)  # the highest: the next sequences admitted take the lowest
        else:
            target = self.kept.least_used({s for s, k in self.kept.slots.items() if k in needed})
        if target is None or target == slot:
            self.kept.pop(slot)
            return
        if target in self.kept:
            self.kept.pop(target)
        self._copy_rows(slot, target, len(here.tokens))
        self.kept.move(slot, target)

    def _sampling_of(self, request: Request) -> Sampling:
        own = self.sampling
        given = (request.temperature, request.top_p, request.top_k, request.min_p)
        if all(value is None for value in given):
            return own  # the decoder's own object: _pick knows such rows by identity
        return Sampling(
            own.temperature if request.temperature is None else request.temperature,
            own.top_p if request.top_p is None else request.top_p,
            own.top_k if request.top_k is None else request.top_k,
            own.min_p if request.min_p is None else request.min_p,
        )

    def _advance(self, slots: list[int]) -> list[Finished]:
        sequences = [self.active[slot] for slot in slots]
        ids, positions = self._inputs(sequences)
        self.fed_tokens += sum(len(seq.tokens) - seq.fed for seq in sequences)
        d = self.device
        recorded: list[torch.Tensor] | None = [] if self.routes_dtype is not None else None
        # Positions and slots stay in CPU memory: the model reads the step's shapes from
        # them without a round trip to the device.
        if self.graphed is not None and ids.shape[1] == 1:
            logits = self.graphed(ids, positions, torch.tensor(slots))
        else:
            # Attend over the longest real prefix: padding sits at the cache's last
            # position, and would otherwise stretch every row's attention to the whole cache.
            span = max(len(seq.tokens) for seq in sequences)
            logits = self.model.step(
                ids.to(d), positions, torch.tensor(slots), self.cache, span, recorded
            )
        if recorded is not None:
            self._keep_routes(sequences, recorded)
        ends = torch.tensor([len(seq.tokens) - seq.fed - 1 for seq in sequences], device=d)
        last = logits[torch.arange(len(slots), device=d), ends]
        chosen, logprobs = self._pick(last, sequences)
        done = []
        for slot, seq, token, logprob in zip(slots, sequences, chosen, logprobs, strict=True):
            seq.fed = len(seq.tokens)
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(self.version)
            result = self._maybe_finish(slot, seq)
            if result is not None:
                done.append(result)
        return done

    def _keep_routes(self, sequences: list[_Sequence], recorded: list[torch.Tensor]) -> None:
        """Each sequence's routes of the tokens this step fed it ([rows, tokens, per_token]
        per layer in ``recorded``), at those tokens' positions of its record (a reload's
        recompute writes the new version's over the old)."""
        # [rows, tokens, layers, per_token], to host memory once for the step.
        routes = torch.stack(recorded, dim=2).to("cpu", torch.int32).numpy()
        for row, seq in enumerate(sequences):
            assert seq.routes is not None
            fed = len(seq.tokens) - seq.fed
            seq.routes[seq.fed : len(seq.tokens)] = routes[row, :fed]

    def _inputs(self, sequences: list[_Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence's unfed tokens and their positions, right-padded into a batch."""
        width = max(len(seq.tokens) - seq.fed for seq in sequences)
        if width == 1:  # the common case, one token each: no per-row tensors
            ids = torch.tensor([[seq.tokens[-1]] for seq in sequences])
            return ids, torch.tensor([[len(seq.tokens) - 1] for seq in sequences])
        # Padding goes to the cache's last position: never visible before it is overwritten.
        last = self.cache.max_len - 1
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        positions = torch.full((len(sequences), width), last, dtype=torch.long)
        for row, seq in enumerate(sequences):
            unfed = seq.tokens[seq.fed :]
            ids[row, : len(unfed)] = torch.tensor(unfed)
            positions[row, : len(unfed)] = torch.arange(seq.fed, len(seq.tokens))
        return ids, positions

    def _pick(self, logits: torch.Tensor, sequences: list[_Sequence]):
        """Each row's next token and its log-prob under the distribution it was drawn from
        (or the most likely token, for a greedy sequence)."""
        own = self.sampling
        if all(seq.sampling is own for seq in sequences):  # one setting for every row
            logprobs = own.logprobs(logits)
        else:
            d = logits.device
            settings = [seq.sampling for seq in sequences]
            logprobs = sampled_logprobs(
                logits,
                torch.tensor([s.temperature for s in settings], device=d),
                torch.tensor([s.top_p for s in settings], device=d),
                torch.tensor([s.top_k for s in settings], device=d),
                min_p=torch.tensor([s.min_p for s in settings], device=d),
            )
        probs = logprobs.exp()
        sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        for row, seq in enumerate(sequences):
            if seq.generator is not None:  # drawn on its own, so its neighbours do not matter
                sampled[row] = torch.multinomial(probs[row], 1, generator=seq.generator)[0]
        greedy = torch.tensor([seq.request.greedy for seq in sequences], device=logits.device)
        chosen = torch.where(greedy, logprobs.argmax(-1), sampled)
        picked = logprobs.gather(1, chosen[:, None]).squeeze(1)
        return chosen.tolist(), picked.tolist()

    def _maybe_finish(self, slot: int, seq: _Sequence) -> Finished | None:
        response = seq.response
        request = seq.request
        ended = response[-1] in self.eos_ids or response[-1] in request.stop_ids
        ended = ended or ends_by_rule(request, self.stop_texts, response)
        budget = min(self.max_new_tokens, request.max_new_tokens or self.max_new_tokens)
        if not ended and len(response) < budget:
            return None
        del self.active[slot]
        if request.keep_cache:
            # Its cache holds every token but the last, which was sampled, never fed.
            self.kept.keep(slot, np.asarray(seq.tokens[: seq.fed]), seq.routes)
        return Finished(
            tag=seq.request.tag,
            prompt=seq.request.prompt,
            tokens=response,
            logprobs=seq.logprobs,
            versions=seq.versions,
            truncated=not ended,
            stopped_by=response[-1] if ended else None,
            routes=None if seq.routes is None else seq.routes[: len(seq.tokens) - 1].copy(),
            cached_tokens=seq.cached,
        )


def route_dtype(experts: int) -> np.dtype:
    """The narrowest integer that holds an index of ``experts`` experts: uint8 up to 256
    (one byte an index), int16 beyond."""
    return np.dtype(np.uint8) if experts <= 256 else np.dtype(np.int16)
