"""The data plane: payloads move from the worker that made them straight to their consumers.

A producer keeps each payload it made in its :class:`PayloadStore` and serves it with a
:class:`PayloadServer`; the scheduler records only a :class:`~..messages.PayloadRef`
(holder, address, store, key, size, checksum) and hands it out with leases; a consumer's
:class:`PayloadFetcher` fetches the bytes from the holder and checks them. The scheduler
never sees a payload byte, so its cost per group does not grow with the payload.

The wire of a fetch, one ZeroMQ message each way::

    request   [header]           header = <u64 req_id><u64 key> + store id (ascii)
    reply     [status, blob]     status = <u64 req_id><u8 code>; blob only when code is OK

A store id names one process's store: a restarted holder has a new one, so a reference
into its predecessor's store is answered "unknown store", never with other bytes.
"""

from .fetch import FetchFailure, PayloadFetcher, PayloadsUnavailable
from .server import PayloadServer
from .store import PayloadStore

__all__ = [
    "FetchFailure",
    "PayloadFetcher",
    "PayloadServer",
    "PayloadStore",
    "PayloadsUnavailable",
]
