"""Deferred messages of one channel: a memory heap for short/few delays, SQLite for the rest.

Why two tiers: most requeues are short (a few seconds) and few, so a heap is the cheapest
thing.  Long delays (up to days) or a flood of them would pin memory for a long time and
must survive restarts without being rewritten on every cursor persist, so they go to a
small SQLite table (stdlib, WAL mode) that is its own durable store.

Entries are ``(offset, ready_at_ms, attempts)``; ``attempts`` is how many times the message
was already delivered (0 for a DPUB that was never delivered).  An offset is stored at most
once.  The store never looks at message bodies: the log keeps them.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterable
from pathlib import Path

__all__ = ["DelayStore", "LONG_DELAY_MS", "MAX_MEMORY"]

LONG_DELAY_MS = 60_000
MAX_MEMORY = 10_000
MAX_PENDING = 4096  # disk entries buffered before a write is forced


class DelayStore:
    """Delayed offsets: ``add`` them, ``pop_due`` them when their time comes.

    ``path=None`` keeps everything in memory (ephemeral channels).  With a path, the SQLite
    file is created on the first entry that goes to disk (or opened at once if it exists).

    Disk entries are buffered and written in one transaction by :meth:`flush` (the cursor
    calls it once per group commit, before publishes are acknowledged; every read of the
    disk tier flushes first): one SQLite transaction per DPUB made a DPUB cost 3x a PUB.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        long_delay_ms: int = LONG_DELAY_MS,
        max_memory: int = MAX_MEMORY,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.long_delay_ms = long_delay_ms
        self.max_memory = max_memory
        self._mem: dict[int, tuple[int, int]] = {}  # offset -> (ready_at_ms, attempts)
        self._heap: list[tuple[int, int]] = []  # (ready_at_ms, offset); stale entries skipped
        self._db: sqlite3.Connection | None = None
        self._disk_n = 0
        self._disk_min: int | None = None
        self._disk_min_stale = False
        self._pending: dict[int, tuple[int, int]] = {}  # disk entries not written yet
        self._pending_min: int | None = None
        if self.path is not None and self.path.exists():
            self._open()

    # -- sqlite ------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            assert self.path is not None
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS delays (offset INTEGER PRIMARY KEY, "
                "ready_at_ms INTEGER NOT NULL, attempts INTEGER NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS delays_ready ON delays (ready_at_ms)")
            self._db = db
            self._disk_n = db.execute("SELECT COUNT(*) FROM delays").fetchone()[0]
            self._disk_min_stale = True
        return self._db

    def _refresh_disk_min(self) -> None:
        self._disk_min_stale = False
        if self._db is None or not self._disk_n:
            self._disk_min = None
        else:
            self._disk_min = self._db.execute("SELECT MIN(ready_at_ms) FROM delays").fetchone()[0]

    # -- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._mem) + self._disk_n + len(self._pending)

    @property
    def memory_count(self) -> int:
        return len(self._mem)

    @property
    def disk_count(self) -> int:
        return self._disk_n + len(self._pending)

    def flush(self) -> None:
        """Write the buffered disk entries (one transaction)."""
        if self._pending:
            rows, self._pending, self._pending_min = self._pending, {}, None
            self._disk_put([(o, r, a) for o, (r, a) in rows.items()])

    # -- adding / removing -------------------------------------------------------------------
    def add(self, offset: int, ready_at_ms: int, attempts: int = 0, *, now_ms: int) -> None:
        """Store one entry (the caller guarantees the offset is not stored yet)."""
        if self.path is not None and (
            ready_at_ms - now_ms >= self.long_delay_ms or len(self._mem) >= self.max_memory
        ):
            self._pending[offset] = (ready_at_ms, attempts)
            if self._pending_min is None or ready_at_ms < self._pending_min:
                self._pending_min = ready_at_ms
            if len(self._pending) >= MAX_PENDING:
                self.flush()
        else:
            self._mem[offset] = (ready_at_ms, attempts)
            heapq.heappush(self._heap, (ready_at_ms, offset))

    def restore(self, items: Iterable[tuple[int, int, int]]) -> None:
        """Put persisted in-memory entries back in memory (cursor state load)."""
        for offset, ready_at_ms, attempts in items:
            self._mem[offset] = (ready_at_ms, attempts)
            self._heap.append((ready_at_ms, offset))
        heapq.heapify(self._heap)

    def _disk_put(self, rows: list[tuple[int, int, int]]) -> None:
        db = self._open()
        before = db.total_changes
        db.execute("BEGIN")
        try:
            for row in rows:
                cur = db.execute("INSERT OR IGNORE INTO delays VALUES (?, ?, ?)", row)
                if cur.rowcount == 0:  # already there: update in place, count unchanged
                    db.execute(
                        "UPDATE delays SET ready_at_ms = ?, attempts = ? WHERE offset = ?",
                        (row[1], row[2], row[0]),
                    )
                    before += 1
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._disk_n += db.total_changes - before
        lowest = min(r[1] for r in rows)
        if not self._disk_min_stale and (self._disk_min is None or lowest < self._disk_min):
            self._disk_min = lowest

    def remove(self, offset: int) -> tuple[int, int] | None:
        """Forget one entry; returns its (ready_at_ms, attempts) or None if absent."""
        got = self._mem.pop(offset, None)
        if got is not None:
            self._maybe_compact()
            return got
        self.flush()
        if self._db is None or not self._disk_n:
            return None
        row = self._db.execute(
            "SELECT ready_at_ms, attempts FROM delays WHERE offset = ?", (offset,)
        ).fetchone()
        if row is None:
            return None
        self._db.execute("DELETE FROM delays WHERE offset = ?", (offset,))
        self._disk_n -= 1
        self._disk_min_stale = True
        return row[0], row[1]

    def get(self, offset: int) -> tuple[int, int] | None:
        got = self._mem.get(offset)
        if got is None:
            self.flush()
        if got is not None or self._db is None or not self._disk_n:
            return got
        row = self._db.execute(
            "SELECT ready_at_ms, attempts FROM delays WHERE offset = ?", (offset,)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def __contains__(self, offset: int) -> bool:
        return self.get(offset) is not None

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._mem) + 1024:
            self._heap = [(r, o) for o, (r, _a) in self._mem.items()]
            heapq.heapify(self._heap)

    # -- time ----------------------------------------------------------------------------------
    def next_ready_ms(self) -> int | None:
        """Earliest ready time of any entry (None when empty)."""
        heap, mem = self._heap, self._mem
        while heap:
            r, o = heap[0]
            got = mem.get(o)
            if got is not None and got[0] == r:
                break
            heapq.heappop(heap)
        best = heap[0][0] if heap else None
        p = self._pending_min
        if p is not None and (best is None or p < best):
            best = p
        if self._disk_n:
            if self._disk_min_stale:
                self._refresh_disk_min()
            d = self._disk_min
            if d is not None and (best is None or d < best):
                best = d
        return best

    def pop_due(self, now_ms: int, limit: int = 10_000) -> list[tuple[int, int]]:
        """Remove and return up to ``limit`` entries with ready_at <= now as (offset, attempts)."""
        out: list[tuple[int, int]] = []
        if self._pending_min is not None and self._pending_min <= now_ms:
            self.flush()
        heap, mem = self._heap, self._mem
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            r, o = heapq.heappop(heap)
            got = mem.get(o)
            if got is not None and got[0] == r:
                del mem[o]
                out.append((o, got[1]))
        if self._disk_n and len(out) < limit:
            if self._disk_min_stale:
                self._refresh_disk_min()
            if self._disk_min is not None and self._disk_min <= now_ms:
                assert self._db is not None
                rows = self._db.execute(
                    "SELECT offset, attempts FROM delays WHERE ready_at_ms <= ? "
                    "ORDER BY ready_at_ms, offset LIMIT ?",
                    (now_ms, limit - len(out)),
                ).fetchall()
                if rows:
                    self._delete_rows([r[0] for r in rows])
                    out.extend((r[0], r[1]) for r in rows)
        return out

    def _delete_rows(self, offsets: list[int]) -> None:
        assert self._db is not None
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM delays WHERE offset = ?", [(o,) for o in offsets])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._disk_n = db.execute("SELECT COUNT(*) FROM delays").fetchone()[0]
        self._disk_min_stale = True

    # -- bulk ----------------------------------------------------------------------------------
    def memory_items(self) -> list[tuple[int, int, int]]:
        """(offset, ready_at_ms, attempts) of the memory tier, for the cursor state file."""
        return [(o, r, a) for o, (r, a) in self._mem.items()]

    def offsets(self, lo: int = 0, hi: int | None = None) -> list[int]:
        """Sorted stored offsets in [lo, hi)."""
        hi_ = (1 << 63) - 1 if hi is None else hi
        self.flush()
        out = [o for o in self._mem if lo <= o < hi_]
        if self._db is not None and self._disk_n:
            out.extend(
                r[0]
                for r in self._db.execute(
                    "SELECT offset FROM delays WHERE offset >= ? AND offset < ?", (lo, hi_)
                )
            )
        out.sort()
        return out

    def discard_range(self, lo: int, hi: int) -> int:
        """Drop every entry with lo <= offset < hi; returns how many."""
        self.flush()
        n = 0
        for o in [o for o in self._mem if lo <= o < hi]:
            del self._mem[o]
            n += 1
        if n:
            self._maybe_compact()
        if self._db is not None and self._disk_n:
            cur = self._db.execute("DELETE FROM delays WHERE offset >= ? AND offset < ?", (lo, hi))
            if cur.rowcount:
                n += cur.rowcount
                self._disk_n -= cur.rowcount
                self._disk_min_stale = True
        return n

    def clear(self) -> None:
        self._pending, self._pending_min = {}, None
        self._mem.clear()
        self._heap.clear()
        if self._db is not None and self._disk_n:
            self._db.execute("DELETE FROM delays")
        self._disk_n = 0
        self._disk_min = None
        self._disk_min_stale = False

    def close(self) -> None:
        self.flush()
        if self._db is not None:
            self._db.close()
            self._db = None
