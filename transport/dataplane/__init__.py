"""The data plane: payloads move from the worker that made them straight to their consumers.

A producer keeps each payload it made in its :class:`PayloadStore` (one image per payload,
image.py; in a shared-memory file where the host has one) and serves it with a
:class:`PayloadServer`; the scheduler records only a :class:`~..messages.PayloadRef`
(holder, address, store, key, size, checksum) and hands it out with leases; a consumer's
:class:`PayloadFetcher` maps the image where it shares the holder's host, fetches it from
the holder otherwise, and checks it. The scheduler never sees a payload byte, so its cost
per group does not grow with the payload.

The wire of a fetch, one ZeroMQ message each way::

    request   [header]           header = <u64 req_id><u64 key> + store id (ascii)
    reply     [status, image]    status = <u64 req_id><u8 code>; image only when code is OK

A store id names one process's store: a restarted holder has a new one, so a reference
into its predecessor's store is answered "unknown store", never with other bytes.
"""

from .fetch import FetchFailure, PayloadFetcher, PayloadsUnavailable
from .server import PayloadServer
from .store import PayloadStore, StoreFull

__all__ = [
    "FetchFailure",
    "PayloadFetcher",
    "PayloadServer",
    "PayloadStore",
    "PayloadsUnavailable",
    "StoreFull",
]
