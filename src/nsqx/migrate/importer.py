"""``nsqx import``: move a stopped Go nsqd's topics, channels and backlog into nsqx's data path.

How Go's pending sets become one log per topic plus cursors (docs/design-notes.md, "Importing
from Go nsqd"): each channel's own queue is appended to the topic's log as one block, then the
topic's own queue (what Go had not yet copied to its channels) as the last block. Every
channel's cursor starts at 0 with the other channels' blocks marked finished, so it gets its
own block and the topic block, nothing else. A topic without channels keeps its whole log as
the backlog its first channel receives (``pending_from`` 0), as Go's topic would.

Each message keeps its body, timestamp, attempts (Go's count plus the delivery to come) and
its id: the frame carries Go's id, and the partition's ``imported-ids`` file
(``nsqx.storage.imported_ids``) maps it to the offset, for the log's id checks and for
nsqd's FIN/REQ/TOUCH. A Go id that could be read as an nsqx id (its top 16 bits below
``FOREIGN_MIN_PARTITION``: a message from before February 2015, or not lowercase hex) gets
nsqx's id instead, with Go's in the record's ``go_id`` header, and is reported. Topics are written
under a staging directory and moved into place, then nsqd.dat is written last, so an
interrupted import leaves no half topic behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from nsqx import NSQ_VERSION
from nsqx.migrate.diskqueue import GoMessage, queue_files, queue_name, read_queue
from nsqx.nsqd.datapath import (
    LOCK_FILE,
    channels_dir,
    cursor_path,
    lock_path,
    metadata_path,
    partition_dir,
    topic_dir,
    topics_root,
)
from nsqx.protocol.names import is_ephemeral, valid_channel_name, valid_topic_name
from nsqx.storage.cursor import ChannelCursor
from nsqx.storage.fileio import write_durably
from nsqx.storage.imported_ids import FOREIGN_MIN_PARTITION
from nsqx.storage.log import LogConfig, PartitionLog
from nsqx.storage.message_id import make_id

__all__ = ["ImportError_", "GoChannel", "GoTopic", "read_go_metadata", "run_import",
           "LOCK_FILE"]

_STAGING = ".nsqx-import.tmp"
_FRAME = struct.Struct(">IIqH")  # size, type 2 (message), timestamp, attempts
_BATCH_BYTES = 1 << 20
_BATCH_COUNT = 8192
GO_ID_HEADER = "go_id"  # Go's id of a message that could not keep it (see _TopicWriter.add)
_HEX = frozenset(b"0123456789abcdef")


class ImportError_(Exception):  # noqa: N801 (ImportError is a builtin)
    """The import cannot start or go on; the text says why (one line for the operator)."""


@dataclass
class GoChannel:
    name: str
    paused: bool
    count: int = 0  # messages of its own queue


@dataclass
class GoTopic:
    name: str
    paused: bool
    channels: list[GoChannel] = field(default_factory=list)
    backlog: int = 0  # messages of the topic's own queue (reach every channel)


def read_go_metadata(go_path: Path, report: Callable[[str], None]) -> list[GoTopic]:
    """Topics and channels of Go's nsqd.dat (the ephemeral ones are not in it)."""
    path = go_path / "nsqd.dat"
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ImportError_(f"{path}: not found (is {go_path} Go nsqd's --data-path?)") from None
    except (OSError, ValueError) as exc:
        raise ImportError_(f"{path}: cannot read Go nsqd's metadata: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("topics") or [], list):
        raise ImportError_(f"{path}: not Go nsqd's metadata (no topics list)")
    topics = []
    for t in meta.get("topics") or []:
        name = t.get("name", "")
        if not valid_topic_name(name) or is_ephemeral(name):
            report(f"nsqd.dat: topic {name!r} skipped (invalid or ephemeral name)")
            continue
        topic = GoTopic(name, bool(t.get("paused")))
        for c in t.get("channels") or []:
            cname = c.get("name", "")
            if not valid_channel_name(cname) or is_ephemeral(cname):
                report(f"nsqd.dat: channel {name}/{cname!r} skipped (invalid or ephemeral name)")
                continue
            topic.channels.append(GoChannel(cname, bool(c.get("paused"))))
        topics.append(topic)
    known = {queue_name(t.name) for t in topics} | {
        queue_name(t.name, c.name) for t in topics for c in t.channels}
    for orphan in sorted(queue_files(go_path) - known):
        report(f"{orphan}.diskqueue.*: not in nsqd.dat, not imported")
    return topics


@contextmanager
def locked_data_path(data_path: Path, *, create: bool) -> Iterator[None]:
    """Hold nsqd's lock on ``data_path``: refuse one in use, keep nsqd out while writing."""
    if not data_path.exists():
        if not create:
            yield
            return
        data_path.mkdir(parents=True)
    try:
        fd = os.open(lock_path(data_path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ImportError_(f"--data-path={data_path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ImportError_(f"--data-path={data_path} in use (is nsqd running on it? "
                               "stop it first)") from None
        yield
    finally:
        os.close(fd)


def _check_go_stopped(go_path: Path) -> None:
    """Go nsqd flock()s its data directory while it runs (internal/dirlock); its memory
    queues reach the disk only when it stops, so a running one is refused."""
    fd = os.open(go_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        raise ImportError_(f"--from-nsqd-data={go_path} in use: stop Go nsqd first (SIGTERM: "
                           "it writes its memory queues to disk as it exits)") from None
    finally:
        os.close(fd)


class Progress:
    """Messages done and the rate, on ``out`` every ``interval`` seconds (long imports)."""

    def __init__(self, out: IO[str], interval: float, verb: str) -> None:
        self.out, self.interval, self.verb = out, interval, verb
        self.count = 0
        self.t0 = self._last = time.monotonic()

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            rate = self.count / max(now - self.t0, 1e-9)
            print(f"nsqx import: {self.verb} {self.count} messages ({rate:,.0f} msg/s)",
                  file=self.out, flush=True)


class _TopicWriter:
    """Appends Go messages to one partition log in batches of ready frames."""

    def __init__(self, path: Path) -> None:
        self.log = PartitionLog(path, 0, LogConfig())
        self.offset = self.log.next_offset
        self._parts: list[bytes] = []
        self._lengths: list[int] = []
        self._ids: list[int] = []
        self._headers: list[dict[str, bytes] | None] = []
        self._ts: list[int] = []
        self._bytes = 0
        self.renamed = 0  # messages that got nsqx's id (Go's in their go_id header)

    @property
    def next_offset(self) -> int:
        """Offset the next message added gets."""
        return self.offset + len(self._lengths)

    def add(self, m: GoMessage) -> None:
        size = 30 + len(m.body)
        # Go sends attempts+1 on the next delivery; nsqx sends a fresh frame as stored
        attempts = min(m.attempts + 1, 0xFFFF)
        mid = m.id
        value = int(mid, 16) if len(mid) == 16 and _HEX.issuperset(mid) else -1
        header = None
        if value >> 48 < FOREIGN_MIN_PARTITION:  # would read as an nsqx id (or is not hex)
            mid, header = make_id(0, self.next_offset), {GO_ID_HEADER: m.id}
            value = int(mid, 16)
            self.renamed += 1
        self._parts += (_FRAME.pack(size, 2, m.timestamp, attempts), mid, m.body)
        self._lengths.append(size + 4)
        self._ids.append(value)
        self._headers.append(header)
        self._ts.append(m.timestamp)
        self._bytes += size + 4
        if self._bytes >= _BATCH_BYTES or len(self._lengths) >= _BATCH_COUNT:
            self.flush()

    def flush(self) -> None:
        if not self._lengths:
            return
        n = len(self._lengths)
        self.log.record_imported(self._ids)
        self.log.append_frames(b"".join(self._parts), n, self._ts[0], headers=self._headers,
                               lengths=self._lengths, max_ts=max(self._ts))
        self.log.flush()
        self.offset += n
        self._parts, self._lengths, self._ids, self._headers, self._ts = [], [], [], [], []
        self._bytes = 0

    def close(self) -> None:
        self.flush()
        self.log.sync()
        self.log.close()


def _write_topic(go_path: Path, staging: Path, topic: GoTopic, report: Callable[[str], None],
                 progress: Progress, max_msg_size: int) -> None:
    tdir = topic_dir(staging, topic.name)
    writer = _TopicWriter(partition_dir(tdir, 0))
    blocks: dict[str, tuple[int, int]] = {}
    try:
        # each channel's own queue as one block, then the topic's (every channel gets it)
        for owner in [*topic.channels, None]:
            name = queue_name(topic.name, owner.name if owner is not None else None)
            start = writer.next_offset
            for m in read_queue(go_path, name, report, max_msg_size):
                writer.add(m)
                if writer.next_offset % 1024 == 0:
                    progress.add(1024)  # per 1024: a clock read per message costs more
            n = writer.next_offset - start
            if owner is None:
                topic.backlog = n
            else:
                owner.count = n
                blocks[owner.name] = (start, start + n)
    finally:
        writer.close()
    progress.add(writer.next_offset % 1024)
    if writer.renamed:
        report(f"topic {topic.name}: {writer.renamed} message(s) got nsqx ids, their Go ids "
               "could be read as nsqx ids (written before February 2015, or not lowercase "
               f"hex); each keeps Go's id in its {GO_ID_HEADER} header")
    if topic.channels:
        channels_dir(tdir).mkdir(parents=True, exist_ok=True)
    for c in topic.channels:
        cur = ChannelCursor(0, state_path=cursor_path(tdir, c.name))
        for other, (a, b) in sorted(blocks.items(), key=lambda kv: kv[1]):
            if other != c.name:
                cur.mark_finished_range(a, b)
        cur.paused = c.paused
        cur.close()  # persists


def _nsqx_metadata(data_path: Path) -> dict[str, Any]:
    path = metadata_path(data_path)
    if not path.exists():
        return {"topics": [], "version": NSQ_VERSION}
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ImportError_(f"{path}: cannot read nsqx's metadata: {exc}") from None
    meta.setdefault("topics", [])
    return meta


def _topic_metadata(t: GoTopic) -> dict[str, Any]:
    return {"name": t.name, "paused": t.paused,
            "channels": [{"name": c.name, "paused": c.paused} for c in t.channels],
            "pending_from": 0, "pending_deferred": []}


def _print_counts(topics: list[GoTopic], out: IO[str], *, dry_run: bool) -> None:
    head = "would import" if dry_run else "imported"
    for t in topics:
        flags = " (paused)" if t.paused else ""
        print(f"topic {t.name}{flags}: {t.backlog} in the topic's queue"
              + ("" if t.channels else " (no channel: the first channel gets them)"), file=out)
        for c in t.channels:
            flags = " (paused)" if c.paused else ""
            print(f"  channel {c.name}{flags}: {c.count + t.backlog} pending "
                  f"({c.count} own + {t.backlog} from the topic)", file=out)
    total = sum(t.backlog + sum(c.count for c in t.channels) for t in topics)
    print(f"{head} {len(topics)} topics, "
          f"{sum(len(t.channels) for t in topics)} channels, {total} messages stored",
          file=out)


def _count(go_path: Path, topics: list[GoTopic], report: Callable[[str], None],
           progress: Progress, max_msg_size: int) -> None:
    for t in topics:
        for c in t.channels:
            for _ in read_queue(go_path, queue_name(t.name, c.name), report, max_msg_size):
                c.count += 1
            progress.add(c.count)
        for _ in read_queue(go_path, queue_name(t.name), report, max_msg_size):
            t.backlog += 1
        progress.add(t.backlog)


def run_import(go_path: str | Path, data_path: str | Path, *, dry_run: bool = False,
               max_msg_size: int = 1 << 20, out: IO[str] | None = None,
               err: IO[str] | None = None, progress_interval: float = 5.0) -> int:
    """Import (or, ``dry_run``, count); returns the exit status: 0, or 1 when something was
    reported (a corrupt file: the rest is imported all the same). ImportError_ when the
    import cannot be done at all (bad paths, a data path in use, a topic already there)."""
    out = out or sys.stdout
    err = err or sys.stderr
    go_path, data_path = Path(go_path).resolve(), Path(data_path).resolve()
    if go_path == data_path:
        raise ImportError_("--from-nsqd-data and --data-path must differ")
    if not go_path.is_dir():
        raise ImportError_(f"--from-nsqd-data={go_path}: not a directory")
    _check_go_stopped(go_path)
    problems: list[str] = []

    def report(line: str) -> None:
        problems.append(line)
        print(f"nsqx import: WARNING: {line}", file=err, flush=True)

    topics = read_go_metadata(go_path, report)
    progress = Progress(err, progress_interval, "read" if dry_run else "imported")
    with locked_data_path(data_path, create=not dry_run):
        meta = _nsqx_metadata(data_path) if data_path.exists() else {"topics": []}
        have = {t.get("name") for t in meta["topics"]}
        clash = [t.name for t in topics
                 if t.name in have or topic_dir(data_path, t.name).exists()]
        if clash:
            raise ImportError_(f"--data-path={data_path} already has topic(s) "
                               f"{', '.join(clash)}; import into a new data path")
        if dry_run:
            _count(go_path, topics, report, progress, max_msg_size)
        else:
            staging = data_path / _STAGING
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            try:
                for t in topics:
                    _write_topic(go_path, staging, t, report, progress, max_msg_size)
                topics_root(data_path).mkdir(exist_ok=True)
                for t in topics:
                    os.rename(topic_dir(staging, t.name), topic_dir(data_path, t.name))
                meta["topics"] += [_topic_metadata(t) for t in topics]
                meta.setdefault("version", NSQ_VERSION)
                write_durably(metadata_path(data_path), json.dumps(meta).encode())
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    _print_counts(topics, out, dry_run=dry_run)
    if problems:
        print(f"nsqx import: {len(problems)} problem(s) reported above; everything else "
              f"{'would be' if dry_run else 'was'} imported", file=err)
        return 1
    return 0
