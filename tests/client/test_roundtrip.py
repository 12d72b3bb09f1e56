"""Producer -> nsqd -> Consumer against real nsqd processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from nsqx.client import Consumer, Message, NSQError, Producer
from tests.client.helpers import run, wait_for
from tests.support.nsqd_process import NsqdProcess


def test_publish_consume_round_trip(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            await p.publish("rt", b"hello")
            await p.mpublish("rt", [b"a", b"bb", b"ccc"])
        got: list[Message] = []

        async def handler(msg: Message) -> None:
            got.append(msg)

        async with Consumer("rt", "ch", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                            max_in_flight=10) as c:
            await wait_for(lambda: len(got) == 4)
            await wait_for(lambda: c.finished == 4)
        assert [m.body for m in got] == [b"hello", b"a", b"bb", b"ccc"]
        m = got[0]
        assert m.attempts == 1
        assert len(m.id) == 16
        assert m.partition == 0 and m.offset is not None
        assert [x.offset for x in got] == sorted(x.offset for x in got)
        assert abs(m.timestamp / 1e9 - time.time()) < 60
        assert m.nsqd_address == nsqd.tcp_address

    run(main())


def test_dpub_delays_delivery(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        got: list[tuple[float, bytes]] = []

        def handler(msg: Message) -> None:  # a sync handler
            got.append((time.monotonic(), msg.body))

        async with Consumer("dp", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address), \
                Producer(nsqd.tcp_address) as p:
            t0 = time.monotonic()
            await p.dpublish("dp", 0.8, b"later")
            await p.publish("dp", b"now")
            await wait_for(lambda: len(got) == 2)
        assert [b for _, b in got] == [b"now", b"later"]
        assert got[1][0] - t0 >= 0.7

    run(main())


def test_publish_error_carries_code(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            with pytest.raises(NSQError) as ei:
                await p.publish("bad topic!", b"x")  # refused before sending
            assert ei.value.code == "E_BAD_TOPIC"
            with pytest.raises(NSQError) as ei:
                await p.publish("ok", b"x" * (2 << 20))  # > --max-msg-size
            assert ei.value.code == "E_BAD_MESSAGE"
            # the producer reconnects after the fatal error and keeps working
            await p.publish("ok", b"x")
            with pytest.raises(NSQError) as ei:
                await p.dpublish("ok", 10 * 3600, b"x")  # over --max-req-timeout
            assert ei.value.code == "E_INVALID"
            await p.publish("ok", b"y")

    run(main())


def test_pipelined_publishes_answered_in_order(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        async with Producer(nsqd.tcp_address, max_pending=8) as p:
            conn = p.connections[0]
            peak = 0

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, conn.pending)
                    await asyncio.sleep(0)

            sampler = asyncio.ensure_future(sample())
            await asyncio.gather(*(p.publish("pipe", b"%d" % i) for i in range(500)))
            sampler.cancel()
            assert 1 < peak <= 8  # pipelined, and bounded by max_pending
        got: list[bytes] = []
        async with Consumer("pipe", "c", lambda m: got.append(m.body),
                            nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=100):
            await wait_for(lambda: len(got) == 500)
        assert sorted(got) == sorted(b"%d" % i for i in range(500))

    run(main())


def test_many_messages_spread_over_two_nsqds(two_nsqd: list[NsqdProcess]) -> None:
    a, b = two_nsqd
    n = 1000

    async def main() -> None:
        async with Producer(a.tcp_address) as pa, Producer(b.tcp_address) as pb:
            await pa.mpublish("many", [b"a%d" % i for i in range(n)])
            await pb.mpublish("many", [b"b%d" % i for i in range(n)])
        got: list[bytes] = []
        per_conn: dict[str, int] = {}

        async def handler(msg: Message) -> None:
            per_conn[msg.nsqd_address] = per_conn.get(msg.nsqd_address, 0) + 1
            got.append(msg.body)
            await asyncio.sleep(0.001)

        c = Consumer("many", "ch", handler,
                     nsqd_tcp_addresses=[a.tcp_address, b.tcp_address], max_in_flight=20)
        await c.start()
        try:
            assert sorted(conn.rdy for conn in c.connections) == [10, 10]
            assert c.total_rdy == 20
            peak = 0

            def done() -> bool:
                nonlocal peak
                peak = max(peak, c.in_flight)
                return len(got) >= 2 * n

            await wait_for(done, 30, step=0.005)
        finally:
            await c.close()
        assert peak <= 20
        assert len(got) == 2 * n and len(set(got)) == 2 * n
        assert per_conn == {a.tcp_address: n, b.tcp_address: n}

    run(main())


def test_requeue_and_attempts(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        seen: list[int] = []

        def handler(msg: Message) -> None:
            seen.append(msg.attempts)
            if msg.attempts < 3:
                msg.requeue(0.1, backoff=False)

        async with Producer(nsqd.tcp_address) as p:
            await p.publish("rq", b"x")
        async with Consumer("rq", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address) as c:
            await wait_for(lambda: c.finished == 1)
            assert c.requeued == 2
            assert c.backoff_level == 0
        assert seen == [1, 2, 3]

    run(main())


def test_touch_keeps_message_in_flight(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        deliveries: list[int] = []

        async def handler(msg: Message) -> None:
            deliveries.append(msg.attempts)
            for _ in range(6):  # 2.4 s of work with a 1 s msg_timeout
                await asyncio.sleep(0.4)
                msg.touch()

        async with Producer(nsqd.tcp_address) as p:
            await p.publish("touch", b"x")
        async with Consumer("touch", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address,
                            msg_timeout=1.0) as c:
            await wait_for(lambda: c.finished == 1)
            await asyncio.sleep(1.5)
        assert deliveries == [1]

    run(main())


def test_timeout_redelivery(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        seen: list[int] = []

        def handler(msg: Message) -> None:
            seen.append(msg.attempts)
            if msg.attempts == 1:
                msg.disable_auto_response()  # never answered: nsqd times it out

        async with Producer(nsqd.tcp_address) as p:
            await p.publish("tmo", b"x")
        t0 = time.monotonic()
        async with Consumer("tmo", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address,
                            msg_timeout=1.0, max_in_flight=2) as c:
            await wait_for(lambda: c.finished == 1, 15)
        assert seen == [1, 2]
        assert time.monotonic() - t0 >= 0.9

    run(main())


def test_backoff_then_probe_then_recover(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        times: list[tuple[float, bytes, int]] = []
        fail_once = {b"m0"}

        def handler(msg: Message) -> None:
            times.append((time.monotonic(), msg.body, msg.attempts))
            if msg.body in fail_once and msg.attempts == 1:
                raise RuntimeError("boom")

        async with Producer(nsqd.tcp_address) as p:
            await p.mpublish("bo", [b"m0", b"m1", b"m2"])
        c = Consumer("bo", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address,
                     max_in_flight=1, backoff_multiplier=0.25, requeue_delay=0.0)
        await c.start()
        try:
            await wait_for(lambda: len(times) >= 1)
            # the failure put everything at RDY 0 for 0.25 * 2**1 = 0.5 s
            await wait_for(lambda: c.backoff_level == 1, 2)
            assert c.total_rdy == 0
            await wait_for(lambda: c.finished == 3, 10)
            # after the probe succeeded the level went back to 0 and RDY was restored
            await wait_for(lambda: c.backoff_level == 0 and c.total_rdy == 1, 5)
        finally:
            await c.close()
        assert times[0][1] == b"m0"
        assert times[1][0] - times[0][0] >= 0.45  # nothing delivered during the backoff
        assert sorted((b, a) for _, b, a in times) == [(b"m0", 1), (b"m0", 2), (b"m1", 1),
                                                       (b"m2", 1)]

    run(main())


def test_max_attempts_give_up_hook(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        calls: list[int] = []
        given_up: list[Message] = []

        async def handler(msg: Message) -> None:
            calls.append(msg.attempts)
            raise ValueError("always fails")

        async def give_up(msg: Message) -> None:
            given_up.append(msg)

        async with Producer(nsqd.tcp_address) as p:
            await p.publish("ma", b"poison")
        async with Consumer("ma", "ch", handler, nsqd_tcp_addresses=nsqd.tcp_address,
                            max_attempts=3, give_up=give_up, requeue_delay=0.0,
                            max_backoff_duration=0) as c:
            await wait_for(lambda: len(given_up) == 1, 10)
            await wait_for(lambda: c.finished == 1)
            await asyncio.sleep(0.5)
        assert calls == [1, 2, 3]
        assert given_up[0].attempts == 4 and given_up[0].body == b"poison"
        assert given_up[0].has_responded

    run(main())


def test_graceful_close_loses_nothing(nsqd: NsqdProcess) -> None:
    n = 300

    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            await p.mpublish("gc", [b"%d" % i for i in range(n)])
        first: list[bytes] = []

        async def slow(msg: Message) -> None:
            await asyncio.sleep(0.05)
            first.append(msg.body)

        c1 = Consumer("gc", "ch", slow, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=50)
        await c1.start()
        await wait_for(lambda: len(first) >= 60)
        await c1.close(timeout=10)
        assert c1.finished == len(first) and c1.in_flight == 0
        assert c1.received == c1.finished  # everything received was handled
        second: list[bytes] = []
        async with Consumer("gc", "ch", lambda m: second.append(m.body),
                            nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=50):
            await wait_for(lambda: len(first) + len(second) >= n)
            await asyncio.sleep(0.3)
        assert sorted(first + second) == sorted(b"%d" % i for i in range(n))

    run(main())


def test_close_timeout_requeues_unfinished(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        async with Producer(nsqd.tcp_address) as p:
            await p.publish("ct", b"stuck")

        async def stuck(msg: Message) -> None:
            await asyncio.sleep(3600)

        c1 = Consumer("ct", "ch", stuck, nsqd_tcp_addresses=nsqd.tcp_address)
        await c1.start()
        await wait_for(lambda: c1.in_flight == 1)
        t0 = time.monotonic()
        await c1.close(timeout=0.3)
        assert time.monotonic() - t0 < 3
        got: list[Message] = []
        async with Consumer("ct", "ch", got.append, nsqd_tcp_addresses=nsqd.tcp_address):
            # REQ 0 on close: redelivered at once, not after the 60 s msg timeout
            await wait_for(lambda: len(got) == 1, 5)
        assert got[0].body == b"stuck" and got[0].attempts == 2

    run(main())


def test_heartbeats_keep_idle_connections_alive(nsqd: NsqdProcess) -> None:
    async def main() -> None:
        got: list[bytes] = []
        async with Producer(nsqd.tcp_address, heartbeat_interval=1.0) as p, \
                Consumer("hb", "ch", lambda m: got.append(m.body),
                         nsqd_tcp_addresses=nsqd.tcp_address, heartbeat_interval=1.0) as c:
            pconn, cconn = p.connections[0], c.connections[0]
            await asyncio.sleep(3.5)  # nsqd drops a client that misses 2 heartbeats
            assert pconn.is_open and cconn.is_open
            await p.publish("hb", b"still here")
            await wait_for(lambda: got == [b"still here"])
            assert p.connections == [pconn] and c.connections == [cconn]

    run(main())
