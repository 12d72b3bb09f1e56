"""Message ids derived from (partition, offset).

An id is upstream's 16-byte token (ASCII lowercase hex of a 64-bit number), so every NSQ client
echoes it unchanged, and the broker finds the record from the id alone: the high 16 bits are the
partition, the low 48 bits the offset.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from itertools import chain

__all__ = ["make_id", "parse_id", "ids_for_range", "split_ids", "MAX_OFFSET", "MAX_PARTITION"]

MAX_PARTITION = (1 << 16) - 1
MAX_OFFSET = (1 << 48) - 1
_HEX = frozenset(b"0123456789abcdef")


def make_id(partition: int, offset: int) -> bytes:
    """16 ASCII hex bytes for one record."""
    if not 0 <= partition <= MAX_PARTITION or not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"partition {partition} / offset {offset} out of range")
    return b"%016x" % ((partition << 48) | offset)


def parse_id(mid: bytes) -> tuple[int, int]:
    """(partition, offset) of an id; ValueError unless it is 16 lowercase hex bytes."""
    if len(mid) != 16 or not _HEX.issuperset(mid):
        raise ValueError(f"invalid message id {bytes(mid)!r}")
    v = int(mid, 16)
    return v >> 48, v & MAX_OFFSET


@lru_cache(maxsize=256)
def _q_struct(n: int) -> struct.Struct:
    return struct.Struct(f">{n}Q")


@lru_cache(maxsize=256)
def _split_struct(n: int) -> struct.Struct:
    return struct.Struct("16s" * n)


def ids_for_range(partition: int, start: int, count: int) -> bytes:
    """count consecutive ids as one bytes object (count*16), built in C (pack + hex)."""
    if count <= 0:
        return b""
    if not 0 <= partition <= MAX_PARTITION or start < 0 or start + count - 1 > MAX_OFFSET:
        raise ValueError(f"partition {partition} / offsets {start}+{count} out of range")
    first = (partition << 48) | start
    return _q_struct(count).pack(*range(first, first + count)).hex().encode()


def split_ids(ids: bytes, count: int) -> tuple[bytes, ...]:
    """Split count*16 bytes into count ids without a Python loop (cached struct for small n)."""
    if count <= 4096:
        return _split_struct(count).unpack(ids)
    full, rest = divmod(count, 4096)
    cut = full * 4096 * 16
    out = tuple(chain.from_iterable(_split_struct(4096).iter_unpack(ids[:cut])))
    return out + _split_struct(rest).unpack(ids[cut:]) if rest else out
