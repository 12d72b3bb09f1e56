"""Idempotent producers (nsqx.client): a lost answer or a crashed nsqd never duplicates or
loses a publish; headers, tags and traced publishes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsqx.client import NSQError, Producer
from tests.client.helpers import run, start_fixed
from tests.support import http_api
from tests.support.faultproxy import FaultProxy
from tests.support.log_checker import lost_and_duplicated, stored
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import consumer


def _publish_through_cuts(nsqd: NsqdProcess, topic: str, *, idempotent: bool) -> list[bytes]:
    """10 PUBs and 2 MPUBs, three of them with their answer cut off by the proxy."""
    proxy = FaultProxy(int(nsqd.tcp_address.rsplit(":", 1)[1])).start()
    sent: list[bytes] = []

    async def main() -> None:
        async with Producer(proxy.address, idempotent=idempotent, retries=2,
                            wait_timeout=15, publish_timeout=60) as p:
            for i in range(10):
                if i in (3, 7):
                    proxy.cut_after(0)  # PUB written, nsqd stores it, its OK is lost
                body = b"pub-%d" % i
                await p.publish(topic, body)
                sent.append(body)
            proxy.cut_after(0)
            batch = [b"mpub-0", b"mpub-1", b"mpub-2"]
            await p.mpublish(topic, batch)
            sent.extend(batch)
            if idempotent:
                assert p.idempotent_retries >= 3
    try:
        run(main(), timeout=120)
    finally:
        proxy.stop()
    assert proxy.cuts == 3
    return sent


def test_answer_cut_after_the_pub_is_stored_once(nsqd: NsqdProcess) -> None:
    sent = _publish_through_cuts(nsqd, "cut", idempotent=True)
    got = [b for b, _ in stored(nsqd.http_address, "cut")]
    assert lost_and_duplicated(sent, got) == ([], [])
    assert len(got) == len(sent)


def test_the_checker_sees_what_a_plain_retry_duplicates(nsqd: NsqdProcess) -> None:
    """The same cuts without idempotence: each cut publish is stored twice (at-least-once),
    which is what the test above would see without the producer's sequences."""
    sent = _publish_through_cuts(nsqd, "plain", idempotent=False)
    got = [b for b, _ in stored(nsqd.http_address, "plain")]
    lost, dup = lost_and_duplicated(sent, got)
    assert lost == [] and set(dup) == {b"pub-3", b"pub-7", b"mpub-0", b"mpub-1", b"mpub-2"}


@pytest.mark.slow
def test_kill9_of_nsqd_while_idempotent_producers_publish(nsqd_factory: NsqdFactory) -> None:
    node = start_fixed(nsqd_factory)
    total, workers = 600, 6
    sent: list[bytes] = []

    async def worker(p: Producer, w: int) -> None:
        for i in range(total // workers):
            body = b"w%d-%d" % (w, i)
            await p.publish("crash", body)
            sent.append(body)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with Producer(node.tcp_address, publish_timeout=90, reconnect_interval=0.5) as p:
            tasks = [asyncio.create_task(worker(p, w)) for w in range(workers)]
            while len(sent) < total // 3:
                await asyncio.sleep(0.01)
            await loop.run_in_executor(None, lambda: node.restart(graceful=False))
            await asyncio.gather(*tasks)
            assert p.idempotent_retries > 0  # publishes were in flight at the kill
    run(main(), timeout=240)
    got = [b for b, _ in stored(node.http_address, "crash")]
    assert len(sent) == total
    assert lost_and_duplicated(sent, got) == ([], [])
    assert len(got) == total


def test_headers_tags_and_traced_publishes(nsqd: NsqdProcess) -> None:
    async def main() -> tuple[int, int, int, int]:
        async with Producer(nsqd.tcp_address) as p:
            await p.publish("ext", b"plain")
            await p.publish("ext", b"h", headers={"color": "blue", "raw": b"\x01"})
            await p.mpublish("ext", [b"t1", b"t2"], tag="red")
            traced = await p.publish("ext", b"tr", trace_id=42)
            assert traced is not None
            with pytest.raises(ValueError, match="tag"):
                await p.publish("ext", b"x", tag="bad tag!")
        async with Producer(nsqd.tcp_address, idempotent=False) as p:
            await p.publish("ext", b"not-idempotent", headers={"a": "b"})
            await p.publish("ext", b"not-idempotent-plain")
        return traced

    msg_id, trace_id, offset, _raw = run(main())
    assert (trace_id, offset, msg_id) == (42, 4, 4)
    got = stored(nsqd.http_address, "ext")
    bodies = [b for b, _ in got]
    assert bodies == [b"plain", b"h", b"t1", b"t2", b"tr", b"not-idempotent",
                      b"not-idempotent-plain"]
    h = [dict(x) for _, x in got]
    marks = [x.pop("##nsqx_producer", None) for x in h]
    assert marks[0] is not None and marks[2] is not None and marks[3] is None  # batch: first
    assert marks[5] is None and marks[6] is None
    assert h[1] == {"color": b"blue", "raw": b"\x01"}
    assert h[2] == h[3] == {"##client_dispatch_tag": b"red"}
    assert h[4] == {"##trace_id": b"42"}
    assert h[5] == {"a": b"b"} and h[6] == {} and h[0] == {}


def test_a_lasting_gap_starts_a_new_epoch(nsqd: NsqdProcess) -> None:
    """The leader does not know the sequence before this one (forgotten, or given up): the
    refused batch is sent again as sequence 0 of a new epoch, stored once."""
    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            await p.publish("gap", b"a")
            (stream,) = p._seqs._streams
            p._seqs._streams[stream][2] += 5  # as if 5 batches were lost without a trace
            await p.publish("gap", b"b")
            assert p._seqs._streams[stream][1:] == [1, 1]  # epoch 1, next sequence 1
            await p.publish("gap", b"c")
    run(main(), timeout=60)
    assert [b for b, _ in stored(nsqd.http_address, "gap")] == [b"a", b"b", b"c"]



def test_a_deferred_publish_whose_answer_was_cut_is_stored_once(nsqd: NsqdProcess) -> None:
    """dpublish of an idempotent producer rides the same path as publish (PUB_EXT with the
    producer's mark and ``##nsqx_defer``): a retry after a lost answer adds nothing, and
    the message is still deferred."""
    with consumer(nsqd.tcp_address, "later", "ch", rdy=0):
        pass  # the channel exists: it counts what is deferred
    proxy = FaultProxy(int(nsqd.tcp_address.rsplit(":", 1)[1])).start()

    async def main() -> None:
        async with Producer(proxy.address, wait_timeout=15, publish_timeout=60) as p:
            await p.dpublish("later", 3600, b"d-0")
            proxy.cut_after(0)  # written, stored, its OK lost: sent again
            await p.dpublish("later", 3600, b"d-1")
            await p.publish("later", b"now")
            assert p.idempotent_retries >= 1
    try:
        run(main(), timeout=120)
    finally:
        proxy.stop()
    assert proxy.cuts == 1
    got = [b for b, _ in stored(nsqd.http_address, "later")]
    assert got == [b"d-0", b"d-1", b"now"]
    t = http_api.stats(nsqd.http_address, "later")["topics"][0]
    ch = next(c for c in t["channels"] if c["channel_name"] == "ch")
    assert (ch["deferred_count"], ch["depth"]) == (2, 1), ch


def test_a_refused_batch_moves_its_stream_to_a_new_epoch(
        nsqd: NsqdProcess, caplog: pytest.LogCaptureFixture) -> None:
    """A refusal stores nothing: the stream's next batch starts a new epoch at once instead
    of meeting a sequence gap (and waiting for it) first."""
    caplog.set_level(logging.INFO, logger="nsqx.client")

    async def main() -> None:
        async with Producer(nsqd.tcp_address, wait_timeout=15) as p:
            await p.publish("refused", b"a")
            with pytest.raises(NSQError) as ei:
                await p.publish("refused", b"x" * (2 << 20))  # > --max-msg-size
            assert ei.value.code == "E_BAD_MESSAGE"
            await p.publish("refused", b"b")
    run(main(), timeout=60)
    gaps = [r.getMessage() for r in caplog.records if "OUT_OF_ORDER" in r.getMessage()]
    assert gaps == []  # b went as sequence 0 of a new epoch, not after the refused one
    assert [b for b, _ in stored(nsqd.http_address, "refused")] == [b"a", b"b"]
