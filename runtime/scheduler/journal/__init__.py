"""Durable journal for the scheduler core: batched-fsync record log plus snapshots.

The scheduler core is a deterministic state machine. Each state change is a *record* (a plain
msgpack value, conventionally a list starting with a small int opcode), and replaying the
records in order on a fresh core rebuilds the same state. The core can also export its whole
state as a *snapshot* dict. This module only stores and returns those values; it never looks
inside a record.

On-disk layout (one directory per run)
--------------------------------------
``journal-<first_seq:012d>.log``
    A segment: frames for records ``first_seq, first_seq + 1, ...`` back to back, no file
    header. Sequence numbers run 1, 2, 3, ... across the whole run, with no gaps across
    segments. A new segment starts after every snapshot.
``snapshot-<seq:012d>.msgpack``
    One frame whose payload is ``msgpack([seq, state])``: the state after record ``seq``.
``snapshot-<seq:012d>.msgpack.tmp``
    A snapshot being written. Never read; the next writer deletes it.
``lock``
    Empty file, ``flock``-ed by the single open :class:`JournalWriter`.

Frame: ``<u32 length><u32 crc32(payload)><payload>``, little endian, ``0 < length <= 64 MiB``
for records. A record's payload is ``msgpack.packb([seq, record], use_bin_type=True)``.

Values come back as msgpack decodes them (``raw=False, strict_map_key=False``): tuples come
back as lists, str stays str, bytes stays bytes, map keys may be ints.

Recovery rules (see :func:`replay`):

* A damaged frame at the very end of the *last* segment is a torn write from a crash and is
  ignored: a short header, a short payload, a crc mismatch on the final frame, or a damaged
  frame followed only by zero bytes (some filesystems expose zero-filled blocks after a crash).
  :meth:`JournalWriter.open` truncates it away before appending. An *empty* last segment
  after such a torn one is part of the same torn tail (the writer had started the next
  segment for a snapshot) and is dropped too.
* Any other damage (a bad frame followed by data, a damaged non-last segment, a seq gap within
  or between segments) raises :class:`JournalCorrupt` naming the file and byte offset.
* The newest snapshot whose crc and seq check out is used; older ones are fallbacks. The writer
  keeps the newest two snapshots and every segment with records after the older of them.

Durability: records are framed in memory and handed off in batches. By default a batch is
written by the appending thread (when nothing is queued before it) and fsynced by a log
thread (see :class:`JournalWriter`), which also stores snapshots and retires old files, all
in the order they were asked for; a batch that finds work queued is written there too. No
record reaches a segment before the previous segment is fully on disk, so only the last
segment holding records can be missing some.

Modules: ``_format`` (frame layout, names, errors), ``_replay`` (reading and recovery rules),
``_files`` (lock, recovery at open, file helpers), ``_syncer`` (who does the disk work) and
``_writer`` (:class:`JournalWriter`).
"""

from ._files import JournalLocked
from ._format import MAX_RECORD_BYTES, JournalCorrupt, segment_name, snapshot_name
from ._replay import Replay, replay
from ._writer import JournalStats, JournalWriter

__all__ = [
    "MAX_RECORD_BYTES",
    "JournalCorrupt",
    "JournalLocked",
    "JournalStats",
    "JournalWriter",
    "Replay",
    "replay",
    "segment_name",
    "snapshot_name",
]
