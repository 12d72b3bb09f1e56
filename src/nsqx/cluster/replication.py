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

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["EpochSpans", "FollowerProgress", "LeaderProgress", "Regressed", "truncation_point"]

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
