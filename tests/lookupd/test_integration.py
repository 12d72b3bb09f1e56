"""nsqlookupd with REAL nsqd processes (``--lookupd-tcp-address``) and a real pynsq Reader."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.lookupd_process import LookupdProcess
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient

READER_SCRIPT = Path(__file__).with_name("pynsq_lookup_reader.py")
GNSQ_READER_SCRIPT = Path(__file__).with_name("gnsq_lookup_reader.py")


def wait_until(pred, timeout: float = 10.0, interval: float = 0.05, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        time.sleep(interval)


def nsqd_args(ld: LookupdProcess) -> list[str]:
    return [f"--lookupd-tcp-address={ld.tcp_address}", "--broadcast-address=127.0.0.1"]


def lookup(ld: LookupdProcess, topic: str) -> tuple[int, Any]:
    return ld.get_json(f"/lookup?topic={quote(topic)}")


def producer_ports(ld: LookupdProcess, topic: str) -> set[int]:
    status, data = lookup(ld, topic)
    if status != 200:
        return set()
    return {p["tcp_port"] for p in data["producers"]}


def nodes(ld: LookupdProcess) -> dict[int, dict]:
    return {n["tcp_port"]: n for n in ld.get_json("/nodes")[1]["producers"]}


def ok(r: http_api.Response) -> None:
    assert r.status == 200, (r.status, r.body)


@pytest.fixture
def cluster(lookupd_factory, nsqd_factory):
    def make(*lookupd_flags: str, n: int = 2) -> tuple[LookupdProcess, list[NsqdProcess]]:
        ld = lookupd_factory.start(list(lookupd_flags))
        ns = [nsqd_factory.start(nsqd_args(ld)) for _ in range(n)]
        # both nsqds identified themselves
        wait_until(lambda: len(nodes(ld)) == n, what="nsqds in /nodes")
        return ld, ns

    return make


def test_topics_and_channels_appear(cluster):
    ld, (n1, n2) = cluster()
    ok(http_api.post(n1.http_address, "/topic/create", topic="it1"))
    ok(http_api.post(n2.http_address, "/topic/create", topic="it1"))
    ok(http_api.post(n1.http_address, "/channel/create", topic="it1", channel="ch1"))
    ok(http_api.pub(n2.http_address, "it2", b"hello"))  # publishing creates the topic

    wait_until(lambda: producer_ports(ld, "it1") == {n1.tcp_port, n2.tcp_port}, what="/lookup")
    wait_until(lambda: lookup(ld, "it1")[1]["channels"] == ["ch1"], what="channel registered")
    status, data = lookup(ld, "it1")
    by_port = {p["tcp_port"]: p for p in data["producers"]}
    for n in (n1, n2):
        p = by_port[n.tcp_port]
        assert p["http_port"] == n.http_port
        assert p["broadcast_address"] == "127.0.0.1"
        assert p["hostname"] == socket.gethostname()
        assert p["version"] == "1.3.0"
        assert p["remote_address"].startswith("127.0.0.1:")
        assert set(p) == {"remote_address", "hostname", "broadcast_address", "tcp_port",
                          "http_port", "version", "topology_zone", "topology_region"}
    wait_until(lambda: producer_ports(ld, "it2") == {n2.tcp_port}, what="it2")
    assert {"it1", "it2"} <= set(ld.get_json("/topics")[1]["topics"])
    assert ld.get_json("/channels?topic=it1")[1] == {"channels": ["ch1"]}
    ns = nodes(ld)
    assert sorted(ns[n1.tcp_port]["topics"]) == ["it1"]
    assert sorted(ns[n2.tcp_port]["topics"]) == ["it1", "it2"]
    assert ns[n2.tcp_port]["tombstones"] == [False, False]

    # deleting the topic on nsqd1 unregisters it there only
    ok(http_api.post(n1.http_address, "/topic/delete", topic="it1"))
    wait_until(lambda: producer_ports(ld, "it1") == {n2.tcp_port}, what="unregister")
    assert nodes(ld)[n1.tcp_port]["topics"] == []
    # a channel deleted on an nsqd: its producer leaves the channel registration
    ok(http_api.post(n2.http_address, "/channel/create", topic="it2", channel="c2"))
    wait_until(lambda: "channel:it2:c2" in ld.get_json("/debug")[1], what="c2 registered")
    ok(http_api.post(n2.http_address, "/channel/delete", topic="it2", channel="c2"))
    wait_until(lambda: "channel:it2:c2" not in ld.get_json("/debug")[1], what="c2 unregistered")


def test_ephemeral_channel_follows_its_consumer(cluster):
    ld, (n1,) = cluster(n=1)
    c = RawClient(n1.tcp_address)
    c.send(v2.sub("eph", "tail#ephemeral"))
    c.expect_ok()
    wait_until(lambda: "tail#ephemeral" in (lookup(ld, "eph")[1].get("channels") or []),
               what="ephemeral channel registered")
    c.close()
    wait_until(lambda: lookup(ld, "eph")[1]["channels"] == [], what="ephemeral channel gone")


def test_tombstone_hides_producer_for_lifetime(cluster):
    ld, (n1, n2) = cluster("--tombstone-lifetime=1500ms")
    for n in (n1, n2):
        ok(http_api.post(n.http_address, "/topic/create", topic="tomb"))
    wait_until(lambda: producer_ports(ld, "tomb") == {n1.tcp_port, n2.tcp_port})
    r = http_api.post(ld.http_address, "/topic/tombstone", topic="tomb",
                      node=f"127.0.0.1:{n1.http_port}")
    assert (r.status, r.body) == (200, b"")
    t0 = time.monotonic()
    assert producer_ports(ld, "tomb") == {n2.tcp_port}
    node = nodes(ld)[n1.tcp_port]
    assert node["tombstones"] == [True]
    wait_until(lambda: producer_ports(ld, "tomb") == {n1.tcp_port, n2.tcp_port}, timeout=5)
    assert time.monotonic() - t0 >= 1.3
    assert nodes(ld)[n1.tcp_port]["tombstones"] == [False]


def test_inactive_producer_expires(cluster):
    # nsqd PINGs every 15 s: with a 2 s timeout it drops out of /lookup and /nodes in between
    ld, (n1,) = cluster("--inactive-producer-timeout=2s", n=1)
    ok(http_api.post(n1.http_address, "/topic/create", topic="idle"))
    wait_until(lambda: producer_ports(ld, "idle") == {n1.tcp_port}, timeout=1.5)
    wait_until(lambda: producer_ports(ld, "idle") == set(), timeout=5, what="inactive")
    assert lookup(ld, "idle") == (200, {"channels": [], "producers": []})
    assert nodes(ld) == {}
    # still registered, just filtered
    assert ld.get_json("/debug")[1]["topic:idle:"][0]["tcp_port"] == n1.tcp_port


def test_killed_nsqd_vanishes(cluster):
    ld, (n1, n2) = cluster()
    for n in (n1, n2):
        ok(http_api.post(n.http_address, "/topic/create", topic="gone"))
        ok(http_api.post(n.http_address, "/channel/create", topic="gone", channel="c"))
    wait_until(lambda: producer_ports(ld, "gone") == {n1.tcp_port, n2.tcp_port})
    n1.kill()
    wait_until(lambda: producer_ports(ld, "gone") == {n2.tcp_port}, what="killed nsqd dropped")
    assert set(nodes(ld)) == {n2.tcp_port}
    debug = ld.get_json("/debug")[1]
    assert all(e["tcp_port"] != n1.tcp_port for entries in debug.values() for e in entries)
    # a gracefully stopped one too
    n2.stop()
    wait_until(lambda: nodes(ld) == {}, what="stopped nsqd dropped")
    assert lookup(ld, "gone") == (200, {"channels": ["c"], "producers": []})


@pytest.mark.slow
def test_nsqd_reregisters_after_lookupd_restart(cluster):
    ld, (n1, n2) = cluster()
    ok(http_api.post(n1.http_address, "/topic/create", topic="rr"))
    ok(http_api.post(n1.http_address, "/channel/create", topic="rr", channel="c1"))
    ok(http_api.post(n2.http_address, "/topic/create", topic="rr2"))
    wait_until(lambda: producer_ports(ld, "rr") == {n1.tcp_port})
    ld.restart()
    assert lookup(ld, "rr")[0] == 404  # a new lookupd knows nothing
    # nsqd notices at its next PING (<= 15 s), reconnects, IDENTIFYs, REGISTERs everything
    wait_until(lambda: producer_ports(ld, "rr") == {n1.tcp_port}, timeout=40,
               what="re-registration")
    assert lookup(ld, "rr")[1]["channels"] == ["c1"]
    wait_until(lambda: producer_ports(ld, "rr2") == {n2.tcp_port}, timeout=40)
    assert set(nodes(ld)) == {n1.tcp_port, n2.tcp_port}


@pytest.mark.slow
@pytest.mark.compat
def test_pynsq_reader_discovers_nsqds_through_lookupd(cluster):
    ld, (n1, n2) = cluster()
    for i in range(5):
        ok(http_api.pub(n1.http_address, "pyt", f"n1-{i}".encode()))
        ok(http_api.pub(n2.http_address, "pyt", f"n2-{i}".encode()))
    wait_until(lambda: producer_ports(ld, "pyt") == {n1.tcp_port, n2.tcp_port})
    params = {"lookupd": f"http://{ld.http_address}", "topic": "pyt", "channel": "readers",
              "expect": 10, "deadline_s": 30}
    r = subprocess.run([sys.executable, str(READER_SCRIPT), json.dumps(params)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["timed_out"], (out, r.stderr[-3000:])
    assert sorted(out["bodies"]) == sorted([f"n1-{i}" for i in range(5)]
                                           + [f"n2-{i}" for i in range(5)])
    assert sorted(out["connections"]) == sorted([n1.tcp_address, n2.tcp_address])
    # the reader's channel was registered by both nsqds
    wait_until(lambda: lookup(ld, "pyt")[1]["channels"] == ["readers"])


def test_nsqd_topology_reaches_lookup(lookupd_factory, nsqd_factory):
    ld = lookupd_factory.start()
    n1 = nsqd_factory.start(nsqd_args(ld) + ["--topology-zone=z1", "--topology-region=r1"])
    ok(http_api.post(n1.http_address, "/topic/create", topic="topo"))
    wait_until(lambda: producer_ports(ld, "topo") == {n1.tcp_port})
    p = lookup(ld, "topo")[1]["producers"][0]
    assert (p["topology_zone"], p["topology_region"]) == ("z1", "r1")


@pytest.mark.slow
def test_nsqd_pings_every_15s_even_when_busy(lookupd_factory, nsqd_factory):
    ld = lookupd_factory.start(["--inactive-producer-timeout=17s"])
    n1 = nsqd_factory.start(nsqd_args(ld))
    ok(http_api.post(n1.http_address, "/topic/create", topic="busy"))
    wait_until(lambda: producer_ports(ld, "busy") == {n1.tcp_port})
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < 19:
        # channel churn, as nsq_tail's ephemeral channels cause
        ok(http_api.post(n1.http_address, "/channel/create", topic="busy", channel=f"c{i}"))
        ok(http_api.post(n1.http_address, "/channel/delete", topic="busy", channel=f"c{i}"))
        i += 1
        time.sleep(2)
    # an nsqd that PINGs every 15 s is active at t=19 s with a 17 s timeout
    assert producer_ports(ld, "busy") == {n1.tcp_port}


def test_nsqd_precreates_channels_lookupd_knows(cluster):
    """nsqd asks lookupd's /channels for a new topic's channels (upstream nsqd/nsqd.go)."""
    ld, (n1, n2) = cluster()
    ok(http_api.post(n1.http_address, "/topic/create", topic="pre"))
    ok(http_api.post(n1.http_address, "/channel/create", topic="pre", channel="keep"))
    wait_until(lambda: lookup(ld, "pre")[1].get("channels") == ["keep"])
    ok(http_api.pub(n2.http_address, "pre", b"m1"))
    wait_until(lambda: http_api.channel_stats(n2.http_address, "pre", "keep") is not None,
               what="channel pre-created on nsqd2")
    wait_until(lambda: producer_ports(ld, "pre") == {n1.tcp_port, n2.tcp_port})
    assert lookup(ld, "pre")[1]["channels"] == ["keep"]


@pytest.mark.slow
@pytest.mark.compat
def test_gnsq_consumer_discovers_nsqds_through_lookupd(cluster):
    ld, (n1, n2) = cluster()
    for i in range(5):
        ok(http_api.pub(n1.http_address, "gt", f"n1-{i}".encode()))
        ok(http_api.pub(n2.http_address, "gt", f"n2-{i}".encode()))
    wait_until(lambda: producer_ports(ld, "gt") == {n1.tcp_port, n2.tcp_port})
    params = {"lookupd": ld.http_address, "topic": "gt", "channel": "readers",
              "expect": 10, "deadline_s": 30}
    r = subprocess.run([sys.executable, str(GNSQ_READER_SCRIPT), json.dumps(params)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["timed_out"], (out, r.stderr[-3000:])
    assert sorted(out["bodies"]) == sorted([f"n1-{i}" for i in range(5)]
                                           + [f"n2-{i}" for i in range(5)])
    assert len(out["connections"]) == 2
