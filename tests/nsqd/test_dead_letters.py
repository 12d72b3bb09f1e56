"""Server-side max attempts (dead-letter topic) and per-topic TTL, on a real nsqd."""

from __future__ import annotations

import time

import pytest

from nsqx.nsqd.dead_letters import dlq_topic_name
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient, consumer, publish


def channel_stats(nsqd: NsqdProcess, topic: str, channel: str) -> dict:
    st = http_api.stats(nsqd.http_address, topic)
    t = next(t for t in st["topics"] if t["topic_name"] == topic)
    return next(c for c in t["channels"] if c["channel_name"] == channel)


def wait_for(pred, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_dlq_topic_name() -> None:
    assert dlq_topic_name("orders") == "orders.dlq"
    assert dlq_topic_name("tmp#ephemeral") == "tmp.dlq"
    assert dlq_topic_name("x" * 61) is None  # 65 characters: not a valid topic name


def test_message_over_max_attempts_goes_to_the_dead_letter_topic(nsqd: NsqdProcess) -> None:
    publish(nsqd.tcp_address, "jobs", [b"poison", b"fine"])
    c = consumer(nsqd.tcp_address, "jobs", "work", rdy=10)
    r = http_api.post(nsqd.http_address, "/channel/config", topic="jobs", channel="work",
                      max_attempts="2")
    assert r.status == 200 and r.json() == {"topic": "jobs", "channel": "work", "max_attempts": 2}
    with c:
        seen = []
        for _ in range(3):  # poison twice (REQ each time), fine once (FIN)
            m = c.read_message()
            seen.append((m.body, m.attempts))
            c.send(v2.req(m.id, 0) if m.body == b"poison" else v2.fin(m.id))
        assert sorted(seen) == [(b"fine", 1), (b"poison", 1), (b"poison", 2)]
        c.expect_nothing(1.0)  # no third delivery: it was dead-lettered
    ch = wait_for(lambda: (s := channel_stats(nsqd, "jobs", "work"))["dlq_count"] == 1 and s)
    assert ch["max_attempts"] == 2 and ch["in_flight_count"] == 0 and ch["depth"] == 0
    r = http_api.get(nsqd.http_address, "/message/get", topic="jobs.dlq", search_mode="count",
                     search_pos="0")
    assert r.status == 200, r.body
    msg = r.json()
    assert msg["body"] == "poison"
    h = msg["headers"]
    assert (h["dlq_topic"], h["dlq_channel"], h["dlq_attempts"], h["dlq_reason"]) == (
        "jobs", "work", "2", "req")
    assert len(h["dlq_id"]) == 16
    text = http_api.get(nsqd.http_address, "/metrics").body.decode()
    assert 'nsqx_channel_dead_lettered_total{topic="jobs",channel="work"} 1' in text
    # the setting and the dead letter survive a restart
    nsqd.restart()
    assert channel_stats(nsqd, "jobs", "work")["max_attempts"] == 2
    r = http_api.get(nsqd.http_address, "/message/get", topic="jobs.dlq", search_mode="count",
                     search_pos="0")
    assert r.status == 200 and r.json()["body"] == "poison"


def test_max_attempts_flag_and_timeouts(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory.start(["--max-attempts=1", "--msg-timeout=1s"])
    publish(nsqd.tcp_address, "t", [b"slow"])
    with consumer(nsqd.tcp_address, "t", "c", rdy=1) as c:
        assert c.read_message().attempts == 1  # not finished: times out after 1 s
        c.expect_nothing(2.5)
    wait_for(lambda: channel_stats(nsqd, "t", "c")["dlq_count"] == 1)
    assert channel_stats(nsqd, "t", "c")["timeout_count"] == 1
    with consumer(nsqd.tcp_address, "t.dlq", "inspect", rdy=1) as c:
        assert c.read_message().body == b"slow"
    r = http_api.get(nsqd.http_address, "/message/get", topic="t.dlq", search_mode="count",
                     search_pos="0")
    h = r.json()["headers"]
    assert (h["dlq_attempts"], h["dlq_reason"]) == ("1", "timeout")


def test_ephemeral_channel_setting_applies_while_it_lives(nsqd: NsqdProcess) -> None:
    """Accepted (the channel exists), never persisted: it goes when its last client does."""
    publish(nsqd.tcp_address, "eph", [b"once"])
    with consumer(nsqd.tcp_address, "eph", "tmp#ephemeral", rdy=0) as c:
        r = http_api.post(nsqd.http_address, "/channel/config", topic="eph",
                          channel="tmp#ephemeral", max_attempts="1")
        assert r.status == 200, r.body
        c.send(v2.rdy(5))
        m = c.read_message()
        c.send(v2.req(m.id, 0))
        c.expect_nothing(0.5)
        wait_for(lambda: channel_stats(nsqd, "eph", "tmp#ephemeral")["dlq_count"] == 1)
    wait_for(lambda: "tmp#ephemeral" not in {
        c["channel_name"] for c in http_api.stats(nsqd.http_address, "eph")["topics"][0][
            "channels"]})
    r = http_api.post(nsqd.http_address, "/channel/config", topic="eph",
                      channel="tmp#ephemeral", max_attempts="1")
    assert (r.status, r.json()["message"]) == (404, "CHANNEL_NOT_FOUND")
    h = http_api.get(nsqd.http_address, "/message/get", topic="eph.dlq", search_mode="count",
                     search_pos="0").json()["headers"]
    assert (h["dlq_channel"], h["dlq_reason"]) == ("tmp#ephemeral", "req")


def test_ttl_skips_old_messages(nsqd: NsqdProcess) -> None:
    publish(nsqd.tcp_address, "news", [b"old-1", b"old-2", b"old-3"])
    with consumer(nsqd.tcp_address, "news", "reader", rdy=0):
        pass  # the channel exists: the messages wait in it
    r = http_api.post(nsqd.http_address, "/topic/config", topic="news", ttl="300ms")
    assert r.status == 200 and r.json() == {"topic": "news", "ttl_ms": 300, "sync_every": 2500}
    time.sleep(0.6)
    publish(nsqd.tcp_address, "news", [b"fresh"])
    with consumer(nsqd.tcp_address, "news", "reader", rdy=10) as c:
        m = c.read_message()
        assert m.body == b"fresh"
        c.send(v2.fin(m.id))
        c.expect_nothing(0.5)
    ch = channel_stats(nsqd, "news", "reader")
    assert ch["expired_count"] == 3 and ch["depth"] == 0 and ch["in_flight_count"] == 0
    text = http_api.get(nsqd.http_address, "/metrics").body.decode()
    assert 'nsqx_channel_expired_total{topic="news",channel="reader"} 3' in text
    st = http_api.stats(nsqd.http_address, "news")
    assert st["topics"][0]["msg_ttl_ms"] == 300
    nsqd.restart()
    assert http_api.stats(nsqd.http_address, "news")["topics"][0]["msg_ttl_ms"] == 300
    r = http_api.post(nsqd.http_address, "/topic/config", topic="news", ttl="default")
    assert r.json()["ttl_ms"] == 0


def test_topic_fsync_policy_is_set_shown_and_kept(nsqd: NsqdProcess) -> None:
    publish(nsqd.tcp_address, "ledger", [b"a"])
    r = http_api.post(nsqd.http_address, "/topic/config", topic="ledger", sync_every="1")
    assert r.status == 200 and r.json()["sync_every"] == 1 and r.json()["ttl_ms"] == 0
    publish(nsqd.tcp_address, "ledger", [b"b", b"c"])  # acked once fsynced
    assert http_api.stats(nsqd.http_address, "ledger")["topics"][0]["sync_every"] == 1
    nsqd.restart()
    assert http_api.stats(nsqd.http_address, "ledger")["topics"][0]["sync_every"] == 1
    publish(nsqd.tcp_address, "ledger", [b"d"])
    r = http_api.post(nsqd.http_address, "/topic/config", topic="ledger", sync_every="default")
    assert r.json()["sync_every"] == 2500


@pytest.mark.parametrize(("path", "params", "status", "code"), [
    ("/topic/config", {"ttl": "1s"}, 400, "MISSING_ARG_TOPIC"),
    ("/topic/config", {"topic": "known"}, 400, "MISSING_ARG_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "-1s"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "soon"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "100000h"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "unknown", "ttl": "1s"}, 404, "TOPIC_NOT_FOUND"),
    ("/channel/config", {"topic": "known", "max_attempts": "3"}, 400, "MISSING_ARG_CHANNEL"),
    ("/channel/config", {"topic": "known", "channel": "c"}, 400, "MISSING_ARG_MAX_ATTEMPTS"),
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "-1"}, 400,
     "INVALID_MAX_ATTEMPTS"),
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "many"}, 400,
     "INVALID_MAX_ATTEMPTS"),
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "70000"}, 400,
     "INVALID_MAX_ATTEMPTS"),
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "\u00b2"}, 400,
     "INVALID_MAX_ATTEMPTS"),  # a digit to str.isdigit(), not to int()
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "9" * 5000}, 400,
     "INVALID_MAX_ATTEMPTS"),  # past int()'s digit limit
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": ""}, 400,
     "INVALID_MAX_ATTEMPTS"),
    ("/channel/config", {"topic": "known", "channel": "c", "max_attempts": "2.5"}, 400,
     "INVALID_MAX_ATTEMPTS"),
    ("/topic/config", {"topic": "known", "ttl": "\u00b2"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "9" * 5000}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": ""}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "1.5"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "ttl": "-5"}, 400, "INVALID_TTL"),
    ("/topic/config", {"topic": "known", "sync_every": "-1"}, 400, "INVALID_SYNC_EVERY"),
    ("/topic/config", {"topic": "known", "sync_every": "often"}, 400, "INVALID_SYNC_EVERY"),
    ("/topic/config", {"topic": "known", "sync_every": "9" * 5000}, 400, "INVALID_SYNC_EVERY"),
    ("/topic/config", {"topic": "known", "sync_every": "\u00b2"}, 400, "INVALID_SYNC_EVERY"),
    ("/topic/config", {"topic": "known", "ttl": "1s", "sync_every": "x"}, 400,
     "INVALID_SYNC_EVERY"),
    ("/topic/config", {"topic": "known#ephemeral", "ttl": "1s"}, 404, "TOPIC_NOT_FOUND"),
    ("/channel/config", {"topic": "known", "channel": "c#ephemeral", "max_attempts": "3"}, 404,
     "CHANNEL_NOT_FOUND"),
    ("/channel/config", {"topic": "known", "channel": "nope", "max_attempts": "3"}, 404,
     "CHANNEL_NOT_FOUND"),
    ("/channel/config", {"topic": "bad topic", "channel": "c", "max_attempts": "3"}, 400,
     "INVALID_ARG_TOPIC"),
])
def test_bad_settings_are_refused(nsqd: NsqdProcess, path: str, params: dict, status: int,
                                  code: str) -> None:
    with consumer(nsqd.tcp_address, "known", "c", rdy=0):
        pass
    r = http_api.post(nsqd.http_address, path, **params)
    assert (r.status, r.json()["message"]) == (status, code)
    assert "unknown" not in {t["topic_name"] for t in http_api.stats(nsqd.http_address)["topics"]}


def test_negative_flags_refused(nsqd_factory: NsqdFactory) -> None:
    for flag in ("--max-attempts=-1", "--msg-ttl=-5s"):
        proc = nsqd_factory.create([flag])
        with pytest.raises(Exception, match="must not be negative"):
            proc.start(timeout=10)


def test_ordered_partition_moves_past_a_dead_lettered_message(nsqd: NsqdProcess) -> None:
    """Without max attempts a poison message blocks an ordered partition; with it, the next
    message goes once the poison one is in <topic>.dlq (with its partition in the headers)."""
    r = http_api.post(nsqd.http_address, "/topic/create", topic="ord", partition_num="2",
                      orderedmulti="true")
    assert r.status == 200, r.body
    with RawClient(nsqd.tcp_address) as c:
        for body in (b"poison", b"next"):
            c.send(v2.pub("ord", body, partition=1))
            c.expect_ok()
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_ordered("ord", "c", 1))
        c.expect_ok()
        r = http_api.post(nsqd.http_address, "/channel/config", topic="ord", channel="c",
                          max_attempts="2")
        assert r.status == 200, r.body
        c.send(v2.rdy(10))
        for attempt in (1, 2):
            m = c.read_message()
            assert (m.body, m.attempts) == (b"poison", attempt)
            c.send(v2.req(m.id, 0))
        m = c.read_message()
        assert (m.body, m.attempts) == (b"next", 1)
        c.send(v2.fin(m.id))
        c.expect_nothing(0.3)
    h = http_api.get(nsqd.http_address, "/message/get", topic="ord.dlq", search_mode="count",
                     search_pos="0").json()["headers"]
    assert (h["dlq_topic"], h["dlq_partition"], h["dlq_attempts"], h["dlq_reason"]) == (
        "ord", "1", "2", "req")
    nsqd.restart()  # the setting is kept for the channel of every partition
    t = next(t for t in http_api.stats(nsqd.http_address, "ord")["topics"]
             if t["topic_name"] == "ord")
    assert [c["max_attempts"] for c in t["channels"]] == [2]
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub("ord", b"poison-2", partition=1))
        c.expect_ok()
        c.send(v2.sub_ordered("ord", "c", 1))
        c.expect_ok()
        c.send(v2.rdy(1))
        for _ in (1, 2):
            c.send(v2.req(c.read_message().id, 0))
        c.expect_nothing(0.5)
    assert wait_for(lambda: channel_stats(nsqd, "ord", "c")["dlq_count"] == 1)
