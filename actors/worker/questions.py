"""What the actor and the versions ask the scheduler through the worker: whom to fetch a
version's weights from (WantWeights → WeightsPlan), a rollback of the run (Rewind), and
the run's status (Status); the first two on the worker's main thread only."""

from __future__ import annotations

import threading
from typing import Any

from asyncrl.transport import protocol as p

from .requests import Requests
from .version_tracking import describe_reply as _describe

__all__ = ["SchedulerQuestions"]


class SchedulerQuestions:
    """The questions, as a base of :class:`~.loop.Worker`, whose link and thread they use."""

    name: str
    _requests: Requests
    _main: threading.Thread | None
    _log: Any

    def _ask_weights(self, version: int, address: bytes, failed: str) -> p.WeightsPlan | None:
        """WorkerContext.ask_weights: the scheduler's plan for fetching ``version``."""
        if threading.current_thread() is not self._main:
            raise RuntimeError("ask_weights is for the worker's main thread only")
        reply = self._requests.call(p.WantWeights(self.name, version, address, failed))
        if isinstance(reply, p.WeightsPlan):
            return reply
        self._log.info("no weights plan", version=version, reply=_describe(reply))
        return None

    def _rewind(self, step: int) -> None:
        """WorkerContext.rewind: roll the run back to the trainer's ``step``."""
        if threading.current_thread() is not self._main:
            raise RuntimeError("rewind is for the worker's main thread only")
        reply = self._requests.call(p.Rewind(self.name, step))
        if not isinstance(reply, p.Ack):
            raise RuntimeError(
                f"the scheduler refused to roll back to step {step}: {_describe(reply)}"
            )
        self._log.warning("training rolled back", step=step)

    def _status(self) -> dict[str, Any] | None:
        reply = self._requests.retry(p.Status())
        if isinstance(reply, p.StatusReply):
            return reply.summary
        self._log.warning("status not answered", reply=_describe(reply))
        return None
