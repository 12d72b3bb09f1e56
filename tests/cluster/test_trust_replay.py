"""A member's signed request copied off the wire is good once, on one node, in one run
(issue 31). Two real nsqd members, each behind a recording proxy the other reaches it
through (its ``--broadcast-cluster-port``): the proxy in front of the leader captures the
follower's signed ``GET /nsqx/replica/stream`` handshake, and the test replays those bytes
to the other member and to the leader after a restart. Before, both answered ``101``."""

from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import quote

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.trust import MAX_SKEW
from tests.support.cluster import Cluster, http, wait_until
from tests.support.faultproxy import FaultProxy, free_port

pytestmark = pytest.mark.slow

HANDSHAKE = re.compile(rb"GET /nsqx/replica/stream\?[^\r]*\r\n.*?\r\n\r\n", re.S)


def replay(address: str, request: bytes) -> tuple[int, dict]:
    """Send captured bytes as they are; the answer's status and JSON body (101: {})."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        out = b""
        while b"\r\n\r\n" not in out and (chunk := s.recv(65536)):
            out += chunk
        head, _, body = out.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 101:
            return status, {}
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length and (chunk := s.recv(65536)):
            body += chunk
        return status, json.loads(body)


def test_a_captured_stream_handshake_works_nowhere_else_and_not_after_a_restart(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    proxies: dict[str, FaultProxy] = {}
    real: dict[str, str] = {}  # node id -> its cluster listener, not through the proxy
    try:
        for _ in range(2):
            port = free_port()
            proxy = FaultProxy(port, record=True).start()
            node = cluster.add_node([f"--cluster-address=127.0.0.1:{port}",
                                     f"--broadcast-cluster-port={proxy.port}"])
            proxies[cluster.node_id(node)] = proxy
            real[cluster.node_id(node)] = f"127.0.0.1:{port}"
        wait_until(lambda: len(cluster.stats()["nodes"]) == 2, what="two nodes registered")
        cluster.create_topic("rp", partitions=1, replicas=2)
        leader = cluster.leader("rp")
        follower = next(n for n in cluster.nodes if n is not leader)
        lid, fid = cluster.node_id(leader), cluster.node_id(follower)
        assert http("POST", f"http://{leader.http_address}/pub?topic=rp", b"m",
                    timeout=15)[0] == 200
        # a fresh capture: the leader's proxy resets its connections, the follower reopens
        # its stream through it with a new signature
        on_wire = proxies[lid]
        seen = len(on_wire.recorded)
        on_wire.heal()

        def captured() -> bytes | None:
            for rec in on_wire.recorded[seen:]:
                m = HANDSHAKE.match(bytes(rec))
                if m and f"node={quote(fid)}".encode() in m.group(0):
                    return m.group(0)
            return None

        wait_until(captured, timeout=30, what="the follower's stream handshake on the wire")
        request = captured()
        assert request is not None and b"X-Nsqx-Signature" in request
        at = time.monotonic()

        # on another member (the follower itself is one): signed for the leader only
        status, body = replay(real[fid], request)
        assert (status, body.get("message")) == (401, "E_WRONG_RECEIVER"), (status, body)

        # on the leader after a restart, inside the signature's 30 s window
        leader.restart()
        wait_until(lambda: cluster.role_of(leader, "rp", 0) in ("leader", "follower"),
                   timeout=20, what="the restarted member knows the cluster again")
        assert time.monotonic() - at < MAX_SKEW, "too slow to test inside the window"
        status, body = replay(real[lid], request)
        assert (status, body.get("message")) == (401, "E_REPLAYED"), (status, body)
        assert "before this node started" in body.get("detail", ""), body

        assert cluster.state(follower)["refused"].get("E_WRONG_RECEIVER") == 1
        assert cluster.state(leader)["refused"].get("E_REPLAYED") == 1
        # the members themselves still replicate through the proxies
        wait_until(lambda: sorted(cluster.partitions("rp")[0]["isr"]) == sorted([lid, fid]),
                   timeout=60, what="both replicas in the ISR again")
    finally:
        for proxy in proxies.values():
            proxy.stop()
