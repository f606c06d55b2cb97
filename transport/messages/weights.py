"""The weight plane's messages: versions published, loaded and rewound, and where to fetch them."""

from __future__ import annotations

from typing import ClassVar

from .base import Kind, Payload, WireStruct

# --- requests ---------------------------------------------------------------------------


class PublishVersion(WireStruct):
    """The trainer made ``version`` available.

    ``weights``: the weight plane's manifest for it (opaque here, passed on to receivers),
    None where weights travel another way (files); ``address``: where the publisher serves
    them on the weight plane.
    """

    KIND: ClassVar[Kind] = Kind.PUBLISH_VERSION
    worker: str
    version: int
    weights: Payload | None = None
    address: bytes = b""


class LoadedVersion(WireStruct):
    """``worker`` runs ``version`` now.

    ``claim_next``: the worker's next Claim, for up to that many groups, answered with the
    report, as a Complete's is (control.Complete): an idle worker that has just loaded a
    version claims with the report rather than after it. The reply is the Lease when there
    is work, otherwise the usual Ack, the worker then waiting to be woken as after a claim
    that found nothing. 0 (an older worker's, or one with no room): no claim.
    """

    KIND: ClassVar[Kind] = Kind.LOADED_VERSION
    worker: str
    version: int
    claim_next: int = 0


class Rewind(WireStruct):
    """The trainer's state is at ``step``, behind the scheduler's step count (only an
    older checkpoint survived): training rolls back to it, exactly."""

    KIND: ClassVar[Kind] = Kind.REWIND
    worker: str
    step: int


class WantWeights(WireStruct):
    """Whom to fetch ``version``'s weights from (0: the newest announced). Answered by
    WeightsPlan, or Error when no announcement for that version is held.

    ``address``: the asker's own weight-plane address if it can relay to others (b"": it
    cannot); ``failed``: a source that failed the asker (timed out, corrupt bytes), which
    it is not given again.
    """

    KIND: ClassVar[Kind] = Kind.WANT_WEIGHTS
    worker: str
    version: int
    address: bytes = b""
    failed: str = ""


class WeightsPlan(WireStruct):
    """Fetch ``version`` (its ``manifest``) from worker ``source`` at ``source_address``."""

    KIND: ClassVar[Kind] = Kind.WEIGHTS_PLAN
    version: int
    manifest: Payload
    source: str
    source_address: bytes


class StepDone(WireStruct):
    """Reply to a train step's Complete: taken, and ``version`` is the step count, the
    version the trainer publishes next (no Status round trip to learn it)."""

    KIND: ClassVar[Kind] = Kind.STEP_DONE
    count: int
    version: int
