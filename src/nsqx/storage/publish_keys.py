"""What a partition has already stored for idempotent publishers, recovered from its log.

Two kinds of marks ride in the log itself, as extension headers on the first record of a
publish batch, so they are replicated with it and survive a crash or a failover:

* ``nsqx-pub: <key>#<count>[#<fingerprint>]``: a keyed publish (the Spark sink's
  ``/nsqx/pub``, HTTP ``Idempotency-Key``); a key is stored at most once.
* ``##nsqx_producer: <producer id>:<epoch>:<sequence>``: an idempotent TCP producer's
  batch; a producer's sequence numbers on one partition are consecutive.

:class:`PublishKeys` indexes both for one partition log: keys in SQLite (or in memory for an
ephemeral topic), producers' last sequences in memory with a SQLite checkpoint. ``covered``
is the offset below which every record's marks are indexed; records between it and the
end the caller trusts are read from the log's header sidecar (:meth:`catch_up`), which is
how a crash between the append and the index write, or records replicated while this node
was a follower, are taken in. Both sets are bounded by a time window and a count.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PRODUCER_HEADER", "PUB_KEY_HEADER", "ProducerState", "PublishKeys",
           "forget_marks_from", "format_producer", "parse_producer"]

log = logging.getLogger("nsqx.storage.publish_keys")

PUB_KEY_HEADER = "nsqx-pub"
PRODUCER_HEADER = "##nsqx_producer"
DEFAULT_WINDOW = 24 * 3600.0
# the Spark sink's keys (``writer:batch:task``, no ``h/`` prefix) are kept at least this
# long, as before the window existed: a streaming query may replay a micro-batch days later
PIPELINE_KEY_TTL = 7 * 86400.0
HTTP_KEY_PREFIX = "h/"
DEFAULT_MAX_KEYS = 1_000_000
DEFAULT_MAX_PRODUCERS = 10_000


@dataclass(slots=True)
class ProducerState:
    """The newest batch of one producer id stored on this partition."""

    epoch: int
    seq: int
    base: int
    count: int
    seen: float


def format_producer(pid: str, epoch: int, seq: int) -> bytes:
    return f"{pid}:{epoch}:{seq}".encode()


def parse_producer(raw: bytes) -> tuple[str, int, int] | None:
    """``<id>:<epoch>:<seq>`` -> (id, epoch, seq), None when malformed."""
    try:
        pid, epoch, seq = bytes(raw).decode("ascii").split(":")
    except (UnicodeDecodeError, ValueError):
        return None
    if not (0 < len(pid) <= 64 and epoch.isdigit() and seq.isdigit()
            and len(epoch) < 19 and len(seq) < 19):
        return None
    return pid, int(epoch), int(seq)


def parse_key(raw: bytes) -> tuple[str, int, str] | None:
    """``<key>#<count>[#<fingerprint>]`` -> (key, count, fingerprint)."""
    try:
        parts = bytes(raw).decode().split("#")
    except UnicodeDecodeError:
        return None
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2] if len(parts) == 3 else ""


class PublishKeys:
    """The idempotence index of one partition log (see the module's docstring)."""

    def __init__(self, path: Path | None, plog: Any, *, window: float = DEFAULT_WINDOW,
                 max_keys: int = DEFAULT_MAX_KEYS,
                 max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        self.path = path
        self.log = plog
        self.window = window
        self.pipeline_window = max(window, PIPELINE_KEY_TTL)
        self.max_keys = max_keys
        self.max_producers = max_producers
        self.mem: OrderedDict[str, tuple[int, int, str, float]] = OrderedDict()
        self.producers: OrderedDict[str, ProducerState] = OrderedDict()
        self.db: sqlite3.Connection | None = None
        self.dirty = False
        self._puts = 0
        watermark = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            # no fsync per key: the log's headers are the truth, read again past the watermark
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, base INTEGER, "
                            "count INTEGER, created REAL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value)")
            self.db.execute("CREATE TABLE IF NOT EXISTS producers (pid TEXT PRIMARY KEY, "
                            "epoch INTEGER, seq INTEGER, base INTEGER, count INTEGER, seen REAL)")
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(keys)")}
            if "fp" not in cols:  # an index written before HTTP keys had fingerprints
                self.db.execute("ALTER TABLE keys ADD COLUMN fp TEXT DEFAULT ''")
            row = self.db.execute("SELECT value FROM meta WHERE name='watermark'").fetchone()
            watermark = int(row[0]) if row else 0
            horizon = time.time() - window
            for pid, epoch, seq, base, count, seen in self.db.execute(
                    "SELECT * FROM producers WHERE seen >= ? ORDER BY seen", (horizon,)):
                self.producers[pid] = ProducerState(epoch, seq, base, count, seen)
        self.covered = self._scan_start(watermark)
        recovered = self.catch_up(plog.flushed_offset)
        if recovered:
            log.info("%s: recovered %d idempotent publishes from the log", path or "memory",
                     recovered)
        self.checkpoint()

    def _scan_start(self, watermark: int) -> int:
        """Where recovery reads from: the watermark, but nothing older than the window."""
        lo = max(watermark, self.log.start_offset)
        if self.log.flushed_offset > lo:
            try:
                recent = self.log.offset_for_time(
                    time.time_ns() - int(self.pipeline_window * 1e9))
            except Exception:  # an archive that cannot be read: scan what is local
                recent = None
            if recent is not None:
                lo = max(lo, min(int(recent), self.log.flushed_offset))
        return lo

    # -- the log -------------------------------------------------------------------------
    def catch_up(self, end: int) -> int:
        """Index the marks of records in [covered, end) (a crash's or a follower's tail)."""
        end = min(end, self.log.flushed_offset)
        if end <= self.covered:
            return 0
        found = 0
        for off, h in sorted(self.log.headers_range(self.covered, end).items()):
            found += self.note(off, h)
        self.covered = end
        return found

    def note(self, base: int, h: dict[str, bytes] | None, count: int | None = None) -> int:
        """Index the marks of the batch at ``base`` (its first record's headers)."""
        if not h:
            return 0
        now = time.time()
        n = 0
        raw = h.get(PUB_KEY_HEADER)
        if raw is not None:
            parsed = parse_key(raw)
            if parsed is not None:
                self.put(parsed[0], base, parsed[1], parsed[2], now)
                n += 1
        raw = h.get(PRODUCER_HEADER)
        if raw is not None:
            p = parse_producer(raw)
            if p is not None:
                self.put_producer(p[0], p[1], p[2], base, count or 1, now)
                n += 1
        return n

    def acked(self, base: int, count: int, h: dict[str, bytes] | None) -> None:
        """A batch this node appended is durable: index it, and move ``covered`` past it
        when nothing before it is unindexed."""
        self.note(base, h, count)
        self.advance(base, count)

    def advance(self, base: int, count: int) -> None:
        """The batch at ``base`` is indexed: ``covered`` moves past it when it was next."""
        if self.covered == base:
            self.covered = base + count

    # -- keys ----------------------------------------------------------------------------
    def _key_window(self, key: str) -> float:
        return self.window if key.startswith(HTTP_KEY_PREFIX) else self.pipeline_window

    def get(self, key: str) -> tuple[int, int, str] | None:
        """(base, count, fingerprint) of a key stored within the window."""
        horizon = time.time() - self._key_window(key)
        hit = self.mem.get(key)
        if hit is not None:
            return (hit[0], hit[1], hit[2]) if hit[3] >= horizon else None
        if self.db is None:
            return None
        row = self.db.execute("SELECT base, count, fp, created FROM keys WHERE key=?",
                              (key,)).fetchone()
        if row is None or row[3] < horizon:
            return None
        return int(row[0]), int(row[1]), row[2] or ""

    def keys_since(self, prefix: str, since: float, limit: int) -> list[tuple[str, float]]:
        """(key, created) of the newest ``limit`` keys starting with ``prefix`` created at
        ``since`` or later (a node's start reads which topic its HTTP keys were used on).
        Newest by rowid: a key written again gets a new one, and no sort is needed."""
        out = [(k, v[3]) for k, v in self.mem.items() if k.startswith(prefix) and v[3] >= since]
        if self.db is not None:
            out += self.db.execute("SELECT key, created FROM keys WHERE substr(key, 1, ?) = ? "
                                   "AND created >= ? ORDER BY rowid DESC LIMIT ?",
                                   (len(prefix), prefix, since, limit)).fetchall()
        return out[-limit:] if len(out) > limit else out

    def put(self, key: str, base: int, count: int, fp: str = "", now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self.db is None:
            self.mem[key] = (base, count, fp, now)
            self.mem.move_to_end(key)
            while len(self.mem) > self.max_keys:
                self.mem.popitem(last=False)
            return
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO keys (key, base, count, created, fp) "
                            "VALUES (?,?,?,?,?)", (key, base, count, now, fp))
        self._puts += 1
        if self._puts % 256 == 0:
            self.expire(now)

    def expire(self, now: float | None = None) -> None:
        """Forget keys older than the window, then the oldest past the count bound."""
        now = time.time() if now is None else now
        horizon = now - self.window
        for k in [k for k, v in self.mem.items() if v[3] < now - self._key_window(k)]:
            del self.mem[k]
        for pid in [p for p, s in self.producers.items() if s.seen < horizon]:
            del self.producers[pid]
        if self.db is not None:
            with self.db:
                self.db.execute("DELETE FROM keys WHERE created < ? AND substr(key, 1, 2) = ?",
                                (horizon, HTTP_KEY_PREFIX))
                self.db.execute("DELETE FROM keys WHERE created < ?",
                                (now - self.pipeline_window,))
                (n,) = self.db.execute("SELECT count(*) FROM keys").fetchone()
                if n > self.max_keys:
                    self.db.execute("DELETE FROM keys WHERE rowid IN (SELECT rowid FROM keys "
                                    "ORDER BY created LIMIT ?)", (n - self.max_keys,))

    # -- producers -----------------------------------------------------------------------
    def producer(self, pid: str) -> ProducerState | None:
        st = self.producers.get(pid)
        if st is not None and st.seen < time.time() - self.window:
            del self.producers[pid]
            return None
        return st

    def put_producer(self, pid: str, epoch: int, seq: int, base: int, count: int,
                     now: float | None = None) -> None:
        st = self.producers.get(pid)
        if st is not None and (epoch, seq) < (st.epoch, st.seq):
            return  # an older batch read again by a scan
        now = time.time() if now is None else now
        if st is None:
            self.producers[pid] = ProducerState(epoch, seq, base, count, now)
            while len(self.producers) > self.max_producers:
                self.producers.popitem(last=False)
        else:
            st.epoch, st.seq, st.base, st.count, st.seen = epoch, seq, base, count, now
            self.producers.move_to_end(pid)
        self.dirty = True

    def forget_from(self, offset: int) -> None:
        """The log was cut at ``offset``: drop what was indexed of the records cut (a
        producer whose newest batch was cut is forgotten: it starts again at sequence 0)."""
        for k in [k for k, v in self.mem.items() if v[0] >= offset]:
            del self.mem[k]
        for pid in [p for p, st in self.producers.items() if st.base >= offset]:
            del self.producers[pid]
        self.covered = min(self.covered, offset)
        if self.db is not None:
            with self.db:
                self.db.execute("DELETE FROM keys WHERE base >= ?", (offset,))
        self.checkpoint()

    # -- persistence ---------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write the producers and the watermark (``covered``): what recovery skips."""
        if self.db is None:
            self.dirty = False
            return
        rows = [(p, s.epoch, s.seq, s.base, s.count, s.seen) for p, s in self.producers.items()]
        with self.db:
            self.db.execute("DELETE FROM producers")
            self.db.executemany("INSERT INTO producers VALUES (?,?,?,?,?,?)", rows)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('watermark', ?)", (self.covered,))
        self.dirty = False

    def close(self) -> None:
        if self.db is not None:
            try:
                self.checkpoint()
            finally:
                self.db.close()
                self.db = None


def forget_marks_from(path: Path, offset: int) -> None:
    """:meth:`PublishKeys.forget_from` on an index that is not open (no log scan)."""
    if not path.exists():
        return
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        with db:
            db.execute("DELETE FROM keys WHERE base >= ?", (offset,))
            db.execute("DELETE FROM producers WHERE base >= ?", (offset,))
            db.execute("UPDATE meta SET value = min(value, ?) WHERE name='watermark'", (offset,))
    except sqlite3.OperationalError as exc:  # an index never written: nothing to forget
        log.warning("%s: could not cut the idempotence index at %d: %s", path, offset, exc)
    finally:
        db.close()
