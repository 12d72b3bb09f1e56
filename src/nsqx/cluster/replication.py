"""Replication rules of one partition, without I/O: acks, ISR membership, divergence.

The leader acknowledges a commit once every ISR member has fetched past it (a follower's
fetch offset is its log end, so a fetch *is* its ack, as in Kafka); a follower that has
not fetched for ``lag_timeout`` while behind is reported for removal from the ISR instead
of blocking writes, and one that reaches the leader's end may rejoin.

A returning replica finds where its log diverged from the leader's by leader epochs: each
log is a list of (epoch, first offset) spans; the follower keeps its prefix up to the end of
its last epoch *as the leader knows it* and truncates the rest (Kafka's leader-epoch rule).
"""

from __future__ import annotations

import base64
import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Commit", "EpochSpans", "FetchHead", "FollowerProgress", "LeaderProgress",
           "Regressed", "epoch_at", "epoch_spans", "frame_runs", "spans_in",
           "truncation_point"]

# An epoch history: ascending (epoch, start offset) pairs; each epoch runs to the next start.
EpochSpans = Sequence[tuple[int, int]]


def _last_at_most(spans: EpochSpans, epoch: int) -> int:
    """Index of the newest span whose epoch is <= ``epoch`` (-1: none)."""
    return bisect_right([e for e, _ in spans], epoch) - 1


def _span_end(spans: EpochSpans, i: int, log_end: int) -> int:
    return spans[i + 1][1] if i + 1 < len(spans) else log_end


def truncation_point(follower: EpochSpans, follower_end: int,
                     leader: EpochSpans, leader_end: int) -> int:
    """The offset a follower truncates to before fetching from the leader (KIP-279's rule).

    The follower names its newest epoch E; the leader answers with its newest epoch L <= E
    and where L ends in its log; the follower keeps what it holds of epochs <= L up to that
    end, and asks again until the answer no longer moves (a replica that once led an epoch
    the leader never saw may need several rounds). Below the result both logs agree: each
    epoch's records were written by one leader and copied from it at the same offsets.
    """
    end = follower_end
    while True:
        cut = _one_round(follower, end, leader, leader_end)
        if cut >= end:
            return end
        end = cut


def _one_round(follower: EpochSpans, follower_end: int,
               leader: EpochSpans, leader_end: int) -> int:
    spans = [(e, s) for i, (e, s) in enumerate(follower)
             if s < follower_end and _span_end(follower, i, follower_end) > s]
    if not spans:
        return 0
    li = _last_at_most(leader, spans[-1][0])
    if li < 0:
        return 0
    fi = _last_at_most(spans, leader[li][0])
    if fi < 0:
        return 0
    return min(_span_end(leader, li, leader_end), _span_end(spans, fi, follower_end),
               follower_end)


class Regressed(ValueError):
    """A fetch below what the same follower session already acknowledged."""


@dataclass
class FollowerProgress:
    end: int = 0  # the follower's log end, as its last fetch said
    last_fetch: float = 0.0
    caught_up_at: float = 0.0  # last time it was at the leader's end
    session: object = None  # what identifies one run of the follower (its etcd lease)


@dataclass
class LeaderProgress:
    """What the leader knows of its followers; drives acks and ISR changes.

    One per leader epoch, starting empty: a follower's log end counts only from its first
    fetch in this epoch, after it truncated (its older end may hold a deposed leader's
    tail; the model test caught acks counted from such an end).
    """

    isr: set[str]
    lag_timeout: float = 10.0
    followers: dict[str, FollowerProgress] = field(default_factory=dict)
    hw: int = 0  # the highest acked_end reported: it never falls

    def on_fetch(self, follower: str, end: int, leader_end: int, now: float,
                 session: object = None) -> None:
        """Record a fetch (an ack up to ``end``). Within one ``session`` progress only moves
        forward: a lower fetch is :class:`Regressed` (a replayed or forged fetch must not
        un-acknowledge what a follower holds); a new session (the follower restarted,
        perhaps having lost an unsynced tail) starts from its fetch."""
        fp = self.followers.get(follower)
        if fp is None or fp.session != session:
            fp = self.followers[follower] = FollowerProgress(
                caught_up_at=fp.caught_up_at if fp else 0.0, session=session)
        elif end < fp.end:
            raise Regressed(f"fetch at {end} below {fp.end}, already acknowledged by "
                            f"{follower} in this session")
        fp.end = end
        fp.last_fetch = now
        if end >= leader_end:
            fp.caught_up_at = now

    def acked_end(self, leader_end: int, leader: str) -> int:
        """Everything below this offset is on every ISR member (the high watermark). It
        never falls (Kafka's rule): what was acknowledged stays acknowledged even if a
        follower comes back in a new session with less."""
        ends = [leader_end]
        for n in self.isr:
            if n == leader:
                continue
            fp = self.followers.get(n)
            ends.append(fp.end if fp else 0)
        self.hw = max(self.hw, min(ends))
        return self.hw

    def laggards(self, leader_end: int, now: float, leader: str) -> list[str]:
        """ISR followers to drop: behind the leader and silent or stuck for lag_timeout."""
        out = []
        for n in sorted(self.isr):
            if n == leader:
                continue
            fp = self.followers.get(n)
            if fp is None:
                fp = self.followers[n] = FollowerProgress(last_fetch=now, caught_up_at=now)
            behind = fp.end < leader_end
            if behind and now - max(fp.caught_up_at, 0.0) > self.lag_timeout:
                out.append(n)
        return out

    def ready_to_join(self, follower: str, leader_end: int) -> bool:
        fp = self.followers.get(follower)
        return follower not in self.isr and fp is not None and fp.end >= leader_end


# ------------------------------------------------------------- what a fetch answer carries
@dataclass(frozen=True, slots=True)
class Commit:
    """One leader commit of a fetch answer, appended by the replica as one batch. On the wire
    (and from ``commits_range``) a row: base, count, first ts, max ts, epoch, frame length
    (0: mixed sizes), frame lengths (only for mixed sizes)."""

    base: int
    count: int
    ts: int
    max_ts: int
    epoch: int
    flen: int
    lengths: list[int] | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Commit:
        base, count, ts, max_ts, epoch, flen, lengths = row
        return cls(base, count, ts, max_ts, epoch, flen, lengths)

    def row(self) -> tuple[int, int, int, int, int, int, list[int] | None]:
        return (self.base, self.count, self.ts, self.max_ts, self.epoch, self.flen,
                self.lengths)

    @property
    def size(self) -> int:
        """Bytes of the commit's frames."""
        return self.count * self.flen if self.flen else sum(self.lengths or ())


@dataclass(slots=True)
class FetchHead:
    """The JSON line before a fetch answer's frames, one definition for leader and follower
    (HTTP and the stream). ``start``/``count``/``end``: the frames' range and the leader's
    log end; ``hw``: its acked end; with frames, ``spans`` (epochs in the range), ``commits``
    (absent: the follower walks the frames) and ``headers`` (by offset); at most once a
    second ``channels`` (confirmed cursors) and ``settings``."""

    start: int
    count: int
    end: int
    hw: int | None = None
    spans: list[tuple[int, int]] | None = None
    commits: list[Commit] | None = None
    headers: dict[int, dict[str, bytes]] | None = None
    channels: dict[str, int] | None = None
    settings: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object, keys in the order the leader always wrote them."""
        out: dict[str, Any] = {"start": self.start, "count": self.count, "end": self.end}
        if self.hw is not None:
            out["hw"] = self.hw
        if self.spans is not None:
            out["spans"] = self.spans
        if self.commits is not None:
            out["commits"] = [c.row() for c in self.commits]
        if self.headers:
            out["headers"] = {str(off): {k: base64.b64encode(v).decode() for k, v in h.items()}
                              for off, h in self.headers.items()}
        if self.channels is not None:
            out["channels"] = self.channels
        if self.settings is not None:
            out["settings"] = self.settings
        return out

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> FetchHead:
        """Parse a leader's head (KeyError/ValueError/TypeError when malformed)."""
        hw = obj.get("hw")
        commits = obj.get("commits")
        settings = obj.get("settings")
        return cls(
            start=int(obj["start"]), count=int(obj.get("count", 0)), end=int(obj.get("end", 0)),
            hw=int(hw) if hw is not None else None,
            spans=[(int(e), int(s)) for e, s in obj.get("spans", ())],
            commits=[Commit.from_row(r) for r in commits] if commits else None,
            headers={int(k): {hk: base64.b64decode(hv) for hk, hv in v.items()}
                     for k, v in (obj.get("headers") or {}).items()},
            channels={k: int(v) for k, v in (obj.get("channels") or {}).items()},
            settings=settings if isinstance(settings, dict) else None)


# ------------------------------------------------------ epochs and frames of a log's range
_FRAME_HEAD = struct.Struct(">IIQH")  # size, type, timestamp, attempts


def epoch_spans(plog: Any) -> list[tuple[int, int]]:
    """(epoch, first offset) of each run of commits with one epoch, from the log's metadata."""
    spans: list[tuple[int, int]] = []
    for b in plog.batches(plog.start_offset):
        if b.count and (not spans or spans[-1][0] != b.epoch):
            spans.append((b.epoch, b.base_offset))
    return spans


def frame_runs(data: bytes, offset: int, spans: Sequence[tuple[int, ...]]
               ) -> list[tuple[int, int, int, int, int, list[int]]]:
    """Cut stored frames into runs that share a timestamp and an epoch (one leader batch
    each): (first offset, count, byte start, byte end, timestamp, frame lengths)."""
    runs: list[tuple[int, int, int, int, int, list[int]]] = []
    starts = {s[1] for s in spans}
    pos, n, off = 0, len(data), offset
    unpack = _FRAME_HEAD.unpack_from
    cur_ts = -1
    lens: list[int] = []
    first = lo = 0
    while pos < n:
        if n - pos < 34:
            raise ValueError("truncated frame")
        size, ftype, ts, _ = unpack(data, pos)
        if ftype != 2 or size < 30 or pos + 4 + size > n:
            raise ValueError(f"malformed frame at byte {pos}")
        if ts != cur_ts or off in starts:
            if lens:
                runs.append((first, len(lens), lo, pos, cur_ts, lens))
            first, lo, cur_ts, lens = off, pos, ts, []
        lens.append(size + 4)
        pos += 4 + size
        off += 1
    if lens:
        runs.append((first, len(lens), lo, pos, cur_ts, lens))
    return runs


def spans_in(spans: EpochSpans, lo: int, hi: int) -> list[tuple[int, int]]:
    """The spans that cover [lo, hi), the first starting at ``lo``."""
    out = []
    for i, (ep, start) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else hi
        if end > lo and start < hi:
            out.append((ep, max(start, lo)))
    return out


def epoch_at(spans: Sequence[tuple[int, ...]], off: int, limit: int) -> tuple[int, int]:
    """The epoch of ``off`` and where it stops applying (the next span start or ``limit``)."""
    ep = spans[0][0] if spans else 0
    stop = limit
    for i, (e, start) in enumerate(spans):
        if start <= off:
            ep = e
            stop = spans[i + 1][1] if i + 1 < len(spans) else limit
    return ep, min(stop, limit)
