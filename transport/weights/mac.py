"""Who a node's weight plane is open to, and the keyed checks that keep it so.

A run whose bus never leaves this host (ipc:// or loopback) is *local*: UCX's TCP
transport listens on loopback only, and the other transports it uses here (shared memory,
cross-memory attach) reach only this host. Otherwise UCX listens on every interface,
unencrypted (UCX has no encryption for host memory over TCP), and the run's key
(:func:`weights_key`, derived from the run secret) makes up for it:

- every range request carries an HMAC-SHA256 (16 bytes) over the request and the address
  of the node it is for, and a sequence number that only goes up: a node that holds the key
  serves no request without a good MAC, nor one it has seen (:class:`RequestGuard`);
- every bucket carries an HMAC-SHA256 in the manifest, which receivers check instead of
  the CRC-32C (:func:`bucket_macs`, :class:`BucketCheck`), so bytes altered on the way,
  checksum and all, are refused.

A local run keeps CRC-32C on its buckets: they never leave the host, and it checks at
16 GB/s here where HMAC-SHA256 runs at 1.8 (BLAKE2b 0.9, keyed BLAKE2s 0.5; one 64 MiB
bucket, one core). Its requests are authenticated too when the key is at hand: loopback
is open to every user of the host.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c
import numpy as np

from .layout import MAC_BYTES, Manifest, ManifestError, Stager

__all__ = [
    "LOCAL_ONLY",
    "MAC_BYTES",
    "BucketCheck",
    "Refused",
    "RequestGuard",
    "RequestKey",
    "WeightsAccess",
    "bucket_macs",
    "weights_key",
]

_REPLAY_WINDOW = 1024  # sequence numbers below a peer's highest still accepted once
_PEERS_REMEMBERED = 4096  # peers whose sequence numbers are kept (least recent forgotten)
_REFUSAL_LOG_S = 10.0  # refusals are logged once per this many seconds, with a count


def weights_key(run_secret: bytes) -> bytes:
    """The weight plane's key, derived from the run secret (never the secret itself)."""
    return hmac.digest(run_secret, b"asyncrl weights", "sha256")


@dataclass(frozen=True, slots=True)
class WeightsAccess:
    """Who may reach this node's weight plane: with ``local``, this host only (its TCP
    listener on loopback); ``key`` (from :func:`weights_key`) authenticates requests, and,
    unless ``local``, bucket MACs. A run across machines cannot go without it."""

    local: bool = True
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.local and not self.key:
            raise ValueError(
                "weights cross machines in this run and need the run's key to authenticate "
                "requests and buckets: the run secret (run.dir/run.secret) is not readable here"
            )

    @property
    def signs_buckets(self) -> bool:
        return not self.local


LOCAL_ONLY = WeightsAccess()
"""This host only, without a key: what a node is open to unless told otherwise."""


def _subkey(key: bytes, purpose: bytes) -> bytes:
    return hmac.digest(key, b"asyncrl weights " + purpose, "sha256")


def _mac(key: bytes, *parts: bytes) -> bytes:
    signer = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        signer.update(len(part).to_bytes(8, "little"))
        signer.update(part)
    return signer.digest()[:MAC_BYTES]


# --- buckets -----------------------------------------------------------------------------


def bucket_macs(
    key: bytes, buffer: np.ndarray, total: int, bucket_bytes: int, stager: Stager
) -> bytes:
    """The MAC of every bucket of ``buffer[:total]``, concatenated in order, computed on
    ``stager``'s threads (HMAC lets go of the GIL)."""
    bucket_key, view = _subkey(key, b"bucket"), memoryview(buffer)

    def one(index: int) -> bytes:
        start = index * bucket_bytes
        return _mac(bucket_key, view[start : min(total, start + bucket_bytes)])

    return b"".join(stager.spread(one, -(-total // bucket_bytes)))


class BucketCheck:
    """Whether a bucket of ``manifest``'s version is what its publisher staged.

    With ``access.signs_buckets`` the manifest must carry MACs (one without is refused: its
    buckets could be altered along with their CRC-32C); otherwise a local receiver checks
    the CRC-32C.
    """

    def __init__(self, manifest: Manifest, access: WeightsAccess) -> None:
        self.manifest = manifest
        self._key: bytes | None = None
        if access.signs_buckets:
            if len(manifest.macs) != manifest.buckets * MAC_BYTES:
                raise ManifestError(
                    f"version {manifest.version} carries no bucket MACs, and weights cross "
                    "machines in this run: its bytes cannot be authenticated"
                )
            assert access.key is not None  # WeightsAccess insists
            self._key = _subkey(access.key, b"bucket")

    def __call__(self, index: int, data: memoryview) -> bool:
        m = self.manifest
        if self._key is None:
            return crc32c.crc32c(data) == m.checksums[index]
        expected = m.macs[index * MAC_BYTES : (index + 1) * MAC_BYTES]
        return hmac.compare_digest(_mac(self._key, data), expected)


# --- requests ----------------------------------------------------------------------------


class Refused(ValueError):
    """A request this node does not serve: not authenticated, or seen before."""


class RequestKey:
    """Seals range requests for the node at a given address, and opens them there."""

    def __init__(self, key: bytes) -> None:
        self._key = _subkey(key, b"request")

    def seal(self, to: bytes) -> Callable[[bytes], bytes]:
        """The MAC function for requests to the node at address ``to``."""
        return lambda fields: _mac(self._key, to, fields)

    def opens(self, at: bytes, fields: bytes, mac: bytes) -> bool:
        return hmac.compare_digest(_mac(self._key, at, fields), mac)


class RequestGuard:
    """A serving node's check on each request: a good MAC for this node's address, and a
    sequence number not seen from that peer before (a window of the last 1,024 below the
    highest; the 4,096 most recent peers are remembered). Without a key it lets all in."""

    def __init__(self, key: bytes | None, address: bytes, log: Callable[..., None]) -> None:
        self._requests = RequestKey(key) if key else None
        self._address = address
        self._peers: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # highest, seen bits
        self._log = log
        self.refused = 0
        self._unlogged = 0
        self._logged_at = -_REFUSAL_LOG_S

    def verify(self, fields: bytes, mac: bytes) -> None:
        """Before the request is parsed: Refused unless ``mac`` is right for ``fields``."""
        if self._requests is None:
            return
        if not mac:
            raise Refused("no MAC (the asker lacks the run's key)")
        if not self._requests.opens(self._address, fields, mac):
            raise Refused("wrong MAC (another key, another node, or altered)")

    def admit(self, peer: bytes, sequence: int) -> None:
        """After the MAC: Refused if ``peer`` sent ``sequence`` before (a replay)."""
        if self._requests is None:
            return
        peer_id = hashlib.blake2b(peer, digest_size=16).digest()
        highest, seen = self._peers.pop(peer_id, (0, 0))
        try:
            if sequence <= highest - _REPLAY_WINDOW:
                raise Refused(f"sequence {sequence} too old (the peer is at {highest})")
            if sequence > highest:
                seen = ((seen << (sequence - highest)) | 1) & ((1 << _REPLAY_WINDOW) - 1)
                highest = sequence
            elif seen >> (highest - sequence) & 1:
                raise Refused(f"sequence {sequence} seen before (a replay)")
            else:
                seen |= 1 << (highest - sequence)
        finally:
            self._peers[peer_id] = (highest, seen)
            if len(self._peers) > _PEERS_REMEMBERED:
                self._peers.popitem(last=False)

    def note(self, error: Refused) -> None:
        """Count a refusal; log it, at most once per 10 s (a flood must not fill the log)."""
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= _REFUSAL_LOG_S:
            self._log("weight request refused", reason=str(error), refused=self._unlogged)
            self._unlogged, self._logged_at = 0, now
