"""What a generator holds while it serves agent harnesses (``data.harness``).

The API runs on its own thread (:mod:`.server`); the generator's decode loop takes the
requests it queued between two decode steps and resolves them as they finish
(:mod:`.bridge`), so the model is only ever touched by the worker's main thread. The
generator's entry in the run's API directory says where it serves, with what key, and
the version it runs; it is written again after every version it loads.
"""

from __future__ import annotations

import os
import secrets

import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.host import host_identity

from ..policy.chat_template import ChatTemplate, ChatTemplateError, find_chat_template
from ..policy.decoder import Decoding, Finished
from ..policy.directories import model_dir
from ..policy.tokenizer import TextCodec
from .bridge import Bridge, ServeTag
from .call_records import SessionRecords
from .chat_turns import ChatTurns
from .directory import ApiDirectory, ApiEntry
from .http_server import ApiServer
from .openai_api import ApiSettings, make_app
from .tool_calls import tool_parser

__all__ = ["Serving"]

log = structlog.get_logger("asyncrl.serving")

# Records of a session nobody collects are dropped this long after its last call, and no
# sooner than this: the harness worker collects them as soon as its harness returns.
_MIN_RECORD_TTL_S = 60.0


class Serving:
    def __init__(
        self,
        cfg: RunConfig,
        worker: str,
        codec: TextCodec,
        *,
        vocab_size: int,
        max_prompt_tokens: int,
        version: int,
    ) -> None:
        directory = model_dir(cfg.model.path)
        try:
            template: ChatTemplate | None = ChatTemplate.from_dir(directory)
        except ChatTemplateError:
            template = None  # /v1/chat/completions then says so; completions still serve
        found = find_chat_template(directory) if template is not None else None
        parser = tool_parser(cfg.model.tool_parser, None if found is None else found[0])
        self.bridge = Bridge()
        self.records = SessionRecords(max(2 * cfg.data.harness_timeout_s, _MIN_RECORD_TTL_S))
        settings = ApiSettings(
            token=secrets.token_urlsafe(32),
            temperature=cfg.algorithm.temperature,
            top_p=cfg.algorithm.top_p,
            top_k=cfg.algorithm.top_k,
            min_p=cfg.algorithm.min_p,
            max_new_tokens=cfg.model.max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
            vocab_size=vocab_size,
            sampling=cfg.data.harness_sampling,
            tool_parser=parser,
            tool_parser_setting=cfg.model.tool_parser,
        )
        self.turns = (
            None if template is None else ChatTurns(template, codec, ttl_s=self.records.ttl_s)
        )
        app = make_app(settings, self.bridge, self.records, codec, self.turns)
        self.server = ApiServer(app, cfg.data.harness_host)
        self.directory = ApiDirectory(RunDir.of(cfg).api_servers)
        self.worker = worker
        self.served = 0  # calls answered
        self._key = settings.token
        self.server.start()
        self.loaded(version)
        log.info(
            "serving the OpenAI API for harnesses", url=self.server.url, worker=worker,
            tool_parser=parser or "none", sampling=cfg.data.harness_sampling,
        )  # fmt: skip

    def loaded(self, version: int) -> None:
        """The decoder runs ``version`` now: say so in this generator's entry."""
        entry = ApiEntry(
            self.worker, self.server.url, self._key, version, os.getpid(), host_identity()
        )
        self.directory.publish(entry)

    def advance(self, decoder: Decoding) -> None:
        """One decode step of a decoder that holds served calls only."""
        self.feed(decoder)
        for finished in decoder.step():
            self.answer(finished)

    def feed(self, decoder: Decoding) -> None:
        """The calls queued since the last join the batch; those given up leave it."""
        requests, cancelled = self.bridge.take()
        if cancelled:
            decoder.cancel(cancelled)
        decoder.submit(requests)

    def answer(self, finished: Finished) -> None:
        """A finished sequence of the decoder, if it is a served call: its answer."""
        if isinstance(finished.tag, ServeTag):
            self.bridge.finish(finished)
            self.served += 1

    @property
    def busy(self) -> bool:
        return self.bridge.busy

    def dropped(self, reason: str) -> None:
        """The decoder was dropped: the calls it was sampling fail (503), the server stays."""
        self.bridge.fail_all(reason)

    def stop(self) -> None:
        self.directory.withdraw(self.worker)
        self.bridge.fail_all("the generator is stopping")
        self.server.stop()
        log.info(
            "stopped serving",
            worker=self.worker,
            calls=self.served,
            sessions_dropped_uncollected=self.records.dropped,
            # Chat calls that extended an earlier one exactly, and those rendered afresh
            # by reason (each a new sequence in training).
            chat_calls_spliced=None if self.turns is None else self.turns.spliced,
            chat_calls_rendered_afresh=None if self.turns is None else dict(self.turns.fell_back),
        )
