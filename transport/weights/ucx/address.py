"""A worker's address as the weight plane hands it out: which host it is on, and two UCX
addresses, one for peers on that host and one for peers elsewhere.

UCX judges by itself whether a peer shares its machine, and then may reach it over
shared memory (``posix``, ``sysv``) or cross-memory attach (``cma``): by the kernel's
boot id and the IPC and PID namespaces. Containers on one machine share its kernel, so
its boot id, and often its IPC namespace (Docker's ``--ipc=host``, Kubernetes'
``hostIPC``, Apptainer and enroot by default), while each has its own ``/dev/shm``, mount
and network namespace: UCX then wires a container's peer in another container through
shared memory that does not reach it, and every transfer stands still, with no error.

So the weight plane decides, by :func:`asyncrl.transport.host.host_identity`: a peer on
this host is dialled at its full address (UCX may choose shared memory or cross-memory
attach, and checks its own conditions for them); a peer on another is dialled at the
address of its network devices only (TCP, RDMA), which holds no transport that could
take a shared-memory path. UCX builds each side of a connection from the addresses
exchanged on it, so the peer answers over the same network transports.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from typing import Any

import msgpack

from ...host import host_identity

__all__ = ["BadAddress", "publish", "to_dial"]

# ucp.h: ucp_worker_query's attributes and flags (a stable C ABI since UCX 1.11).
_ATTR_ADDRESS, _ATTR_ADDRESS_FLAGS = 1 << 1, 1 << 2
_ADDRESS_NET_ONLY = 1 << 0


class BadAddress(ValueError):
    """Bytes given as a weight-plane address that are not one; says what was wrong."""


class _WorkerAttr(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("thread_mode", ctypes.c_int),
        ("address_flags", ctypes.c_uint32),
        ("address", ctypes.c_void_p),
        ("address_length", ctypes.c_size_t),
        ("max_am_header", ctypes.c_size_t),
        ("name", ctypes.c_char * 32),
        ("max_debug_string", ctypes.c_size_t),
    ]


@cache
def _libucp() -> ctypes.CDLL:
    """The libucp this process's worker runs on (ucxx loads it privately, so it is found
    by its mapping, not by name: another copy would be another UCX)."""
    with open("/proc/self/maps") as maps:
        path = next((line.split()[-1] for line in maps if "/libucp.so" in line), None)
    if path is None:
        raise RuntimeError("libucp is not loaded: make the UCX worker first")
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    lib.ucp_worker_query.argtypes = [ctypes.c_void_p, ctypes.POINTER(_WorkerAttr)]
    lib.ucp_worker_query.restype = ctypes.c_int
    lib.ucp_worker_release_address.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _network_address(worker: Any) -> bytes:
    """``worker``'s UCX address with its network devices only (ucxx offers only the
    full one; UCX's own query gives this one)."""
    lib = _libucp()
    attr = _WorkerAttr(
        field_mask=_ATTR_ADDRESS | _ATTR_ADDRESS_FLAGS, address_flags=_ADDRESS_NET_ONLY
    )
    status = lib.ucp_worker_query(worker.handle, ctypes.byref(attr))
    if status != 0:
        raise RuntimeError(f"ucp_worker_query failed with UCX status {status}")
    try:
        return ctypes.string_at(attr.address, attr.address_length)
    finally:
        lib.ucp_worker_release_address(worker.handle, attr.address)


def publish(worker: Any) -> bytes:
    """The address peers dial ``worker`` (a ucxx ``UCXWorker``) at, wherever they are."""
    full = bytes(worker.address.tobytes())
    return msgpack.packb([host_identity(), full, _network_address(worker)])


def to_dial(address: bytes) -> bytes:
    """The UCX address to reach the worker that published ``address``: its full one if it
    is on this host, else its network one. :class:`BadAddress` if it is no address."""
    try:
        host, full, network = msgpack.unpackb(address)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as error:
        raise BadAddress(f"not a weight-plane address ({len(address)} bytes): {error}") from None
    if not (isinstance(host, str) and isinstance(full, bytes) and isinstance(network, bytes)):
        raise BadAddress(f"not a weight-plane address: [{type(host).__name__}, ...]")
    return full if host == host_identity() else network
