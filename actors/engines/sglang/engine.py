"""The decoder surface over SGLang: token ids in, tokens with log-probs and versions out.

:class:`SGLangDecoder` has the public surface of the PyTorch
:class:`~asyncrl.actors.policy.decoder.Decoder` (``submit``, ``step``, ``cancel``,
``busy``, ``free_slots``, ``load``, ``version``), so episodes, validation and the served
API drive either the same way. SGLang does the batching, the KV cache and the sampling;
this module feeds it token ids and keeps the books.

Threads: SGLang's engine is driven from an asyncio event loop, which an
:class:`~.runner.EngineRunner` runs on a thread of its own; the decoder's methods are
called on the worker's thread and hand work to the loop, and finished responses come back
through a queue. Every request streams its tokens, so each token is tagged with the
version it was sampled under as it arrives (:mod:`.versions`), and the stop texts and
``stop_when`` are asked after every token.

A new version (``load``): the engine is paused in "retract" mode (running requests go
back to its queue, their KV cache dropped), the weights go in as flattened buckets
(:mod:`.buckets`), the cache is flushed, and the engine continues: requests in flight go
on under the new weights, their prefixes recomputed, as the PyTorch decoder does. A
request the engine aborts on its own (an engine paused in "abort" mode, or one that
cannot hold it) goes on as a partial rollout: resubmitted as prompt + tokens so far.

Validation shares the engine: a second decoder over the same :class:`EngineRunner`
decodes its prompts greedily, under whatever version the engine runs (an engine holds one
set of weights; there is no frozen copy to keep).

``sglang`` is imported by :class:`SGLangEngine` and :func:`start_engine` only, so that this
module loads without it (and the tests drive :class:`SGLangDecoder` with stand-in engines).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from typing import Any

import structlog
import torch

from ...policy.decoder import (
    Finished,
    Request,
    StopTexts,
    check_request,
    end_ids,
    ends_by_rule,
)
from ...policy.sampling import Sampling
from .buckets import Bucket
from .runner import EngineRunner
from .token_versions import Rollout

__all__ = ["SGLangDecoder", "SGLangEngine", "start_engine"]

log = structlog.get_logger("asyncrl.sglang")

# How long step() waits for a response to finish before it returns none: the worker's loop
# calls it back to back while busy, and SGLang works on its own processes meanwhile.
STEP_WAIT_S = 0.005


class SGLangDecoder:
    """Generates through an :class:`EngineRunner`, for up to ``slots`` requests at a time."""

    def __init__(
        self,
        runner: EngineRunner,
        *,
        slots: int,
        max_new_tokens: int,
        max_prompt_tokens: int,
        eos_id: int | Collection[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        stop: tuple[str, ...] = (),
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        """``stop``: texts that end every response, found with ``decode`` (token ids to
        text; see :class:`StopTexts`). They are not SGLang's ``stop``: the engine runs
        without a tokenizer (token ids in and out), and every engine's decoder finds them
        on our codec's text, so a response ends at the same token whichever samples it."""
        # The defaults of requests that name none (ValueError naming a bad one).
        self.sampling = Sampling(temperature, top_p, top_k, min_p)
        self.stop_texts = StopTexts.of(stop, decode)
        self.runner = runner
        self.slots = slots
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.eos_ids = end_ids(eos_id)
        # What the loop hands back: a response, or the error a request failed with.
        self._finished: queue.Queue[tuple[int, Finished | Exception]] = queue.Queue()
        # Read and written on both threads, under the lock: the requests this decoder still
        # owes a result for (tag → key), and those cancelled while they ran.
        self._lock = threading.Lock()
        self._live: dict[Any, int] = {}
        self._cancelled: set[int] = set()

    # --- the caller's side ------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.runner.version

    def submit(self, requests: Iterable[Request]) -> None:
        for request in requests:
            check_request(request, self.max_prompt_tokens)
            key = self.runner.next_key()
            with self._lock:
                if request.tag in self._live:
                    raise ValueError(f"request {request.tag!r} is already running")
                self._live[request.tag] = key
            self.runner.start(self._generate(request, key))

    def step(self) -> list[Finished]:
        """The responses that ended since the last call (waits briefly for one if busy)."""
        done: list[tuple[int, Finished | Exception]] = []
        if self.busy:
            try:
                done.append(self._finished.get(timeout=STEP_WAIT_S))
            except queue.Empty:
                return []
        while True:
            try:
                done.append(self._finished.get_nowait())
            except queue.Empty:
                break
        kept = []
        with self._lock:
            for key, finished in done:
                if isinstance(finished, Exception):
                    raise RuntimeError(f"SGLang failed a request: {finished!r}") from finished
                if self._live.get(finished.tag) == key:  # else cancelled since it ended
                    del self._live[finished.tag]
                    kept.append(finished)
        return kept

    def cancel(self, tags: Collection[Any]) -> None:
        """Drop the requests tagged ``tags`` (their group failed): aborted in the engine."""
        with self._lock:
            keys = [self._live.pop(tag) for tag in tags if tag in self._live]
            self._cancelled.update(keys)
        if keys:
            self.runner.abort(keys)

    def close(self) -> None:
        """Abort every request of this decoder (a new one replaces it)."""
        with self._lock:
            tags = list(self._live)
        self.cancel(tags)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._live)

    @property
    def free_slots(self) -> int:
        """Slots that no request, running or waiting, will take."""
        with self._lock:
            return self.slots - len(self._live)

    def load(
        self, state: Mapping[str, torch.Tensor], version: int, *, copy: bool = True
    ) -> list[torch.Tensor]:
        """Take new weights now; requests in flight go on under them. The engine copies
        them into its own memory, so ``state`` is free again when this returns (``copy``
        makes no difference) and no tensor of ours is superseded."""
        del copy
        self.runner.load(state, version)
        return []

    # --- on the loop's thread ----------------------------------------------------------

    async def _generate(self, request: Request, key: int) -> None:
        budget = min(self.max_new_tokens, request.max_new_tokens or self.max_new_tokens)
        rollout = self.runner.ledger.begin(key, request.prompt, budget)
        try:
            ended = await self._run(request, rollout, key)
        except Exception as error:  # handed to the caller's thread by the next step()
            log.error("sglang request failed", tag=str(request.tag), error=repr(error))
            self._finished.put((key, error))
            return
        finally:
            self.runner.rids.pop(key, None)
            self.runner.ledger.drop(key)
            with self._lock:
                cancelled = key in self._cancelled
                self._cancelled.discard(key)
        if cancelled or ended is None:
            return  # nobody waits for it
        stopped = ended == _STOPPED
        result = Finished(
            tag=request.tag,
            prompt=request.prompt,
            tokens=rollout.tokens,
            logprobs=rollout.logprobs,
            versions=rollout.versions,
            truncated=not stopped,
            stopped_by=rollout.tokens[-1] if stopped else None,
        )
        self._finished.put((key, result))

    async def _run(self, request: Request, rollout: Rollout, key: int) -> str | None:
        """Stream ``request`` to its end, resubmitting it as a partial rollout (prompt +
        tokens so far) whenever the engine cuts it off. None if it was cancelled."""
        while True:
            await self.runner.wait_running()  # nothing is submitted while a version loads
            if self._is_cancelled(key):
                return None
            rid = self.runner.rids[key] = self.runner.next_rid()
            outcome = await self._stream(request, rollout, rid)
            if self._is_cancelled(key):
                return None
            if outcome != _CUT_OFF:
                return outcome
            if rollout.remaining < 1:
                return _TRUNCATED
            self.runner.ledger.resubmit(key)

    async def _stream(self, request: Request, rollout: Rollout, rid: str) -> str:
        """One submission of ``request``: how it ended (stopped, truncated or cut off)."""
        params = self._sampling_params(request, rollout.remaining)
        finish: Any = None
        stream = self.runner.engine.generate(rid, rollout.input_ids, params)
        async with contextlib.aclosing(stream):
            async for output in stream:
                meta = output.get("meta_info", {})
                finish = meta.get("finish_reason")
                start = len(rollout.tokens)
                new = self.runner.ledger.report(
                    rollout.tag,
                    meta.get("output_token_logprobs") or [],
                    cumulative=self.runner.cumulative,
                )
                ended = self._ended_within(request, rollout, start, len(new))
                if ended is not None:
                    if finish is None and ended == _STOPPED:
                        # Ended here by a rule of ours (stop texts): the engine would go on.
                        self.runner.engine.abort(rid)
                    return ended
                if finish is not None:
                    break
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if kind == "stop":  # a stop the engine matched (its model's own end-of-sequence too)
            return _STOPPED
        if kind == "length":
            return _TRUNCATED
        # Aborted by the engine, or a stream that ended without saying why: the response
        # goes on from where it got to.
        return _CUT_OFF

    def _ended_within(
        self, request: Request, rollout: Rollout, start: int, count: int
    ) -> str | None:
        """Whether the response ended among its ``count`` new tokens, asked token by token
        as the PyTorch decoder does; the response is cut right after the token it ended
        with (an engine's report may run past a stop text or ``stop_when``)."""
        for length in range(start + 1, start + count + 1):
            response = rollout.tokens[:length]
            token = response[-1]
            stopped = token in self.eos_ids or token in request.stop_ids
            if stopped or ends_by_rule(request, self.stop_texts, response):
                rollout.cut(length)
                return _STOPPED
            if length >= rollout.budget:
                rollout.cut(length)
                return _TRUNCATED
        return None

    def _sampling_params(self, request: Request, remaining: int) -> dict[str, Any]:
        return {
            "max_new_tokens": remaining,
            # The PyTorch decoder's end ids, besides the model's own; the stop token stays
            # in the response (it is trained, with its log-prob).
            "stop_token_ids": sorted(self.eos_ids | request.stop_ids),
            "no_stop_trim": True,
            **self._sampling_of(request),
        }

    def _sampling_of(self, request: Request) -> dict[str, Any]:
        """The request's sampling (the decoder's where it names none) in SGLang's terms."""
        if request.greedy:
            return {"temperature": 0.0}  # SGLang's greedy
        own = self.sampling
        top_k = own.top_k if request.top_k is None else request.top_k
        params = {
            "temperature": own.temperature if request.temperature is None else request.temperature,
            "top_p": own.top_p if request.top_p is None else request.top_p,
            "top_k": top_k or -1,  # SGLang's every token is -1
            # SGLang applies min-p after top-k and top-p, not before as vLLM and ours do:
            # with top_p too its set may differ slightly from what the scorers recompute.
            "min_p": own.min_p if request.min_p is None else request.min_p,  # 0: off
        }
        if request.seed is not None:
            params["sampling_seed"] = request.seed
        return params

    def _is_cancelled(self, key: int) -> bool:
        with self._lock:
            return key in self._cancelled


# How a submission ended.
_STOPPED = "stopped"  # an end-of-sequence or stop id, a stop text, or stop_when
_TRUNCATED = "truncated"  # the length budget
_CUT_OFF = "cut off"  # aborted by the engine: to be continued


# --- SGLang itself --------------------------------------------------------------------------


class SGLangEngine:
    """:class:`GenerationEngine` over an ``sglang.Engine`` started with
    ``skip_tokenizer_init=True`` (token ids in and out).

    The engine's blocking methods run their coroutines on the engine's own loop, which the
    runner's thread is running: so the calls here await the engine's tokenizer manager,
    the object those methods (and SGLang's HTTP endpoints) hand their requests to, on that
    loop. While it is paused, the tokenizer manager updates weights without waiting for
    the requests in flight to end (it waits for them otherwise): that is what lets them go
    on under the new version.

    A bucket is handed over as a CUDA tensor on the device SGLang's processes use, named by
    its index: they inherit this process's visible devices, so the index means the same
    GPU there.
    """

    def __init__(self, engine: Any, device: torch.device) -> None:
        from sglang.srt.managers.io_struct import (
            ContinueGenerationReqInput,
            PauseGenerationReqInput,
            UpdateWeightsFromTensorReqInput,
        )
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        self.engine = engine
        self.device = device  # where a bucket is staged for the engine's processes to read
        self._pause = PauseGenerationReqInput
        self._continue = ContinueGenerationReqInput
        self._update = UpdateWeightsFromTensorReqInput
        self._serializer = MultiprocessingSerializer
        self._metadata = FlattenedTensorMetadata

    async def generate(
        self, rid: str, input_ids: list[int], sampling_params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        stream = await self.engine.async_generate(
            input_ids=input_ids,
            sampling_params=sampling_params,
            return_logprob=True,
            stream=True,
            rid=rid,
        )
        async for output in stream:
            yield output

    def abort(self, rid: str) -> None:
        self.engine.tokenizer_manager.abort_request(rid=rid)

    async def pause(self) -> None:
        # "retract": running requests go back to the engine's queue and free their KV
        # cache, so that after the update they are recomputed under the new weights.
        await self.engine.tokenizer_manager.pause_generation(self._pause(mode="retract"))

    async def update(self, bucket: Bucket, version: int, *, last: bool) -> None:
        # The bucket goes to the device first: the engine's processes open it through a
        # CUDA IPC handle and copy it into their weights on the device.
        payload = {
            "flattened_tensor": bucket.flat.to(self.device),
            "metadata": [self._metadata(**entry.fields()) for entry in bucket.entries],
        }
        serialized = self._serializer.serialize(payload, output_str=True)
        request = self._update(
            serialized_named_tensors=[serialized],  # one per tensor-parallel rank: tp_size 1
            load_format="flattened_bucket",
            flush_cache=last,  # the prefix cache holds the old version's keys and values
            weight_version=str(version),
        )
        success, message = await self.engine.tokenizer_manager.update_weights_from_tensor(
            request, None
        )
        if not success:
            raise RuntimeError(f"SGLang refused weights of version {version}: {message}")

    async def resume(self) -> None:
        await self.engine.tokenizer_manager.continue_generation(self._continue())

    def shutdown(self) -> None:
        self.engine.shutdown()


def start_engine(
    model_dir: str,
    *,
    device: torch.device,
    dtype: str,
    context_length: int,
    seed: int,
    version: int,
    bucket_mb: int,
    tied_embeddings: bool,
    mem_fraction: float | None = None,
) -> EngineRunner:
    """An SGLang engine on ``device`` serving the Hugging Face directory ``model_dir``;
    ``mem_fraction``: of the GPU's memory, for its weights and KV cache (None: SGLang's
    default, most of it)."""
    import sglang

    options: dict[str, Any] = {}
    if mem_fraction is not None:
        options["mem_fraction_static"] = mem_fraction
    engine = sglang.Engine(
        **options,
        model_path=model_dir,
        skip_tokenizer_init=True,  # token ids in and out: the codec is ours
        dtype=dtype,
        context_length=context_length,
        random_seed=seed,
        base_gpu_id=device.index or 0,
        tp_size=1,
        log_level="error",
    )
    return EngineRunner(
        SGLangEngine(engine, device),
        version=version,
        bucket_mb=bucket_mb,
        tied_embeddings=tied_embeddings,
        loop=engine.loop,
    )
