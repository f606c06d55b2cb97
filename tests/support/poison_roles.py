"""The demo roles with a generator that holds several groups, one of which may be poison.

``Generate`` here claims 4 groups per lease. With ``ASYNCRL_POISON_KEY`` set, a lease
holding the group of that key kills its own process (SIGKILL, as the kernel's
out-of-memory killer would) before it produces anything: the group kills every worker that
takes it, and the other groups of its lease are bystanders.
"""

from __future__ import annotations

import os
import signal
from typing import ClassVar

from asyncrl.actors.actor import Actor, Outcome
from asyncrl.transport import protocol as p
from tests.support.demo_pipeline import ROLES as DEMO_ROLES
from tests.support.demo_pipeline import Generate

__all__ = ["POISON_ENV", "ROLES"]

POISON_ENV = "ASYNCRL_POISON_KEY"


class GenerateSeveral(Generate):
    claim_size: ClassVar[int] = 4

    def process(self, lease: p.Lease) -> Outcome:
        poison = os.environ.get(POISON_ENV)
        if poison and any(item.key == poison for item in lease.items):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().process(lease)


ROLES: dict[str, type[Actor]] = {**DEMO_ROLES, "generate": GenerateSeveral}
