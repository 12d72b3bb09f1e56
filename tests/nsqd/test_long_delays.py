"""Delays beyond upstream's --max-req-timeout with --max-delay: accepted, kept on disk across
kill -9, and delivered when due; without the flag upstream's limit and error stand."""

from __future__ import annotations

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory
from tests.support.rawclient import RawClient, consumer

TWO_DAYS_MS = 2 * 24 * 3600 * 1000


def deferred(nsqd, topic: str, channel: str) -> int:  # type: ignore[no-untyped-def]
    t = http_api.stats(nsqd.http_address, topic)["topics"][0]
    return next(c for c in t["channels"] if c["channel_name"] == channel)["deferred_count"]


def test_without_max_delay_upstream_limit_stands(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory.start()
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.dpub("t", TWO_DAYS_MS, b"later"))
        c.expect_error("E_INVALID", f"DPUB timeout {TWO_DAYS_MS} out of range 0-3600000",
                       closed=True)
    r = http_api.pub(nsqd.http_address, "t", b"x", defer_ms=TWO_DAYS_MS)
    assert r.status == 400


def test_days_long_delays_survive_kill_and_come_when_due(nsqd_factory: NsqdFactory) -> None:
    nsqd = nsqd_factory.start(["--max-delay=72h"])
    with consumer(nsqd.tcp_address, "t", "c", rdy=0):
        pass  # the channel exists
    with RawClient(nsqd.tcp_address) as p:
        p.dpub("t", TWO_DAYS_MS, b"in-two-days")
        p.dpub("t", 1500, b"soon")
    assert http_api.pub(nsqd.http_address, "t", b"via-http", defer_ms=TWO_DAYS_MS).status == 200
    with consumer(nsqd.tcp_address, "t", "c", rdy=5) as c:
        m = c.read_message(timeout=15)
        assert m.body == b"soon"
        c.send(v2.req(m.id, TWO_DAYS_MS))  # REQ for days is accepted too
        c.expect_nothing(1.0)
    assert deferred(nsqd, "t", "c") == 3
    nsqd.kill()
    nsqd.start()
    assert deferred(nsqd, "t", "c") == 3  # in the on-disk delay store
    with consumer(nsqd.tcp_address, "t", "c", rdy=5) as c:
        c.expect_nothing(1.0)  # none is due for two days
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.dpub("t", 73 * 3600 * 1000, b"too-late"))
        c.expect_error("E_INVALID", "DPUB timeout 262800000 out of range 0-259200000",
                       closed=True)
