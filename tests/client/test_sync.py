"""nsqx.client.publish: synchronous publishing over HTTP and TCP."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from nsqx.client import Consumer, Message, NSQError, publish
from tests.client.helpers import run, wait_for
from tests.support.nsqd_process import NsqdProcess


def consume(nsqd: NsqdProcess, topic: str, n: int) -> list[Message]:
    got: list[Message] = []

    async def main() -> None:
        async with Consumer(topic, "ch", got.append, nsqd_tcp_addresses=nsqd.tcp_address,
                            max_in_flight=50):
            await wait_for(lambda: len(got) >= n, 10)
            await asyncio.sleep(0.2)

    run(main())
    return got


@pytest.mark.parametrize("http", [True, False], ids=["http", "tcp"])
def test_sync_publish(nsqd: NsqdProcess, http: bool) -> None:
    addr = nsqd.http_address if http else nsqd.tcp_address
    # the channel must exist before the DPUB: see the deferred-before-channel note below
    for path in ("topic/create?topic=sp", "channel/create?topic=sp&channel=ch"):
        urllib.request.urlopen(urllib.request.Request(
            f"http://{nsqd.http_address}/{path}", method="POST")).read()
    publish(addr, "sp", b"one", http=http)
    publish(addr, "sp", [b"two", b"three\nwith newline", b"\x00\xff"], http=http)
    t0 = time.monotonic()
    publish(addr, "sp", b"deferred", http=http, delay=0.5)
    got = consume(nsqd, "sp", 5)
    assert sorted(m.body for m in got) == sorted(
        [b"one", b"two", b"three\nwith newline", b"\x00\xff", b"deferred"])
    assert got[-1].body == b"deferred" and time.monotonic() - t0 >= 0.45


def test_sync_publish_errors(nsqd: NsqdProcess) -> None:
    with pytest.raises(NSQError) as ei:
        publish(nsqd.tcp_address, "bad!topic", b"x", http=False)
    assert ei.value.code == "E_BAD_TOPIC"
    with pytest.raises(NSQError) as ei:
        publish(nsqd.http_address, "bad!topic", b"x", http=True)
    assert ei.value.code == "INVALID_TOPIC"
    with pytest.raises(NSQError) as ei:
        publish("127.0.0.1:1", "t", b"x", http=False, timeout=1)
    assert ei.value.code == "E_CONNECTION_CLOSED"
    with pytest.raises(ValueError):
        publish(nsqd.tcp_address, "t", [], http=False)


def test_deferred_message_published_before_channel_keeps_its_delay(nsqd: NsqdProcess) -> None:
    t0 = time.monotonic()
    publish(nsqd.tcp_address, "dnc", b"later", http=False, delay=1.5)
    got = consume(nsqd, "dnc", 1)
    # upstream: the topic pump hands it to the new channel with PutMessageDeferred
    assert time.monotonic() - t0 >= 1.4 and got[0].body == b"later"


def test_publish_without_http_takes_either_port(nsqd: NsqdProcess) -> None:
    """Issue 30 item 8: ``publish(addr, topic, body)`` as README's tour suggests it."""
    publish(nsqd.tcp_address, "either", b"over tcp")
    publish(nsqd.http_address, "either", b"over http")  # the port answered HTTP: retried so
    publish(f"http://{nsqd.http_address}", "either", [b"a", b"b"])
    assert sorted(m.body for m in consume(nsqd, "either", 4)) == [b"a", b"b", b"over http",
                                                                  b"over tcp"]
    with pytest.raises(NSQError, match="HTTP server"):  # http=False said it is TCP
        publish(nsqd.http_address, "either", b"x", http=False)


@pytest.mark.parametrize("http", [True, False], ids=["http", "tcp"])
def test_ordered_topic_without_partition_says_what_is_needed(nsqd: NsqdProcess,
                                                             http: bool) -> None:
    urllib.request.urlopen(urllib.request.Request(
        f"http://{nsqd.http_address}/topic/create?topic=ord&partition_num=2&orderedmulti=true",
        method="POST")).read()
    addr = nsqd.http_address if http else nsqd.tcp_address
    with pytest.raises(NSQError) as err:
        publish(addr, "ord", b"x", http=http)
    assert err.value.code == "E_BAD_PARTITION"
    assert "ordered: name a partition (0..1" in err.value.text
    assert "key" in err.value.text
