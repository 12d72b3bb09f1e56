"""nsq_to_nsq relaying between real nsqd nodes; nsq_stat against /stats."""

from __future__ import annotations

import json
import re

import pytest

from tests.tools.helpers import channel_stats, consume, create_topic, pub, topic_stats, wait_for


def _relayed(n, topic: str) -> int:
    return (topic_stats(n.http_address, topic) or {}).get("message_count", 0)


def test_relay_with_json_filters(nsqd_factory, tools) -> None:
    src = nsqd_factory.start()
    dst = nsqd_factory.start()
    create_topic(src.http_address, "n2n_src")
    msgs = [
        {"id": 1, "kind": "keep", "secret": "x"},
        {"id": 2, "kind": "drop", "secret": "y"},
        {"id": 3.0, "kind": "keep", "extra": [1, 2]},
    ]
    bodies = [json.dumps(m).encode() for m in msgs] + [b"not json", b"[1, 2]"]
    pub(src.http_address, "n2n_src", bodies)
    t = tools.start("nsq_to_nsq", [
        "--topic=n2n_src", f"--nsqd-tcp-address={src.tcp_address}",
        f"--destination-nsqd-tcp-address={dst.tcp_address}", "--destination-topic=n2n_dst",
        "--require-json-field=kind", "--require-json-value=keep",
        "--whitelist-json-field=id", "--whitelist-json-field=kind"])
    wait_for(lambda: (channel_stats(src.http_address, "n2n_src", "nsq_to_nsq") or {}).get(
        "depth", 1) == 0 and channel_stats(src.http_address, "n2n_src", "nsq_to_nsq")[
        "in_flight_count"] == 0, 15, "source drained")
    assert t.terminate() == 0, t.stderr
    assert _relayed(dst, "n2n_dst") == 2
    got = consume(dst.tcp_address, "n2n_dst", 2)
    assert sorted(got) == [b'{"id":1,"kind":"keep"}', b'{"id":3,"kind":"keep"}']


@pytest.mark.parametrize("mode", ["round-robin", "fanout", "hostpool"])
def test_modes_two_destinations(nsqd_factory, tools, mode: str) -> None:
    src = nsqd_factory.start()
    d1 = nsqd_factory.start()
    d2 = nsqd_factory.start()
    create_topic(src.http_address, "n2n_m")
    bodies = [f"m{i}".encode() for i in range(10)]
    pub(src.http_address, "n2n_m", bodies)
    t = tools.start("nsq_to_nsq", [
        "-topic", "n2n_m", "-nsqd-tcp-address", src.tcp_address,
        "-destination-nsqd-tcp-address", d1.tcp_address,
        "-destination-nsqd-tcp-address", d2.tcp_address, f"-mode={mode}",
        "-producer-opt=heartbeat_interval,5s", "-max-in-flight=5"])
    total = 20 if mode == "fanout" else 10
    wait_for(lambda: _relayed(d1, "n2n_m") + _relayed(d2, "n2n_m") == total, 15, "relayed")
    assert t.terminate() == 0, t.stderr
    n1, n2 = _relayed(d1, "n2n_m"), _relayed(d2, "n2n_m")
    if mode == "fanout":
        assert n1 == n2 == 10
        assert sorted(consume(d2.tcp_address, "n2n_m", 10)) == sorted(bodies)
    elif mode == "round-robin":
        assert n1 == n2 == 5
    else:
        assert n1 + n2 == 10
    c = channel_stats(src.http_address, "n2n_m", "nsq_to_nsq")
    assert c["depth"] == 0 and c["in_flight_count"] == 0


@pytest.mark.slow  # the producer waits 5 s for a connection before failing
def test_destination_down_requeues(nsqd_factory, tools) -> None:
    src = nsqd_factory.start()
    dst = nsqd_factory.start()
    create_topic(src.http_address, "n2n_down")
    dst_tcp = dst.tcp_address
    dst.stop()
    pub(src.http_address, "n2n_down", [b"a", b"b"])
    t = tools.start("nsq_to_nsq", [
        "--topic=n2n_down", f"--nsqd-tcp-address={src.tcp_address}",
        f"--destination-nsqd-tcp-address={dst_tcp}",
        "--consumer-opt=default_requeue_delay,100ms", "--consumer-opt=backoff_multiplier,100ms"])
    wait_for(lambda: (channel_stats(src.http_address, "n2n_down", "nsq_to_nsq") or {}).get(
        "requeue_count", 0) >= 1, 30, "a failed publish requeued")
    assert t.terminate() == 0, t.stderr
    c = channel_stats(src.http_address, "n2n_down", "nsq_to_nsq")
    assert c["in_flight_count"] == 0
    assert c["depth"] + c["deferred_count"] == 2  # nothing lost


_ROW = re.compile(r"^\s*(-?\d+)\s+(-?\d+) \|" + r"\s+(\d+)" * 5 + r" \|" + r"\s+(\d+)" * 4 + r"$")


def test_nsq_stat_numbers_match_stats(nsqd, tools) -> None:
    create_topic(nsqd.http_address, "stat_t", "stat_c")
    pub(nsqd.http_address, "stat_t", [f"s{i}".encode() for i in range(7)])
    r = tools.run("nsq_stat", ["--topic=stat_t", "--channel=stat_c",
                               f"--nsqd-http-address={nsqd.http_address}", "--interval=200ms",
                               "--count=2"])
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    lines = out.splitlines()
    assert lines[0] == ("------rate------+----------------depth----------------+"
                        "--------------metadata---------------")
    assert lines[1].split() == ["ingress", "egress", "|", "total", "mem", "disk", "inflt", "def",
                                "|", "req", "t-o", "msgs", "clients"]
    rows = [_ROW.match(ln) for ln in lines[2:]]
    assert len(rows) == 2 and all(rows), out
    c = channel_stats(nsqd.http_address, "stat_t", "stat_c")
    vals = [int(x) for x in rows[-1].groups()]
    ingress, egress, total, mem, disk, inflt, deferred, req, to, msgs, clients = vals
    assert total == c["depth"] == 7
    assert mem + disk == total
    assert disk == c["backend_depth"]
    assert (inflt, deferred, req, to, clients) == (c["in_flight_count"], c["deferred_count"],
                                                   c["requeue_count"], c["timeout_count"],
                                                   c["client_count"])
    assert msgs == c["message_count"]
    assert ingress == 0 and egress == 0


def test_nsq_stat_lookupd_and_sigterm(nsqd_factory, lookupd_factory, tools) -> None:
    ld = lookupd_factory.start()
    nsqd = nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1"])
    create_topic(nsqd.http_address, "stat_l", "c")
    wait_for(lambda: ld.get_json("/lookup?topic=stat_l")[0] == 200, 10, "registration")
    t = tools.start("nsq_stat", ["--topic=stat_l", "--channel=c",
                                 f"--lookupd-http-address={ld.http_address}",
                                 "--interval=200ms"])
    pub(nsqd.http_address, "stat_l", [b"x"] * 5)
    wait_for(lambda: t.stdout.decode().count("\n") >= 5, 15, "a few rows")
    assert t.terminate() == 0, t.stderr
    rows = [m for m in (_ROW.match(ln) for ln in t.stdout.decode().splitlines()) if m]
    assert int(rows[-1].group(3)) == 5  # total depth


def test_nsq_stat_unknown_channel_fails(nsqd, tools) -> None:
    create_topic(nsqd.http_address, "stat_u")
    r = tools.run("nsq_stat", ["--topic=stat_u", "--channel=nope",
                               f"--nsqd-http-address={nsqd.http_address}", "--count=1"])
    assert r.returncode == 1
    assert b"failed to find channel(nope)" in r.stderr
