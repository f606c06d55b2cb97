"""A generator's OpenAI API in the test's own process: the policy a config names, its real
server (uvicorn on a free port, entered in the run's API directory) and its decoder,
decoded on a thread as the generate worker's main loop does (``Serving.advance``), so the
official openai client can call it."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import openai

from asyncrl.actors.policy.decoder import Decoder
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.serving.call_records import CallRecord, decode_records
from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.actors.serving.serving import Serving
from asyncrl.actors.startup.model_loading import load_policy
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.runtime.contract.rundir import RunDir

IDLE_S = 0.002  # the loop's nap when the decoder holds nothing


@dataclass
class ServedApi:
    cfg: RunConfig
    entry: ApiEntry  # the server's entry in the run's API directory
    codec: TextCodec
    decoder: Decoder
    serving: Serving
    # Held by the decode loop over each step: whoever holds it (to load weights, or to
    # keep a call from being decoded) knows that no step runs meanwhile.
    steps: threading.Lock = field(default_factory=threading.Lock)

    def client(self, session: str, *, greedy: bool = False) -> openai.OpenAI:
        """The openai client of one session (``greedy``: decoded greedily, nothing recorded)."""
        entry = self.entry
        url = entry.greedy_url(session) if greedy else entry.session_url(session)
        return openai.OpenAI(base_url=url, api_key=entry.key, max_retries=0)

    def records(self, session: str) -> list[CallRecord]:
        """The session's calls recorded for training, taken (a second read finds none)."""
        request = urllib.request.Request(
            f"{self.entry.url}/sessions/{session}/record",
            headers={"Authorization": f"Bearer {self.entry.key}"},
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            return decode_records(reply.read())


def advance(served: ServedApi) -> None:
    """One step of a generator that holds served calls only."""
    served.serving.advance(served.decoder)


@contextmanager
def served_api(
    config: Mapping[str, Any],
    *,
    slots: int,
    version: int = 0,
    step: Callable[[ServedApi], None] = advance,
) -> Iterator[ServedApi]:
    """The API of a generator running ``config`` (a run config as a dict; its model's
    ``max_new_tokens`` and ``max_prompt_tokens`` size the decoder) with ``slots``
    sequences at once, its weights at ``version``. ``step`` is what the decode loop does
    each time round, under the steps lock: one ``Serving.advance``, or a test's own that
    does more around it (loads a version, times the step). Stopped and withdrawn from the
    directory on exit."""
    cfg = config_from_dict(dict(config))
    model, codec = load_policy(cfg, "generate")
    decoder = Decoder(
        model, slots=slots, max_new_tokens=cfg.model.max_new_tokens,
        max_prompt_tokens=cfg.model.max_prompt_tokens, eos_id=codec.eos_ids,
        pad_id=codec.pad_id, version=version,
    )  # fmt: skip
    serving = Serving(
        cfg, "generate-0", codec, vocab_size=model.config.vocab_size,
        max_prompt_tokens=cfg.model.max_prompt_tokens, version=version,
    )  # fmt: skip
    stop = threading.Event()
    loop: threading.Thread | None = None
    try:
        (entry,) = ApiDirectory(RunDir.of(cfg).api_servers).live()
        served = ServedApi(cfg, entry, codec, decoder, serving)

        def decode() -> None:  # the generate worker's main thread, in short
            while not stop.is_set():
                with served.steps:
                    step(served)
                if not decoder.busy:
                    time.sleep(IDLE_S)

        loop = threading.Thread(target=decode, name="decode", daemon=True)
        loop.start()
        yield served
    finally:
        stop.set()
        if loop is not None:
            loop.join(5)
        serving.stop()
