"""Route-managed ordered topics in a cluster (nsqx.cluster.route_coord, route_store, the
member's seal and barrier passes): created and changed through nsqlookupd, stored in etcd,
sealed by the retired partitions' leaders, learnt by every node from its watch."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from typing import TYPE_CHECKING

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.protocol import v2
from nsqx.protocol.routes import RouteHistory
from tests.support.cluster import Cluster, http, wait_until
from tests.support.rawclient import RawClient

if TYPE_CHECKING:
    from nsqx.client import Producer

pytestmark = [pytest.mark.slow]


def lk(cluster: Cluster, method: str, path: str, **params: object) -> tuple[int, dict]:
    q = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    return http(method, f"http://{cluster.lookupd.http_address}{path}?{q}", timeout=60)


def node_route(n, topic: str) -> dict:  # type: ignore[no-untyped-def]
    code, body = http("GET", f"http://{n.http_address}/topic/route?topic={topic}")
    assert code == 200, body
    return body


def node_route_soon(n, topic: str) -> dict:  # type: ignore[no-untyped-def]
    """:func:`node_route` for a wait: ``{}`` ("not yet") while the node holds the topic but
    its member has not yet given it the routes from etcd (a node just started, or just given
    a replica of the topic, answers ``TOPIC_NOT_ROUTE_MANAGED`` until then; CI saw it)."""
    code, body = http("GET", f"http://{n.http_address}/topic/route?topic={topic}")
    if code == 400 and body.get("message") == "TOPIC_NOT_ROUTE_MANAGED":
        return {}
    assert code == 200, body
    return body


def test_lookupd_route_api_changes_and_refusals(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                               lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    code, body = lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
                    orderedmulti="true", logical=64)
    assert code == 200, body
    assert [r[:3] for r in body["route"]["versions"][0]["routes"]] == [[0, 32, 0], [32, 64, 1]]
    # the same shape again is a no-op; another is refused
    assert lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
              logical=64)[0] == 200
    code, body = lk(cluster, "POST", "/topic/create", topic="r", partition_num=2, replicator=2,
                    logical=32)
    assert code == 400 and "already exists" in body["detail"], body
    wait_until(lambda: all(cluster.role_of(cluster.node_by_id(p["leader"]), "r", p["partition"])
                           == "leader" for p in cluster.partitions("r")), what="leaders")
    code, h = lk(cluster, "GET", "/topic/route", topic="r")
    assert code == 200 and set(h["leaders"]) == {"0", "1"}, h
    RouteHistory.from_json(json.dumps(h))  # nsqd's shape, plus leaders
    # bad input: 400 with the rule's text
    for path, params, text in [
        ("/topic/split", {"partition": 0, "at": 32}, "boundary must be strictly inside"),
        ("/topic/split", {"partition": 0}, "MISSING_ARG_AT"),
        ("/topic/merge", {"a": 0, "b": 0}, "cannot merge partition 0 with itself"),
        ("/topic/move", {"partition": 0, "node": "nowhere:1:2"}, "is not a live node"),
        ("/topic/split", {"partition": 9, "at": 3}, "(unknown)"),
    ]:
        code, body = lk(cluster, "POST", path, topic="r", **params)
        assert code == 400 and text in body["message"], (path, params, body)
    code, body = lk(cluster, "POST", "/topic/split", topic="nope", partition=0, at=3)
    assert code == 400 and "not a route-managed topic" in body["message"], body
    # a cluster node refuses to change the route itself
    n0 = cluster.nodes[0]
    code, body = http("POST", f"http://{n0.http_address}/topic/split?topic=r&partition=0&at=8")
    assert code == 400 and "through nsqlookupd" in body["message"], body

    old_leader = cluster.node_by_id(cluster.partitions("r")[0]["leader"])
    # split 0 -> 2, 3 (on 0's leader); merge non-adjacent 2 + 1 refused; merge 3 + 1 -> 4;
    # move 4 to a node that is not its leader -> 5
    code, body = lk(cluster, "POST", "/topic/split", topic="r", partition=0, at=16)
    assert code == 200, body
    assert [x[:3] for x in body["versions"][1]["routes"]] == [[0, 16, 2], [16, 32, 3], [32, 64, 1]]
    assert body["pending"] is None
    with RawClient(old_leader.tcp_address) as c:  # the sealed partition refuses, naming v1
        c.send(b"PUB r 0 1\n" + (1).to_bytes(4, "big") + b"x")
        assert "route version 1 " in c.expect_error("E_BAD_PARTITION")
    code, body = lk(cluster, "POST", "/topic/merge", topic="r", a=2, b=1)
    assert code == 400 and "not adjacent" in body["message"], body
    code, body = lk(cluster, "POST", "/topic/merge", topic="r", a=3, b=1)
    assert code == 200, body
    leader4 = next(p for p in cluster.partitions("r") if p["partition"] == 4)["leader"]
    target = next(n for n in (cluster.node_id(x) for x in cluster.nodes) if n != leader4)
    tcp = cluster.node_by_id(target).tcp_address  # a node may be named by its TCP address
    code, body = lk(cluster, "POST", "/topic/move", topic="r", partition=4, node=tcp)
    assert code == 200, body
    assert [x[2:] for x in body["versions"][3]["routes"]] == [[2, body["versions"][1]["routes"][0][3]],
                                                              [5, target]]
    # every node learnt version 3 through its member's watch
    for n in cluster.nodes:
        wait_until(lambda n=n: len(node_route_soon(n, "r").get("versions", ())) == 4,
                   what="v3 on nodes")
    parts = {p["partition"]: p for p in cluster.partitions("r")}
    assert set(parts) == {0, 1, 2, 3, 4, 5} and parts[5]["leader"] == target
    # a keyed publish with the new version lands on the new partition's leader
    with RawClient(cluster.node_by_id(target).tcp_address) as c:
        c.send(b"PUB r 5 3\n" + (1).to_bytes(4, "big") + b"y")
        c.expect_ok()
    with RawClient(cluster.node_by_id(parts[4]["leader"]).tcp_address) as c:
        c.send(v2.pub("r", b"z", partition=4))
        assert "route version 3 " in c.expect_error("E_BAD_PARTITION")


def keyed_publishes(producers: list[Producer], keys: int, per_key: int,
                    acked: set[tuple[str, int]], pause: float) -> list:
    """One coroutine per key publishing ``k<key>:<seq>`` to topic "orders" with that key
    (keys dealt over the producers), recording each acknowledged (key, seq) in ``acked``."""
    async def one(p: Producer, k: int) -> None:
        for s in range(per_key):
            await p.publish("orders", f"k{k}:{s}".encode(), key=f"k{k}")
            acked.add((f"k{k}", s))
            await asyncio.sleep(pause + (k % 5) * 0.01)

    return [one(producers[k % len(producers)], k) for k in range(keys)]


class OrderedReaders:
    """One channel read with ``SUB_ORDERED`` on every partition's leader (found through
    lookupd, polled, so partitions a change creates are read too). Each message is recorded
    (in arrival order: one event loop) and finished after ``delay`` seconds, so the old
    partitions have a backlog when a change opens new ones."""

    def __init__(self, lookupd_http: str, topic: str, channel: str, delay: float) -> None:
        self.lookupd_http, self.topic, self.channel, self.delay = (lookupd_http, topic,
                                                                   channel, delay)
        self.seen: dict[str, list[int]] = {}
        self.count = 0
        self._subs: dict[int, object] = {}
        self.errors: list[str] = []

    async def run(self) -> None:
        from nsqx.client.conn import Connection, make_config

        config = make_config(None, {"msg_timeout": 2.0})  # a restart's in-flight one: soon again

        while True:
            code, body = await asyncio.to_thread(
                http, "GET", f"http://{self.lookupd_http}/lookup?topic={self.topic}")
            for p, peer in (body.get("partitions") or {}).items() if code == 200 else ():
                addr = f"127.0.0.1:{peer['tcp_port']}"
                old = self._subs.get(int(p))
                if old is not None and old.is_open and old.address == addr:  # type: ignore[attr-defined]
                    continue
                if old is not None:  # its leader died or moved: read the new one
                    old.close()  # type: ignore[attr-defined]
                conn = Connection(addr, config, on_message=self._on,
                                  make_message=lambda c, ts, att, mid, b: (mid, b))
                try:
                    await conn.connect()
                    await conn.command(v2.sub_ordered(self.topic, self.channel, int(p)))
                except Exception as e:  # retried at the next poll
                    self.errors.append(f"{p}: {e!r}")
                    conn.close()
                    continue
                conn.send(v2.rdy(1))
                self._subs[int(p)] = conn
            await asyncio.sleep(0.2)

    def _on(self, conn, msg) -> None:  # type: ignore[no-untyped-def]
        mid, body = msg
        k, s = body.decode().split(":")
        self.seen.setdefault(k, []).append(int(s))
        self.count += 1
        asyncio.get_running_loop().call_later(self.delay, self._fin, conn, mid)

    @staticmethod
    def _fin(conn, mid: bytes) -> None:  # type: ignore[no-untyped-def]
        if conn.is_open:  # a restarted reader's old connection: redelivered instead
            conn.send(v2.fin(mid))

    def close(self) -> None:
        """Close every connection; a running :meth:`run` subscribes again (a restart)."""
        subs, self._subs = self._subs, {}
        for conn in subs.values():
            conn.close()  # type: ignore[attr-defined]


def test_keyed_order_across_split_merge_move_on_three_nodes(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """Keyed producers (nsqx.client, routes and leaders from lookupd) publish numbered
    messages while a split, a merge of partitions led by two different nodes and a move to
    another node run through lookupd; two channels read every partition's leader with
    SUB_ORDERED (b's readers restarted half way), a third with nsqx's Consumer through
    lookupd (plain SUB on every leader). Per channel and key: every acknowledged message consumed, in order, none
    before an earlier one - the cross-node barrier holds the new partitions until the
    retired ones' command messages were consumed on their own nodes."""
    from nsqx.client import Producer

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    lookupd = cluster.lookupd.http_address
    code, body = lk(cluster, "POST", "/topic/create", topic="orders", partition_num=2,
                    replicator=2, logical=64)
    assert code == 200, body
    wait_until(lambda: all(cluster.role_of(cluster.node_by_id(p["leader"]), "orders",
                                           p["partition"]) == "leader"
                           for p in cluster.partitions("orders")), what="leaders")
    keys, per_key = 40, 40

    async def main() -> tuple[dict[str, OrderedReaders], set[tuple[str, int]], int, list]:
        from nsqx.client import Consumer

        readers = {c: OrderedReaders(lookupd, "orders", c, 0.003) for c in ("a", "b")}
        tasks = [asyncio.create_task(r.run()) for r in readers.values()]
        # channel c: a stock-style nsqx Consumer through lookupd (plain SUB on every leader,
        # which then reads every partition that node leads, new ones included)
        plain = readers["c"] = OrderedReaders(lookupd, "orders", "c", 0)

        async def handle(m) -> None:  # type: ignore[no-untyped-def]
            k, s = m.body.decode().split(":")
            plain.seen.setdefault(k, []).append(int(s))
            plain.count += 1
            await asyncio.sleep(0.003)

        consumer = Consumer("orders", "c", handle, lookupd_http_addresses=lookupd,
                            max_in_flight=50, msg_timeout=2.0, lookupd_poll_interval=0.5,
                            lookupd_poll_jitter=0.1)
        await consumer.start()
        await asyncio.sleep(0.5)  # subscribed on both leaders before anything is published
        acked: set[tuple[str, int]] = set()
        producers = [Producer(cluster.nodes[i].tcp_address, nsqd_http_addresses=lookupd)
                     for i in range(2)]

        changes: list = []

        async def restart_b() -> None:
            await asyncio.sleep(1.3)  # after the merge, before the move
            readers["b"].close()

        async def operate() -> None:
            parts = {p["partition"]: p for p in cluster.partitions("orders")}
            assert parts[0]["leader"] != parts[1]["leader"]  # place() spreads leaders
            other = next(cluster.node_id(n) for n in cluster.nodes
                         if cluster.node_id(n) not in (parts[0]["leader"], parts[1]["leader"]))
            # split 0 -> 2, 3 (on 0's node); merge 3 + 1 (two nodes) -> 4; move 2 -> 5
            for path, params in [("/topic/split", {"partition": 0, "at": 16}),
                                 ("/topic/merge", {"a": 3, "b": 1}),
                                 ("/topic/move", {"partition": 2, "node": other})]:
                await asyncio.sleep(0.5)
                t = time.monotonic()
                code, body = await asyncio.to_thread(lk, cluster, "POST", path,
                                                     topic="orders", **params)
                assert code == 200, (path, body)
                changes.append((path, round(time.monotonic() - t, 3)))

        await asyncio.gather(operate(), restart_b(),
                             *keyed_publishes(producers, keys, per_key, acked, 0.03))
        retries = sum(p.route_retries for p in producers)
        for p in producers:
            await p.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                r.count >= len(acked) and set(r.seen) >= {k for k, _ in acked}
                for r in readers.values()):
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # anything delivered out of place would show up now
        for t in tasks:
            t.cancel()
        for r in readers.values():
            r.close()
        await consumer.close()
        return readers, acked, retries, changes

    readers, acked, retries, changes = asyncio.run(main())
    assert len(acked) == keys * per_key
    for chan, r in readers.items():
        got = {(k, s) for k, ss in r.seen.items() for s in ss}
        assert got >= acked, (f"channel {chan}: missing {sorted(acked - got)[:10]}; "
                              f"subscribe errors {r.errors[-3:]}")
        for k, ss in r.seen.items():
            prev = -1
            for s in ss:  # in order, no gap; a redelivery repeats the previous one only
                assert s in (prev, prev + 1), f"channel {chan} key {k}: {ss}"
                prev = s
    h = lk(cluster, "GET", "/topic/route", topic="orders")[1]
    assert len(h["versions"]) == 4 and h["pending"] is None
    assert 0 < retries <= keys * 3, retries  # at most one retry per key and change
    print("changes (path, seconds):", changes, "retries:", retries)


def test_cli_route_changes_through_lookupd(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                           lookupd_factory) -> None:
    """`nsqx topic create --logical`, `routes`, `split`, `merge` and `move --route` with
    --lookupd-http-address; a refusal prints the coordinator's reason and exits 1."""
    import subprocess
    import sys

    def nsqx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", *args,
                               f"--lookupd-http-address={cluster.lookupd.http_address}"],
                              capture_output=True, text=True, timeout=60)

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    out = nsqx("topic", "create", "keyed", "--partitions", "1", "--replicas", "1",
               "--logical", "64")
    assert out.returncode == 0, out.stderr
    assert "topic keyed: 1 partition, ordered over 64 logical partitions" in out.stdout
    wait_until(lambda: cluster.role_of(cluster.leader("keyed", 0), "keyed", 0) == "leader",
               what="leader")
    out = nsqx("topic", "split", "keyed", "0", "--at", "64")
    assert out.returncode == 1 and "nsqlookupd answered 400" in out.stderr
    assert "the boundary must be strictly inside" in out.stderr
    out = nsqx("topic", "split", "keyed", "0", "--at", "32")
    assert out.returncode == 0, out.stderr
    assert "0-31 -> 1 @ " in out.stdout and "32-63 -> 2 @ " in out.stdout, out.stdout
    out = nsqx("topic", "merge", "keyed", "1", "2")
    assert out.returncode == 0 and "0-63 -> 3 @ " in out.stdout, out.stderr
    leader = cluster.partitions("keyed")[3]["leader"]
    other = next(cluster.node_id(n) for n in cluster.nodes if cluster.node_id(n) != leader)
    out = nsqx("topic", "move", "keyed", "3", "--to", other)
    assert out.returncode == 2 and "--route" in out.stderr
    out = nsqx("topic", "move", "keyed", "3", "--route", "--to", other)
    assert out.returncode == 0 and f"0-63 -> 4 @ {other}" in out.stdout, out.stderr
    out = nsqx("topic", "routes", "keyed", "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert len(body["versions"]) == 4 and body["leaders"]["4"] == \
        cluster.node_by_id(other).tcp_address


def test_a_pending_change_refuses_others_and_a_new_coordinator_rolls_it_forward(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """A coordinator that stored a change as pending and died before committing it: the
    retired partition already refuses publishes (the nodes saw the pending history), another
    change is refused with the rule's text, and the next coordinator commits it."""
    from nsqx.cluster.etcd import EtcdClient
    from nsqx.cluster.metadata import ClusterMetadata
    from nsqx.cluster.route_coord import RouteCoordinator
    from tests.client.helpers import run

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    assert lk(cluster, "POST", "/topic/create", topic="t", partition_num=1, replicator=2,
              logical=16)[0] == 200
    wait_until(lambda: cluster.role_of(cluster.leader("t", 0), "t", 0) == "leader",
               what="leader")
    leader = cluster.leader("t", 0)

    async def propose_only() -> None:  # the first half of RouteCoordinator.change
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            await RouteCoordinator(ClusterMetadata(etcd, "test")).propose(
                "t", lambda h: h.split(0, 8))

    run(propose_only())
    code, body = lk(cluster, "POST", "/topic/merge", topic="t", a=1, b=2)
    assert code == 400 and "still pending; one change at a time" in body["message"], body

    def refused() -> bool:
        with RawClient(leader.tcp_address) as c:
            c.send(b"PUB t 0 0\n" + (1).to_bytes(4, "big") + b"x")
            return "route version 1 " in c.expect_error("E_BAD_PARTITION")
    wait_until(refused, what="partition 0 closed by the pending change")
    cluster.lookupd.restart()  # a new coordinator: it finds the change and finishes it
    wait_until(lambda: (lambda b: b["pending"] is None and len(b["versions"]) == 2)(
        lk(cluster, "GET", "/topic/route", topic="t")[1]), what="the change rolled forward")
    assert lk(cluster, "POST", "/topic/merge", topic="t", a=1, b=2)[0] == 200


def first_deliveries_in_order(seen: dict[str, list[int]]) -> None:
    """After a failover a new leader redelivers what its mirrored cursor had not confirmed
    (and a producer's retry may store a message twice), so a key's numbers may come again;
    its *first* deliveries must still be 0, 1, 2, ... in order."""
    for k, ss in seen.items():
        firsts: list[int] = []
        for s in ss:
            if s not in firsts:
                firsts.append(s)
        assert firsts == list(range(len(firsts))), f"key {k}: {ss}"


def test_keyed_order_with_a_node_kill_during_a_split(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                    lookupd_factory) -> None:
    """The leader of the partition being split is killed (SIGKILL) just before the split is
    requested: the coordinator seals it on its new leader, the new partitions (placed on
    the dead node while its lease lasts) get new leaders, producers follow the leaders;
    every acknowledged message is consumed and each key's first deliveries stay in order."""
    from nsqx.client import Producer

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    lookupd = cluster.lookupd.http_address
    assert lk(cluster, "POST", "/topic/create", topic="orders", partition_num=2, replicator=3,
              logical=64)[0] == 200
    wait_until(lambda: all(cluster.role_of(cluster.node_by_id(p["leader"]), "orders",
                                           p["partition"]) == "leader"
                           for p in cluster.partitions("orders")), what="leaders")
    victim = cluster.leader("orders", 0)
    survivor = next(n for n in cluster.nodes if n is not victim)
    keys, per_key = 30, 40

    async def main() -> tuple[OrderedReaders, set[tuple[str, int]], dict]:
        reader = OrderedReaders(lookupd, "orders", "a", 0.003)
        task = asyncio.create_task(reader.run())
        await asyncio.sleep(0.5)
        acked: set[tuple[str, int]] = set()
        producers = [Producer(survivor.tcp_address, nsqd_http_addresses=lookupd)
                     for _ in range(2)]

        out: dict = {}

        async def kill_and_split() -> None:
            await asyncio.sleep(0.6)
            victim.kill()
            t = time.monotonic()
            code, body = await asyncio.to_thread(lk, cluster, "POST", "/topic/split",
                                                 topic="orders", partition=0, at=16)
            out["split"] = (code, round(time.monotonic() - t, 2), body.get("message"))

        await asyncio.gather(kill_and_split(),
                             *keyed_publishes(producers, keys, per_key, acked, 0.03))
        out["leader_retries"] = sum(p.leader_retries for p in producers)
        for p in producers:
            await p.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not {
                (k, s) for k, ss in reader.seen.items() for s in ss} >= acked:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        task.cancel()
        reader.close()
        return reader, acked, out

    reader, acked, out = asyncio.run(main())
    print("kill during split:", out)
    assert out["split"][0] == 200, out
    assert len(acked) == keys * per_key
    got = {(k, s) for k, ss in reader.seen.items() for s in ss}
    assert got >= acked, f"missing {sorted(acked - got)[:10]}; errors {reader.errors[-3:]}"
    first_deliveries_in_order(reader.seen)
    h = lk(cluster, "GET", "/topic/route", topic="orders")[1]
    assert len(h["versions"]) == 2 and h["pending"] is None
