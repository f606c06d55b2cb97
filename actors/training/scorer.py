"""What logp and ref_logp share: score a lease's responses under a model, batch by batch.

A scorer can be a group of ranks (``pipeline.workers.logp`` or ``.ref_logp`` > 1, for a
model too large for one device): the model is sharded over the ranks (FSDP2), rank 0
claims leases and orders the others to score with it; each rank scores its share of the
lease's rows, in passes of rows of like length, and the shares are gathered on every rank.
A new version (logp) reaches rank 0 whole through the weight plane and goes from there to
every rank's shard; or, where the trainer publishes from every rank, each rank fetches the
parts holding its own rows itself (shard_rows.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import WeightReceiver, make_receiver

from ..actor import Actor, Outcome, WorkerContext
from ..engines.contract import (
    EngineModel,
    copy_of,
    load_group_weights,
    load_weights,
    split_over_group,
)
from ..payloads import LogprobsOut, RolloutsOut
from ..policy.model import CausalLM
from ..policy.padding import like_width_runs
from ..policy.sampling import Sampling
from ..policy.scoring import Packed, pack, response_logprobs
from ..startup.model_loading import load_policy
from ..startup.role_checks import check_device, check_engine, check_model
from ..startup.router_replay import replays_routes, router_replay_problems
from ..worker.weight_following import weights_access_for
from .gang import (
    Gang,
    GangBroken,
    Order,
    join_group,
    join_group_at,
    pack_lease,
    unpack_lease,
)
from .shard_rows import ROWS, ShardRows, follower_order

__all__ = [
    "ScoringActor",
    "by_like_length",
    "pack_rollouts",
    "per_group",
    "score_items",
    "score_rollouts",
]


class ScoringActor(Actor):
    """Log-probs of every response of a lease's groups, under this actor's model."""

    claim_size: ClassVar[int] = 4
    takes_versions: ClassVar[bool] = False  # logp follows the policy's; ref_logp is frozen
    # Router replay: through the experts the generator recorded (on_start reads the config).
    replay: bool = False
    # Each rank's fetch of its own rows of versions in parts (a group only; see shard_rows).
    rows: ShardRows | None = None

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [
            *check_engine(cfg, cls.role),
            *check_device(cfg),
            *check_model(cfg),
            *router_replay_problems(cfg, cls.role),
        ]

    def on_start(self, ctx: WorkerContext) -> None:
        self.sampling = Sampling.of(ctx.config.algorithm)
        self.replay = replays_routes(ctx.config, self.role)
        self.gang = join_group(ctx.config, self.role)
        rank = self.gang.rank if self.gang else ctx.index
        self.model, self.codec = load_policy(ctx.config, self.role, rank)
        if self.gang is not None:
            split_over_group(self.model, self.gang.size)
            self.rows = self.shard_rows(ctx.config, self.model)

    @classmethod
    def shard_rows(cls, cfg: RunConfig, model: CausalLM | EngineModel) -> ShardRows | None:
        """A group rank's fetch of its own rows, where versions come in parts and the
        model is sharded by rows (ours, FSDP2); else None: rank 0 takes versions whole."""
        parts = cfg.weight_parts(Role.TRAIN.value)
        if not cls.takes_versions or parts < 2 or isinstance(model, EngineModel):
            return None
        dirs = RunDir.of(cfg).weight_dirs(cfg.weights)

        def receiver(part: int, local: bool) -> WeightReceiver:
            access = weights_access_for(cfg, local)
            return make_receiver(cfg.weights, dirs.of_rank(part), access, relay=False)

        return ShardRows(model, parts, receiver, cfg.weights.stall_timeout_s)

    @property
    def version(self) -> int | None:
        """The policy version scored under (None: the frozen reference)."""
        return None

    def process(self, lease: p.Lease) -> Outcome:
        # Read once; a group without the routes replay needs is refused by name.
        rollouts = {item.gid: RolloutsOut.of(item, routes=self.replay) for item in lease.items}
        known = {gid: self.known_scores(r) for gid, r in rollouts.items()}
        reused = {gid for gid, scores in known.items() if scores is not None}
        unknown = tuple(item for item in lease.items if known[item.gid] is None)
        if unknown:
            scored = self._score(
                msgspec.structs.replace(lease, items=unknown),
                [rollouts[item.gid] for item in unknown],
            )
            known.update(zip((item.gid for item in unknown), scored, strict=True))
        results = tuple(
            p.Result(
                item.gid,
                LogprobsOut(known[item.gid], self.version, item.gid in reused).to_payload(),
            )
            for item in lease.items
        )
        tokens = sum(r.trained_tokens() for r in rollouts.values())
        return Outcome(results, tokens=tokens)

    def known_scores(self, rollouts: RolloutsOut) -> np.ndarray | None:
        """What scoring ``rollouts`` would give, if known without running the model."""
        return None

    def _score(self, lease: p.Lease, rollouts: list[RolloutsOut]) -> list[np.ndarray]:
        """Scores of ``lease``'s groups (their ``rollouts``), with the group if there is one."""
        pad_id, sampling = self.codec.pad_id, self.sampling
        if self.gang is None:
            return score_rollouts(self.model, rollouts, pad_id, sampling, replay=self.replay)
        gang = self.gang
        return gang.lead(  # the others read the lease from the order themselves
            Order.SCORE,
            lambda: score_rollouts(self.model, rollouts, pad_id, sampling, gang, self.replay),
            pack_lease(lease),
        )

    def load_weights(self, whole: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """A new version into the model (alone: running on the received buffers, no copy;
        in a group: each rank its shard); returns the tensors the model ran on before."""
        if self.gang is None:
            return load_weights(self.model, whole, copy=False)
        if self.rows is not None:  # each rank fetched its own rows: none came whole
            self.gang.lead(Order.LOAD, self.rows.load, ROWS)
        else:
            self.gang.lead(Order.LOAD, lambda: load_group_weights(self.model, whole))
        return []

    def on_stop(self) -> None:
        if self.gang is not None:
            self.gang.leave()
        if self.rows is not None:
            self.rows.close()

    def follow(self, cfg: RunConfig, place: GangPlace) -> int:
        """Rank ``place.rank`` > 0 of a scoring group: score what the leader orders."""
        gang = join_group_at(cfg, place, self.role)
        rows: ShardRows | None = None
        try:
            model, codec = load_policy(cfg, self.role, place.rank)
            split_over_group(model, gang.size)
            rows = self.shard_rows(cfg, model)
            sampling = Sampling.of(cfg.algorithm)
            replay = replays_routes(cfg, self.role)
            while True:
                order, body = gang.next_order()
                if order is Order.STOP:
                    return 0
                if rows is not None and follower_order(rows, order, body):
                    continue
                if order is Order.LOAD:
                    load_group_weights(model, None)
                elif order is Order.SCORE:
                    lease = unpack_lease(body)
                    score_items(model, lease.items, codec.pad_id, sampling, gang, replay)
                else:
                    raise GangBroken(f"a scoring rank got the order {order}")
        finally:
            if rows is not None:
                rows.close()
            gang.close()


def score_items(
    model: CausalLM | EngineModel,
    items: tuple[p.Item, ...],
    pad_id: int,
    sampling: Sampling,
    gang: Gang | None = None,
    replay: bool = False,
) -> list[np.ndarray]:
    """Per item, log-probs of its responses ``[n, longest]`` (float32; 0 past each end).

    With a ``gang`` every rank calls this with the same items (a collective). ``replay``:
    through the experts the generator recorded (router replay).
    """
    rollouts = [RolloutsOut.of(item, routes=replay) for item in items]
    return score_rollouts(model, rollouts, pad_id, sampling, gang, replay)


def score_rollouts(
    model: CausalLM | EngineModel,
    rollouts: list[RolloutsOut],
    pad_id: int,
    sampling: Sampling,
    gang: Gang | None = None,
    replay: bool = False,
) -> list[np.ndarray]:
    """:func:`score_items` for groups already read from their items; ``replay``: through
    the experts the generator chose (router replay)."""
    packed = pack_rollouts(rollouts, pad_id, replay)
    if gang is None:
        model.eval()
        with torch.inference_mode():
            scores = by_like_length(packed, lambda part: response_logprobs(model, part, sampling))
    else:
        scores = _score_shared(model, packed, sampling, gang)
    return per_group(scores, rollouts)


def per_group(scores: np.ndarray, rollouts: list[RolloutsOut]) -> list[np.ndarray]:
    """Rows ``scores`` of every group's responses (packed in order), cut back into each
    group's ``[n, longest response]``."""
    out, row = [], 0
    for group in rollouts:
        n, width = group.response_ids.shape
        block = np.zeros((n, width), np.float32)  # a group's layout, 0 past each end
        mine = scores[row : row + n, :width]
        block[:, : mine.shape[1]] = mine
        out.append(block)
        row += n
    return out


def pack_rollouts(rollouts: list[RolloutsOut], pad_id: int, replay: bool = False) -> Packed:
    """Every sequence of ``rollouts``, packed, masked to the tokens the model sampled;
    ``replay``: with the experts the generator routed each token to (router replay)."""
    prompts, responses, trained = [], [], []
    routes: list[torch.Tensor] | None = [] if replay else None
    for group in rollouts:
        prompt = group.prompt_ids.tolist()
        for response, mask in zip(group.responses(), group.trained_mask(), strict=True):
            prompts.append(prompt)
            responses.append(response)
            trained.append(mask[: len(response)].tolist())
        if routes is not None:
            routes += [torch.from_numpy(r.astype(np.int16)) for r in group.row_routes()]
    return pack(prompts, responses, pad_id, trained, routes)


def _score_shared(
    model: CausalLM | EngineModel, packed: Packed, sampling: Sampling, gang: Gang
) -> np.ndarray:
    """Each copy of the model scores its share of the rows, and every rank gets every
    score back. (A copy is one rank of a sharded model of ours, or the ranks that hold
    parts of one copy of another engine's model.)

    The rows are cut into passes of like length as one scorer cuts them (every rank
    cuts the same), and pass m goes to copy m mod copies. Every rank makes as many passes
    as the busiest copy: a sharded model's collectives pair up pass by pass, so a copy
    out of passes scores the shortest row again and keeps nothing of it. The scores come
    back as each row's response tokens only, without their padding."""
    part, parts = copy_of(model, gang.rank, gang.size)
    passes = _passes_by_length(packed)
    shares = [passes[copy::parts] for copy in range(parts)]
    rounds = len(shares[0])  # the first copy is dealt the most
    mine = shares[part]
    pieces = []
    with torch.no_grad():  # not inference mode: the sharded parameters are gathered in it
        model.eval()
        for index in range(rounds):
            chosen = mine[index] if index < len(mine) else passes[-1][:1]
            # At least one column: a pass of empty responses still runs (and keeps nothing).
            scores = response_logprobs(model, _chosen_rows(packed, chosen, 1), sampling)
            if index < len(mine):
                kept = _on_tokens(packed.lengths[chosen], scores.shape[1])
                pieces.append(scores[kept.to(scores.device)])
    device = scores.device
    rows_of = [torch.cat(share) if share else torch.zeros(0, dtype=torch.long) for share in shares]
    tokens = [int(packed.lengths[rows].sum()) for rows in rows_of]
    flat = torch.zeros(max(*tokens, 1), device=device)
    if pieces:
        flat[: tokens[part]] = torch.cat(pieces)
    gathered = torch.empty(gang.size * flat.shape[0], device=device)
    dist.all_gather_into_tensor(gathered, flat)
    gathered = gathered.view(gang.size, -1)
    if parts < gang.size:  # several ranks scored each share: the first of them gives it
        owner = torch.tensor([part], device=device)
        owners = torch.empty(gang.size, dtype=owner.dtype, device=device)
        dist.all_gather_into_tensor(owners, owner)
        gathered = gathered[[owners.tolist().index(copy) for copy in range(parts)]]
    out = np.zeros(tuple(packed.mask.shape), dtype=np.float32)
    for copy, rows in enumerate(rows_of):
        lengths = packed.lengths[rows]
        block = np.zeros((len(rows), out.shape[1]), dtype=np.float32)
        block[_on_tokens(lengths, out.shape[1]).numpy()] = (
            gathered[copy, : tokens[copy]].cpu().numpy()
        )
        out[rows.numpy()] = block
    return out


def _on_tokens(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, width] True on each row's first ``lengths`` columns."""
    return torch.arange(width)[None, :] < lengths[:, None]


# A scoring pass holds at most this many rows of the lease's longest (its memory), and
# takes the next row (sorted by length) while padding stays within SCORE_SLACK of its
# tokens: a pass pads its rows only to the longest of rows like them.
SCORE_ROWS = 16
SCORE_SLACK = 1.1


def _passes_by_length(packed: Packed) -> list[torch.Tensor]:
    """The rows of ``packed`` (their indices), longest first, cut into passes of rows of
    like length (see SCORE_ROWS)."""
    widths = packed.starts + packed.lengths
    order = torch.argsort(widths, descending=True, stable=True)
    sorted_widths = widths[order].tolist()
    runs = like_width_runs(sorted_widths, SCORE_SLACK, most=SCORE_ROWS * sorted_widths[0])
    return [order[run.start : run.stop] for run in runs]


def by_like_length(packed: Packed, score: Callable[[Packed], torch.Tensor]) -> np.ndarray:
    """``score`` (a model's log-probs, or a critic's values: ``[rows, longest response]``)
    of every row of ``packed``, float32, in passes of rows of like length (see SCORE_ROWS):
    a lease's rows are padded only to the longest of rows like them."""
    passes = _passes_by_length(packed)
    if len(passes) == 1:
        return score(packed).float().cpu().numpy()
    out = np.zeros(tuple(packed.mask.shape), dtype=np.float32)
    for chosen in passes:
        part = _chosen_rows(packed, chosen)
        if part.mask.shape[1] == 0:
            continue  # empty responses: nothing to score
        scores = score(part).float().cpu().numpy()
        out[chosen.numpy(), : scores.shape[1]] = scores
    return out


def _chosen_rows(packed: Packed, chosen: torch.Tensor, columns: int = 0) -> Packed:
    """Rows ``chosen`` of ``packed``, cut to the longest of them (``columns`` at least)."""
    starts, lengths = packed.starts[chosen], packed.lengths[chosen]
    width = int((starts + lengths).max())
    longest = max(int(lengths.max()), columns)
    mask = packed.mask[chosen, :longest]
    mask = torch.nn.functional.pad(mask, (0, longest - mask.shape[1]))
    routes = None if packed.routes is None else packed.routes[chosen, :width]
    return Packed(packed.ids[chosen, :width], starts, lengths, mask, routes)
