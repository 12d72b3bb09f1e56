"""Unit tests of the delivery-path screen (max attempts, TTL) over a real cursor and log."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from nsqx.nsqd.channel import Channel
from nsqx.nsqd.dead_letters import screen
from nsqx.storage.cursor import REQ, TIMEOUT, ChannelCursor, Delivery
from nsqx.storage.memlog import MemoryLog
from nsqx.storage.message_id import make_id

T = 60_000
SEC = 1_000_000_000


class FakeDLQ:
    """The dead-letter topic: records each publish, completes it as told."""

    def __init__(self, fail: bool = False) -> None:
        self.published: list[tuple[list[bytes], list[dict[str, bytes] | None]]] = []
        self.fail = fail

    def publish(self, bodies: list[bytes], defer_ms: int, done: Any, *,
                headers: list[dict[str, bytes] | None]) -> None:
        self.published.append((bodies, headers))
        done(0, OSError("disk full") if self.fail else None)


def setup(bodies: list[bytes], *, ts_ns: int | None = None, max_attempts: int = 0,
          ttl_ns: int = 0, dlq: FakeDLQ | None = None,
          headers: list[dict[str, bytes] | None] | None = None) -> Any:
    log = MemoryLog()
    log.append(bodies, ts_ns, headers=headers)
    log.flush()
    dlq = dlq or FakeDLQ()
    nsqd = SimpleNamespace(get_topic=lambda name: dlq if name == "jobs.dlq" else None)
    topic = SimpleNamespace(name="jobs", partition=0, log=log, msg_ttl_ns=ttl_ns, nsqd=nsqd,
                            tracer=None)
    ch = SimpleNamespace(topic=topic, name="work", cursor=ChannelCursor(0),
                         max_attempts=max_attempts, dlq_count=0, expired_count=0, dirty=False,
                         wakes=0)
    ch.wake = lambda: setattr(ch, "wakes", ch.wakes + 1)
    ch.finish_held = lambda holder, offsets: Channel.finish_held(ch, holder, offsets)  # the real one
    return ch, dlq, SimpleNamespace(id=1)


def test_over_max_attempts_is_dead_lettered_with_headers_and_finished() -> None:
    ch, dlq, client = setup([b"a", b"b", b"c"], max_attempts=2,
                            headers=[{"trace": b"t-1"}, None, None])
    cur = ch.cursor
    assert screen(ch, client, cur.take(1, 3, 3, 0, 1_000)) == [Delivery(0, 3, 1)]
    cur.requeue(1, 0, 0, 1)  # a: REQ
    cur.expire(1_000)  # b, c: time out
    assert [d.attempts for d in screen(ch, client, cur.take(1, 3, 3, 1_000, 1_000))] == [2] * 3
    cur.requeue(1, 0, 0, 1_001)
    cur.finish(1, 2)  # c done
    cur.expire(2_000)  # b times out again
    got = cur.take(1, 3, 3, 2_000, T)
    assert sorted((d.offset, d.attempts, d.why) for d in got) == [(0, 3, REQ), (1, 3, TIMEOUT)]
    assert screen(ch, client, got) == []  # neither is delivered a third time
    [(bodies, headers)] = dlq.published  # one publish for the batch
    assert sorted(bodies) == [b"a", b"b"]
    by_body = dict(zip(bodies, headers, strict=True))
    assert by_body[b"a"] == {"trace": b"t-1", "dlq_topic": b"jobs", "dlq_channel": b"work",
                             "dlq_partition": b"0", "dlq_id": make_id(0, 0),
                             "dlq_attempts": b"2", "dlq_reason": b"req"}
    assert by_body[b"b"]["dlq_reason"] == b"timeout" and "trace" not in by_body[b"b"]
    assert ch.dlq_count == 2 and ch.wakes == 1
    assert cur.in_flight_count == 0 and cur.confirmed == 3  # finished on the source channel


def test_failed_dead_letter_publish_leaves_the_message_in_flight() -> None:
    ch, dlq, client = setup([b"a"], max_attempts=1, dlq=FakeDLQ(fail=True))
    cur = ch.cursor
    screen(ch, client, cur.take(1, 1, 1, 0, 1_000))
    cur.expire(1_000)
    assert screen(ch, client, cur.take(1, 1, 1, 1_000, 1_000)) == []
    assert len(dlq.published) == 1 and ch.dlq_count == 0
    assert cur.in_flight_count == 1  # times out and is tried again: nothing lost
    assert cur.expire(2_000) == 1


def test_no_dead_letter_topic_possible_keeps_messages_in_flight() -> None:
    ch, dlq, client = setup([b"a"], max_attempts=1)
    ch.topic.name = "x" * 61  # "<61 x>.dlq" is not a valid topic name
    cur = ch.cursor
    screen(ch, client, cur.take(1, 1, 1, 0, 1_000))
    cur.requeue(1, 0, 0, 1)
    assert screen(ch, client, cur.take(1, 1, 1, 1, 1_000)) == []
    assert not dlq.published and cur.in_flight_count == 1 and ch.dlq_count == 0


def test_ttl_splits_a_fresh_run_at_the_first_young_message() -> None:
    now = time.time_ns()
    ch, _dlq, client = setup([b"old"] * 5, ts_ns=now - 10 * SEC, ttl_ns=5 * SEC)
    log = ch.topic.log
    log.append([b"young"] * 3, now)
    log.flush()
    cur = ch.cursor
    assert screen(ch, client, cur.take(1, 100, 8, 0, T)) == [Delivery(5, 3, 1)]
    assert ch.expired_count == 5 and cur.confirmed == 5 and cur.in_flight_count == 3


def test_ttl_young_run_and_expired_redelivery() -> None:
    now = time.time_ns()
    ch, _dlq, client = setup([b"m"] * 4, ts_ns=now, ttl_ns=3600 * SEC)
    cur = ch.cursor
    assert screen(ch, client, cur.take(1, 4, 4, 0, 1_000)) == [Delivery(0, 4, 1)]
    assert ch.expired_count == 0
    cur.expire(1_000)
    ch.topic.msg_ttl_ns = 1  # now all of them are too old: the redeliveries are skipped
    assert screen(ch, client, cur.take(1, 4, 4, 1_000, 1_000)) == []
    assert ch.expired_count == 4 and cur.confirmed == 4 and cur.in_flight_count == 0
