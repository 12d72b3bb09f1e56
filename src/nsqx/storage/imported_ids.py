"""Offsets whose frames carry another broker's message ids (``nsqx import`` from Go nsqd).

A frame normally carries nsqx's id of its (partition, offset) (``message_id``), which is how
nsqd finds the record a FIN/REQ/TOUCH names and how the log checks its frames. A message
imported from Go nsqd keeps Go's id in its frame instead, so that a stock client answers it
by the id Go gave it. Such a partition holds the file ``imported-ids`` beside its segments:
the imported offset range [lo, hi) and each (id, offset) pair of it, sorted by id. The log's
checks of a frame's id against its offset (``append_frames``, recovery) take the recorded id
for an offset inside the range and nsqx's id everywhere else; nsqd resolves an id through
``offsets_of`` only when its top 16 bits name no partition of the topic.

Which ids may be recorded: nsqx's own id for that offset, or an id whose top 16 bits are at
least ``FOREIGN_MIN_PARTITION``, one more than the most partitions a topic may have
(``partition_num`` 1..1024), so a recorded foreign id never decodes to a real partition.
(Go's ids are ``(ns >> 20) - epoch(2012-10-28)`` shifted left by 22: the top 16 bits count
~19.5-hour steps since then, past 1024 from 9 February 2015 on.)

File (little-endian): ``b"NSQXIDS1"``, lo u64, n u64, n sorted ids u64, their n offsets
u64, crc32 u32 of everything before. 16 bytes per imported message, in memory too.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from pathlib import Path

from nsqx.storage.checksum import crc32
from nsqx.storage.fileio import write_durably
from nsqx.storage.message_id import ids_for_range

__all__ = ["FILE_NAME", "FOREIGN_MIN_PARTITION", "ImportedIds", "expected_ids", "load", "locate_all"]

FILE_NAME = "imported-ids"
FOREIGN_MIN_PARTITION = 1024
_MAGIC = b"NSQXIDS1"
_HEAD = struct.Struct("<8sQQ")
_U32 = struct.Struct("<I")
_BIG = sys.byteorder == "big"


class ImportedIds:
    """The imported range [lo, hi) of one partition and its id -> offsets index."""

    __slots__ = ("lo", "hi", "dirty", "_keys", "_offs", "_by_off")

    def __init__(self, lo: int) -> None:
        self.lo = self.hi = lo
        self.dirty = False  # changed since loaded or saved
        # sorted ids and their offsets (what the file holds), built from _by_off on demand
        self._keys: array | None = None
        self._offs: array | None = None
        # id of each offset lo.. (what an import appends), built from the index on demand
        self._by_off: array | None = array("Q")

    def __len__(self) -> int:
        return self.hi - self.lo

    def extend(self, partition: int, ids: Sequence[int]) -> None:
        """Record the ids of the frames at offsets hi, hi + 1, ... (ValueError for an id
        that is neither nsqx's for its offset nor clear of every partition)."""
        for i, v in enumerate(ids):
            if not 0 <= v < 1 << 64 or (v >> 48 < FOREIGN_MIN_PARTITION
                                        and v != (partition << 48) | (self.hi + i)):
                raise ValueError(f"id {v:#x} at offset {self.hi + i} could be read as an "
                                 f"nsqx id of another offset")
        self._by_offset().extend(ids)
        self.hi += len(ids)
        self._keys = self._offs = None
        self.dirty = True

    def cut(self, offset: int) -> None:
        """Forget offsets >= offset (the log was truncated there)."""
        if offset < self.hi:
            keep = max(offset, self.lo) - self.lo
            del self._by_offset()[keep:]
            self.hi = self.lo + keep
            self._keys = self._offs = None
            self.dirty = True

    def _by_offset(self) -> array:
        if self._by_off is None:  # recovery or truncation of an imported range only
            assert self._keys is not None and self._offs is not None
            inv = array("Q", bytes(8 * len(self)))
            lo = self.lo
            for k, o in zip(self._keys, self._offs, strict=True):
                inv[o - lo] = k
            self._by_off = inv
        return self._by_off

    def _index(self) -> tuple[array, array]:
        if self._keys is None or self._offs is None:  # the importer's save
            by_off = self._by_off
            assert by_off is not None
            order = sorted(range(len(by_off)), key=by_off.__getitem__)
            self._keys = array("Q", [by_off[i] for i in order])
            self._offs = array("Q", [self.lo + i for i in order])
        return self._keys, self._offs

    def offsets_of(self, value: int) -> list[int]:
        """Offsets whose frame carries the id ``value`` (Go copies a message to each channel
        with the same id, so one per channel block that owed it), ascending."""
        keys, offs = self._index()
        i = bisect_left(keys, value)
        out = []
        while i < len(keys) and keys[i] == value:
            out.append(offs[i])
            i += 1
        return out

    def ids(self, partition: int, base: int, count: int) -> bytes:
        """The 16-byte ids the frames at [base, base + count) carry, back to back."""
        lo, hi = self.lo, self.hi
        if base >= hi or base + count <= lo:
            return ids_for_range(partition, base, count)
        a, b = max(base, lo), min(base + count, hi)
        vals = self._by_offset()[a - lo:b - lo]
        return b"".join((ids_for_range(partition, base, a - base),
                         struct.pack(f">{len(vals)}Q", *vals).hex().encode(),
                         ids_for_range(partition, b, base + count - b)))

    def save(self, directory: Path) -> None:
        """Write ``directory/imported-ids`` durably (tmp, fsync, rename, directory fsync);
        an empty range removes it."""
        path = directory / FILE_NAME
        if not len(self):
            path.unlink(missing_ok=True)
            self.dirty = False
            return
        keys, offs = self._index()
        if _BIG:
            keys, offs = array("Q", keys), array("Q", offs)
            keys.byteswap()
            offs.byteswap()
        data = _HEAD.pack(_MAGIC, self.lo, len(self)) + keys.tobytes() + offs.tobytes()
        write_durably(path, data + _U32.pack(crc32(data)))
        self.dirty = False


def load(directory: Path) -> ImportedIds | None:
    """The partition's imported ids, None when it has none (the one cost for every other
    partition: a failed open). ValueError when the file is damaged: the frames of the range
    would fail their id checks without it, so the caller must not go on as if it had none."""
    path = directory / FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _HEAD.size + 4 or crc32(raw[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
        raise ValueError(f"{path}: damaged (bad size or checksum)")
    magic, lo, n = _HEAD.unpack_from(raw)
    if magic != _MAGIC or len(raw) != _HEAD.size + 16 * n + 4:
        raise ValueError(f"{path}: not an imported-ids file of this version")
    keys, offs = array("Q"), array("Q")
    keys.frombytes(raw[_HEAD.size:_HEAD.size + 8 * n])
    offs.frombytes(raw[_HEAD.size + 8 * n:_HEAD.size + 16 * n])
    if _BIG:
        keys.byteswap()
        offs.byteswap()
    out = ImportedIds(lo)
    out.hi = lo + n
    out._keys, out._offs, out._by_off = keys, offs, None
    return out


def expected_ids(partition: int, base: int, count: int, imported: ImportedIds | None) -> bytes:
    """The ids frames [base, base + count) of a partition must carry (recovery's checks)."""
    if imported is None:
        return ids_for_range(partition, base, count)
    return imported.ids(partition, base, count)


def locate_all(records: Iterable[tuple[int, ImportedIds | None]], value: int
               ) -> list[tuple[int, int]]:
    """Every (partition, offset) holding an imported message by its original id, over a
    topic's (partition, its record or None): Go nsqd stored a copy per channel, each with
    the same id. Callers ask only for ids whose top bits name no partition."""
    return [(p, o) for p, rec in records if rec is not None for o in rec.offsets_of(value)]
