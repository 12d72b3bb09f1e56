"""Read Go nsqd's queues as go-diskqueue v1.1 wrote them (nsqd v1.x), offline.

A queue named N (a topic ``orders``, or a channel's ``orders:billing``) is
``N.diskqueue.NNNNNN.dat`` files of ``[int32 BE size][size bytes]`` records, and
``N.diskqueue.meta.dat``: ``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``.
What is pending is everything from (readFileNum, readPos) up to the end of writeFileNum.
Each record is an nsqd message (nsqd/message.go): ``[int64 BE timestamp ns][uint16 BE
attempts][16-byte id][body]``; attempts counts the deliveries already made (Go adds one
when it sends the message again).

Like Go's reader, a file is read to its end even past a stale writePos (Go salvages those
records too), and a bad size or a short record ends that file: the rest of the file is
skipped and reading goes on with the next one. Every such skip is reported with the file's
name and byte offset.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GoMessage", "QueueMeta", "read_meta", "read_queue", "queue_name", "queue_files",
           "MIN_MSG_SIZE"]

MIN_MSG_SIZE = 8 + 2 + 16  # timestamp + attempts + id (nsqd's minValidMsgLength)
_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">qH16s")
_FILE = re.compile(r"(.+)\.diskqueue\.(?:\d{6,}|meta)\.dat(?:\.bad)?\Z")
_META = re.compile(rb"\s*(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\s*\Z")


@dataclass(frozen=True, slots=True)
class GoMessage:
    id: bytes  # 16 bytes, as Go sent it to clients
    timestamp: int  # ns
    attempts: int  # deliveries made before the shutdown
    body: bytes


@dataclass(frozen=True, slots=True)
class QueueMeta:
    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int


def queue_name(topic: str, channel: str | None = None) -> str:
    """Go's backend name: the topic's, or ``topic:channel`` (nsqd/dqname.go, not Windows)."""
    return topic if channel is None else f"{topic}:{channel}"


def _data_file(root: Path, name: str, num: int) -> Path:
    return root / f"{name}.diskqueue.{num:06d}.dat"


def read_meta(root: Path, name: str) -> QueueMeta | None:
    """The queue's positions; None when it has no meta file (Go then starts it empty).

    ValueError when the file is not go-diskqueue's format."""
    path = root / f"{name}.diskqueue.meta.dat"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    m = _META.match(raw)
    if m is None:
        raise ValueError(f"{path.name}: not a go-diskqueue meta file: {raw[:80]!r}")
    meta = QueueMeta(*map(int, m.groups()))
    if min(meta.read_file, meta.read_pos, meta.write_file, meta.write_pos) < 0 or \
            (meta.read_file, meta.read_pos) > (meta.write_file, meta.write_pos):
        raise ValueError(f"{path.name}: impossible positions {raw.decode(errors='replace')!r}")
    return meta


def read_queue(root: Path, name: str, report: Callable[[str], None],
               max_msg_size: int = 1 << 20) -> Iterator[GoMessage]:
    """The pending messages of queue ``name`` in ``root``, oldest first.

    ``report`` gets one line per problem (a missing, truncated or corrupt file: name and byte
    offset); what can be read around it is still yielded. ``max_msg_size`` is Go nsqd's
    ``--max-msg-size`` (a larger size field is corruption, as for Go).
    """
    try:
        meta = read_meta(root, name)
    except ValueError as exc:
        report(f"{exc}; queue {name} skipped")
        return
    if meta is None:
        return
    limit = max_msg_size + MIN_MSG_SIZE
    for num in range(meta.read_file, meta.write_file + 1):
        path = _data_file(root, name, num)
        start = meta.read_pos if num == meta.read_file else 0
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if num < meta.write_file or meta.write_pos > 0:
                report(f"{path.name}: missing (meta says messages are pending in it)")
            continue
        if num == meta.write_file and len(data) < meta.write_pos:
            report(f"{path.name}: offset {len(data)}: file ends before writePos "
                   f"{meta.write_pos} (truncated)")
        yield from _records(path.name, data, start, limit, report)


def _records(fname: str, data: bytes, pos: int, limit: int,
             report: Callable[[str], None]) -> Iterator[GoMessage]:
    n = len(data)
    if pos > n:
        report(f"{fname}: offset {n}: file ends before readPos {pos} (truncated)")
        return
    while pos < n:
        if pos + 4 > n:
            report(f"{fname}: offset {pos}: truncated size field ({n - pos} of 4 bytes); "
                   "rest of the file skipped")
            return
        (size,) = _SIZE.unpack_from(data, pos)
        if size < MIN_MSG_SIZE or size > limit:
            report(f"{fname}: offset {pos}: invalid message size {size}; "
                   f"rest of the file ({n - pos} bytes) skipped")
            return
        end = pos + 4 + size
        if end > n:
            report(f"{fname}: offset {pos}: truncated message ({n - pos - 4} of {size} "
                   "bytes); rest of the file skipped")
            return
        ts, attempts, mid = _HEAD.unpack_from(data, pos + 4)
        yield GoMessage(mid, ts, attempts, data[pos + 4 + MIN_MSG_SIZE:end])
        pos = end


def queue_files(root: Path) -> set[str]:
    """Names of every queue that has files in ``root`` (to report those nsqd.dat omits)."""
    return {m.group(1) for m in map(_FILE.match, os.listdir(root)) if m is not None}
