"""The replication stream in a real cluster (etcd, nsqlookupd, nsqd processes with a shared
--cluster-secret-file): its handshake refuses what the HTTP fetch refuses, forged streams
acknowledge nothing while the followers are stopped, and a stream cut in the middle of an
answer resumes without losing or repeating a record.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.stream import FETCH, PATH, StreamConnection, StreamRefused
from nsqx.cluster.trust import Signer
from tests.support.cluster import Cluster, http, publish_with_followers_stopped, wait_until
from tests.support.faultproxy import FaultProxy, free_port

pytestmark = pytest.mark.slow

Sign = Callable[..., dict[str, str]] | None


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def pub(node, topic: str, body: bytes) -> int:  # type: ignore[no-untyped-def]
    return http("POST", f"http://{node.http_address}/pub?topic={topic}", body, timeout=15)[0]


def stream_fetch(addr: str, node: str, sign: Sign, topic: str, epoch: int, offset: int,
                 conn: StreamConnection | None = None) -> tuple[int, dict[str, Any]]:
    """One fetch at the tail over a stream to ``addr`` (a new one unless ``conn``):
    (status, head or refusal body)."""
    async def main() -> tuple[int, dict[str, Any]]:
        c = conn or StreamConnection(addr, node, sign=sign)
        try:
            status, head, _ = await c.fetch(topic, 0, epoch, offset, 1 << 20, 0, 10)
            return status, orjson.loads(head)
        except StreamRefused as e:
            return e.status, orjson.loads(e.body)
        finally:
            if conn is None:
                c.close()
    return asyncio.run(main())


def test_stream_handshake_refused_as_the_http_fetch(cluster: Cluster) -> None:
    cluster.create_topic("sh", partitions=1, replicas=3)
    leader, follower, other = cluster.roles("sh")
    fid, oid = cluster.node_id(follower), cluster.node_id(other)
    assert pub(leader, "sh", b"x") == 200
    st = cluster.state(leader)
    assert st["replication"] == "stream" and st["streams_served"] == 2, st  # the followers'
    epoch = cluster.partitions("sh")[0]["epoch"]
    end = st["partitions"][0]["log_end"]
    addr = st["cluster_address"]

    def check(got: tuple[int, dict[str, Any]], status: int, code: str) -> None:
        assert got[0] == status and got[1]["message"] == code, got

    check(stream_fetch(addr, fid, None, "sh", epoch, end), 401, "E_UNAUTHENTICATED")
    bad = Signer(b"guessed secret, quite long enough", fid)
    check(stream_fetch(addr, fid, bad.headers, "sh", epoch, end), 401, "E_BAD_SIGNATURE")
    check(stream_fetch(addr, fid, cluster.signer(oid).headers, "sh", epoch, end),
          403, "E_NODE_MISMATCH")
    check(stream_fetch(addr, "ghost", cluster.signer("ghost").headers, "sh", epoch, end),
          403, "E_NOT_REGISTERED")                                              # never joined
    check(stream_fetch(leader.http_address, fid, cluster.signer(fid).headers, "sh", epoch,
                       end), 403, "E_CLUSTER_PORT")                             # public port
    got = stream_fetch(addr, fid, cluster.signer(fid).headers, "sh", epoch, end)  # a member's
    assert got[0] == 200 and got[1]["start"] == end, got
    check(stream_fetch(addr, fid, cluster.signer(fid).headers, "sh", epoch - 1, end),
          409, "E_STALE_EPOCH")
    # a follower whose lease ended is not a member until it registers again: neither a new
    # stream in its name nor one opened while it was registered carries its acks
    loop = asyncio.new_event_loop()
    held = StreamConnection(addr, fid, sign=cluster.signer(fid).headers)
    try:
        async def open_held() -> int:
            return (await held.fetch("sh", 0, epoch, end, 1 << 20, 0, 10))[0]

        assert loop.run_until_complete(open_held()) == 200
        follower.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: fid not in {n["id"] for n in cluster.stats()["nodes"]},
                       timeout=30, what="the stopped follower's lease ended")
            end = cluster.state(leader)["partitions"][0]["log_end"]
            check(stream_fetch(addr, fid, cluster.signer(fid).headers, "sh", epoch, end),
                  403, "E_NOT_REGISTERED")

            async def on_held() -> tuple[int, dict[str, Any]]:
                status, head, _ = await held.fetch("sh", 0, epoch, end, 1 << 20, 0, 10)
                return status, orjson.loads(head)

            check(loop.run_until_complete(on_held()), 403, "E_NOT_REGISTERED")
        finally:
            follower.signal(signal.SIGCONT)
    finally:
        held.close()
        loop.close()
    wait_until(lambda: fid in cluster.partitions("sh")[0]["isr"], timeout=60,
               what="the follower registered again and back in the ISR")
    refused = cluster.state(leader)["refused"]
    for reason in ("E_UNAUTHENTICATED", "E_BAD_SIGNATURE", "E_NODE_MISMATCH", "E_NOT_REGISTERED",
                   "E_STALE_EPOCH", "E_CLUSTER_PORT"):
        assert refused.get(reason), (reason, refused)


def raw_pipelined(addr: str, node: str, headers: dict[str, str], frame: bytes) -> int:
    """A handshake with a FETCH frame right behind it (not waiting for the 101): the status
    the leader answers (0: no HTTP answer)."""
    host, _, port = addr.rpartition(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET {PATH}?node={node} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\n"
                  f"Upgrade: tcp\r\n{extra}\r\n".encode() + frame)
        try:
            head = s.recv(4096)
        except OSError:
            return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def test_forged_streams_acknowledge_nothing(cluster: Cluster) -> None:
    """The impersonation of test_trust_processes over the stream: both followers stopped,
    streams in their names opened by a client that knows everything public but the secret."""
    cluster.create_topic("simp", partitions=1, replicas=3)
    leader = cluster.leader("simp")
    followers = [n for n in cluster.nodes if n is not leader]
    ids = [cluster.node_id(f) for f in followers]
    assert pub(leader, "simp", b"before") == 200
    epoch = cluster.partitions("simp")[0]["epoch"]
    addr = cluster.state(leader)["cluster_address"]
    wrong = [Signer(b"not the cluster secret, but long", fid) for fid in ids]
    statuses: list[int] = []

    def forge() -> None:
        end = cluster.state(leader)["partitions"][0]["log_end"]
        name = b"simp"
        frame = FETCH.pack(FETCH.size - 4 + len(name), 1, 0, epoch, end, 1 << 20, 0) + name
        for fid, bad in zip(ids, wrong, strict=True):
            for sign in (None, bad.headers):
                statuses.append(stream_fetch(addr, fid, sign, "simp", epoch, end)[0])
            statuses.append(raw_pipelined(addr, fid, bad.headers("GET", PATH, {"node": fid}),
                                          frame))
            statuses.append(raw_pipelined(addr, fid, {}, frame))

    results = publish_with_followers_stopped(cluster, "simp", forge,
                                             lambda: len(statuses) > 20, after=100)
    assert results.count(200) == 0, f"{results.count(200)} publishes acked by one replica"
    assert statuses and set(statuses) <= {401}, sorted(set(statuses))
    wait_until(lambda: len(cluster.partitions("simp")[0]["isr"]) == 3, timeout=60,
               what="the followers back in the ISR")
    assert pub(leader, "simp", b"after") == 200


def fetch_log(node, topic: str) -> bytes:  # type: ignore[no-untyped-def]
    url = (f"http://{node.http_address}/nsqx/fetch?topic={topic}&partition=0&offset=0"
           f"&max_bytes={64 << 20}")
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def test_stream_cut_mid_answer_resumes_without_loss_or_duplicate(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    proxies: dict[int, FaultProxy] = {}
    try:
        for _ in range(2):
            internal = free_port()
            proxy = FaultProxy(internal, name="cluster").start()
            node = cluster.add_node([f"--cluster-address=127.0.0.1:{internal}",
                                     f"--broadcast-cluster-port={proxy.port}"])
            proxies[id(node)] = proxy
        wait_until(lambda: len(cluster.stats()["nodes"]) == 2, what="two nodes registered")
        cluster.create_topic("cut", partitions=1, replicas=2)
        leader = cluster.leader("cut")
        follower = next(n for n in cluster.nodes if n is not leader)
        proxy = proxies[id(leader)]
        assert pub(leader, "cut", b"first") == 200
        sent = 1
        proxy.cut_after(4096)  # the next answer with frames is cut after 4 KiB
        for b in range(5):
            body = b"\n".join(b"%d-%d-" % (b, i) + b"x" * 2000 for i in range(300))
            assert http("POST", f"http://{leader.http_address}/mpub?topic=cut", body,
                        timeout=30)[0] == 200
            sent += 300
        assert proxy.cuts == 1
        assert b"fetch from" in follower.log_bytes()  # the follower saw its stream break

        def same() -> bool:
            ends = [cluster.state(n)["partitions"][0]["log_end"] for n in (leader, follower)]
            return ends == [sent, sent] and fetch_log(leader, "cut") == fetch_log(follower, "cut")

        wait_until(same, timeout=30, what="the follower's log the leader's, byte for byte")
        assert cluster.state(leader)["streams_served"] == 1  # the cut one ended on both sides
    finally:
        for p in proxies.values():
            p.stop()


def test_http_replication_and_members_of_both_modes(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    """--cluster-replication=http keeps a node's fetches on HTTP; members of both modes
    replicate from each other (every leader serves both)."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    modes = ("http", "http", "stream")
    for mode in modes:
        cluster.add_node([f"--cluster-replication={mode}"])
    wait_until(lambda: len(cluster.stats()["nodes"]) == 3, what="three nodes registered")
    cluster.create_topic("mixed", partitions=3, replicas=3)
    for p in range(3):
        leader = cluster.leader("mixed", p)
        for i in range(10):
            assert http("POST", f"http://{leader.http_address}/pub?topic=mixed&partition={p}",
                        b"m%d" % i)[0] == 200
    for n, mode in zip(cluster.nodes, modes, strict=True):
        assert cluster.state(n)["replication"] == mode
    # the stream node opens one stream to each other node leading a partition
    leaders = {cluster.node_id(cluster.leader("mixed", p)) for p in range(3)}
    served = sum(cluster.state(n)["streams_served"] for n in cluster.nodes)
    assert served == len(leaders - {cluster.node_id(cluster.nodes[2])}), (served, leaders)
    wait_until(lambda: all(part["log_end"] == 10 for n in cluster.nodes
                           for part in cluster.state(n)["partitions"]),
               what="every replica of every partition has its 10 messages")
