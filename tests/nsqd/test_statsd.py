"""statsd emitter: upstream metric names, counter deltas, packet batching, UDP delivery."""

from __future__ import annotations

import asyncio
import socket

from nsqx.nsqd.statsd import StatsdEmitter, expand_prefix, host_key, pack_lines
from tests.nsqd.nsqd_fakes import FakeNSQD


def test_prefix_expansion() -> None:
    assert host_key("node1.example:4151") == "node1_example_4151"
    assert expand_prefix("nsq.%s", "node1.example", 4151) == "nsq.node1_example_4151."
    assert expand_prefix("nsq.%s.", "10.0.0.1", 80) == "nsq.10_0_0_1_80."
    assert expand_prefix("plain", "h", 1) == "plain."
    assert expand_prefix("", "h", 1) == ""
    assert expand_prefix("x.%s", "::1", 4151) == "x.[__1]_4151."


def test_pack_lines_like_boundary_buffered_writer() -> None:
    lines = [b"a" * 10 + b"\n"] * 5  # 11 bytes each
    assert pack_lines(lines, 33) == [b"".join(lines[:3]), b"".join(lines[3:])]
    assert pack_lines(lines, 11) == lines
    big = b"b" * 50 + b"\n"
    assert pack_lines([lines[0], big, lines[0]], 30) == [lines[0], big, lines[0]]
    assert pack_lines([], 508) == []


def _node() -> FakeNSQD:
    n = FakeNSQD(statsd_prefix="nsq.%s", statsd_mem_stats=False)
    n.opts.broadcast_address = "node1.example"
    t = n.get_topic("orders")
    assert t is not None
    t.message_count, t.message_bytes, t.depth = 10, 100, 3
    ch = t.get_channel("archive")
    assert ch is not None
    ch.message_count, ch.requeue_count, ch.timeout_count = 8, 2, 1
    ch.depth, ch.in_flight_count, ch.deferred_count = 4, 5, 6
    ch.clients[1] = object()
    eph = n.get_topic("tmp#ephemeral")
    assert eph is not None
    eph.get_channel("c#ephemeral")
    t.get_channel("live#ephemeral")
    return n


def test_names_gauges_and_counter_deltas() -> None:
    n = _node()
    em = StatsdEmitter(n)
    lines = [x.decode() for x in em.collect()]
    p = "nsq.node1_example_4151."
    for expected in (
        "topic.orders.message_count:10|c", "topic.orders.message_bytes:100|c",
        "topic.orders.depth:3|g", "topic.orders.backend_depth:3|g",
        "topic.orders.channel.archive.message_count:8|c",
        "topic.orders.channel.archive.depth:4|g",
        "topic.orders.channel.archive.backend_depth:4|g",
        "topic.orders.channel.archive.in_flight_count:5|g",
        "topic.orders.channel.archive.deferred_count:6|g",
        "topic.orders.channel.archive.requeue_count:2|c",
        "topic.orders.channel.archive.timeout_count:1|c",
        "topic.orders.channel.archive.clients:1|g",
        "topic.tmp#ephemeral.depth:0|g",
    ):
        assert p + expected + "\n" in lines, expected
    assert not any(".mem." in x for x in lines)

    t = n.topics["orders"]
    t.message_count += 5
    t.channels["archive"].requeue_count += 1
    lines = [x.decode() for x in em.collect()]
    assert p + "topic.orders.message_count:5|c\n" in lines
    assert p + "topic.orders.channel.archive.message_count:0|c\n" in lines
    assert p + "topic.orders.channel.archive.requeue_count:1|c\n" in lines
    # a topic deleted and re-created counts from zero again, never negative
    del n.topics["orders"]
    t2 = n.get_topic("orders")
    assert t2 is not None
    t2.message_count = 2
    lines = [x.decode() for x in em.collect()]
    assert p + "topic.orders.message_count:2|c\n" in lines


def test_exclude_ephemeral_and_mem_stats() -> None:
    n = _node()
    n.opts.statsd_exclude_ephemeral = True
    n.opts.statsd_mem_stats = True
    lines = [x.decode() for x in StatsdEmitter(n).collect()]
    assert not any("ephemeral" in x for x in lines)
    p = "nsq.node1_example_4151."
    for key in ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes"):
        assert any(x.startswith(f"{p}mem.{key}:") and x.endswith("|g\n") for x in lines), key
    assert any(x.startswith(f"{p}mem.gc_runs:") and x.endswith("|c\n") for x in lines)


def test_e2e_percentile_names() -> None:
    n = _node()
    orig = n.stats_dict

    def stats_dict(**kw):  # type: ignore[no-untyped-def]
        s = orig(**kw)
        pct = {"count": 3, "percentiles": [{"quantile": 0.99, "value": 1500.0},
                                           {"quantile": 0.5, "value": 700.0}]}
        s["topics"][0]["e2e_processing_latency"] = pct
        s["topics"][0]["channels"][0]["e2e_processing_latency"] = pct
        return s

    n.stats_dict = stats_dict  # type: ignore[method-assign]
    lines = [x.decode() for x in StatsdEmitter(n).collect()]
    p = "nsq.node1_example_4151."
    assert p + "topic.orders.e2e_processing_latency_99:1500|g\n" in lines
    assert p + "topic.orders.channel.archive.e2e_processing_latency_50:700|g\n" in lines


def test_packets_received_over_udp() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    try:
        n = _node()
        n.opts.statsd_address = f"127.0.0.1:{sock.getsockname()[1]}"
        n.opts.statsd_udp_packet_size = 200
        n.opts.statsd_interval = 0.05

        async def main() -> int:
            em = StatsdEmitter(n)
            sent = await em.push_once()
            # and the background task pushes on its own
            em.start()
            await asyncio.sleep(0.3)
            await em.close()
            return sent

        sent = asyncio.run(main())
        assert sent > 1
        packets = [sock.recv(65536) for _ in range(sent)]
        for pkt in packets:
            assert len(pkt) <= 200 or pkt.count(b"\n") == 1
            assert pkt.endswith(b"\n")
        text = b"".join(packets).decode()
        assert "nsq.node1_example_4151.topic.orders.message_count:10|c\n" in text
        more = sock.recv(65536)  # from the background task
        assert more.startswith(b"nsq.node1_example_4151.")
    finally:
        sock.close()


def test_unreachable_statsd_is_logged_not_raised() -> None:
    n = _node()
    n.opts.statsd_address = "not-an-address"

    async def main() -> int:
        return await StatsdEmitter(n).push_once()

    assert asyncio.run(main()) == 0
