"""Every message of the bus, declared once: its kind, its fields and their types.

A message is a frozen msgspec Struct with a ``KIND``; requests go from workers (and
observers) to the scheduler, replies come back, events go out on the PUB. Structs are
``array_like``: on the wire a message is the list of its fields in declaration order, and
trailing fields with defaults may be left out by an older sender. How they travel is
:mod:`..protocol`'s business; nothing here knows about frames.

Each message is declared in the module of its plane: control.py (membership, leases,
locks, the run), data.py (payloads by reference, what a store keeps) and weights.py
(versions and where to fetch them); base.py holds the kinds and what they share. This
module is the one import point, and says what a message is (:data:`Message`).
"""

from __future__ import annotations

from .base import PROTOCOL_VERSION, Kind, Payload
from .control import (
    RUN_FINISHED,
    Ack,
    Added,
    AddGroups,
    Bye,
    Claim,
    Complete,
    Error,
    Event,
    Fail,
    Heartbeat,
    Hello,
    Lease,
    Lock,
    LockGranted,
    LockQueued,
    NewGroup,
    NoWork,
    Ready,
    Report,
    Shutdown,
    Status,
    StatusReply,
    Stop,
    Unlock,
    Want,
)
from .data import Drop, Held, Item, LostPayload, PayloadRef, Result
from .weights import LoadedVersion, PublishVersion, Rewind, StepDone, WantWeights, WeightsPlan

__all__ = [
    "PROTOCOL_VERSION",
    "RUN_FINISHED",
    "Ack",
    "AddGroups",
    "Added",
    "Bye",
    "Claim",
    "Complete",
    "Drop",
    "Error",
    "Event",
    "Fail",
    "Heartbeat",
    "Held",
    "Hello",
    "Item",
    "Kind",
    "Lease",
    "LoadedVersion",
    "Lock",
    "LockGranted",
    "LockQueued",
    "LostPayload",
    "Message",
    "NewGroup",
    "NoWork",
    "Payload",
    "PayloadRef",
    "PublishVersion",
    "Ready",
    "Report",
    "Result",
    "Rewind",
    "Shutdown",
    "Status",
    "StatusReply",
    "StepDone",
    "Stop",
    "Unlock",
    "Want",
    "WantWeights",
    "WeightsPlan",
]

Message = (
    Hello
    | Heartbeat
    | Claim
    | Complete
    | Fail
    | Lock
    | Unlock
    | PublishVersion
    | LoadedVersion
    | Rewind
    | Report
    | WantWeights
    | Held
    | AddGroups
    | Bye
    | Status
    | Stop
    | Ready
    | Ack
    | Error
    | Lease
    | NoWork
    | Want
    | Added
    | LockGranted
    | LockQueued
    | StatusReply
    | Shutdown
    | WeightsPlan
    | Drop
    | StepDone
    | Event
)
