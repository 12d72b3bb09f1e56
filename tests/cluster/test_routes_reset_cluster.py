"""A channel of a route-managed ordered topic reset across the cluster through nsqlookupd
(``POST /channel/setoffset`` there, ``nsqx channel reset --lookupd-http-address``): the
coordinator holds the channel on every node, clears its barrier pass keys of the versions it
walks again in one etcd transaction with the reset record, moves every partition's cursor
on its leader and lets it deliver again (nsqx.cluster.route_coord.reset_channel)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_routes_cluster import OrderedReaders, keyed_publishes, lk
from tests.support.cluster import Cluster, http, wait_until

pytestmark = [pytest.mark.slow]


def reset(cluster: Cluster, topic: str, channel: str, body: bytes, **extra: object
          ) -> tuple[int, dict]:
    q = "&".join(f"{k}={v}" for k, v in {"topic": topic, "channel": channel, **extra}.items())
    return http("POST", f"http://{cluster.lookupd.http_address}/channel/setoffset?{q}", body,
                timeout=60)


def etcd_keys(etcd_server: EtcdServer, prefix: str) -> dict[str, bytes]:
    from nsqx.cluster.etcd import EtcdClient
    from tests.client.helpers import run

    async def get() -> dict[str, bytes]:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            kvs, _ = await etcd.get_prefix(f"/nsqx/test/{prefix}".encode())
            return {kv.key.decode(): kv.value for kv in kvs}
    return run(get())


def in_key_order(seen: dict[str, list[int]], what: str) -> None:
    for k, ss in seen.items():
        prev = -1
        for s in ss:  # in order, no gap; a redelivery repeats the previous one only
            assert s in (prev, prev + 1), f"{what} key {k}: {ss}"
            prev = s


def start_ordered_topic(cluster: Cluster, topic: str) -> None:
    code, body = lk(cluster, "POST", "/topic/create", topic=topic, partition_num=2,
                    replicator=2, logical=64)
    assert code == 200, body
    wait_until(lambda: all(cluster.role_of(cluster.node_by_id(p["leader"]), topic,
                                           p["partition"]) == "leader"
                           for p in cluster.partitions(topic)), what="leaders")


def test_reset_to_earliest_walks_the_versions_again_across_nodes(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """Keyed publishes across a split and a cross-node merge, channel a (SUB_ORDERED on
    every leader) drained to the end; then reset to earliest through lookupd: every acked
    message is delivered again, each key in sequence order - the retired partitions' pass
    keys were cleared, so the new partitions wait for their command messages again. (With
    the pass keys left in etcd the new partitions open at once and keys come out of order.)
    Then a reset to the latest position through the CLI delivers nothing old."""
    from nsqx.client import Producer

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    lookupd = cluster.lookupd.http_address
    start_ordered_topic(cluster, "orders")
    keys, per_key = 24, 24

    async def main() -> dict:
        reader = OrderedReaders(lookupd, "orders", "a", 0.003)
        task = asyncio.create_task(reader.run())
        await asyncio.sleep(0.5)
        acked: set[tuple[str, int]] = set()
        producers = [Producer(cluster.nodes[i].tcp_address, nsqd_http_addresses=lookupd)
                     for i in range(2)]

        async def operate() -> None:
            for path, params in [("/topic/split", {"partition": 0, "at": 16}),
                                 ("/topic/merge", {"a": 3, "b": 1})]:
                await asyncio.sleep(0.5)
                code, body = await asyncio.to_thread(lk, cluster, "POST", path,
                                                     topic="orders", **params)
                assert code == 200, (path, body)

        await asyncio.gather(operate(), *keyed_publishes(producers, keys, per_key, acked, 0.02))
        for p in producers:
            await p.close()

        async def drained(r: OrderedReaders) -> bool:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if {(k, s) for k, ss in r.seen.items() for s in ss} >= acked:
                    return True
                await asyncio.sleep(0.1)
            return False

        assert await drained(reader), "first pass not drained"
        await asyncio.sleep(0.5)  # every FIN in, every barrier pass recorded
        first = reader.seen
        passes_before = await asyncio.to_thread(etcd_keys, etcd_server, "route_passed/orders/a/")
        reader.seen, reader.count = {}, 0
        t = time.monotonic()
        code, body = await asyncio.to_thread(reset, cluster, "orders", "a", b"earliest")
        took = time.monotonic() - t
        assert code == 200, body
        passes_after = await asyncio.to_thread(etcd_keys, etcd_server, "route_passed/orders/a/")
        ok = await drained(reader)
        await asyncio.sleep(0.5)  # anything delivered out of place would show up now
        again = reader.seen
        got = {(k, s) for k, ss in again.items() for s in ss}
        assert ok, f"not delivered again after the reset: {sorted(acked - got)[:10]}"
        in_key_order(again, "after the reset")
        passes_again = await asyncio.to_thread(etcd_keys, etcd_server, "route_passed/orders/a/")
        # a second round published after time T while partition 2 splits; then a reset to
        # T: version 2 (the merge committed before T), partition 2 walked again from its
        # first message at/after T (its command is after T), 5 and 6 (created after T) from
        # their start, 0, 1 and 3 passed (their commands are before T): exactly the second
        # round again, in key order
        await asyncio.sleep(1.05 - time.time() % 1)
        t_reset = int(time.time())
        second: set[tuple[str, int]] = set()
        producers = [Producer(cluster.nodes[i].tcp_address, nsqd_http_addresses=lookupd)
                     for i in range(2)]

        async def publish_more(p: Producer, k: int) -> None:
            for s in range(per_key, per_key + 8):
                await p.publish("orders", f"k{k}:{s}".encode(), key=f"k{k}")
                second.add((f"k{k}", s))
                await asyncio.sleep(0.03)

        async def split_again() -> None:
            await asyncio.sleep(0.1)
            code, body = await asyncio.to_thread(lk, cluster, "POST", "/topic/split",
                                                 topic="orders", partition=2, at=8)
            assert code == 200, body

        await asyncio.gather(split_again(), *(publish_more(producers[k % 2], k)
                                              for k in range(keys)))
        for p in producers:
            await p.close()
        acked |= second
        assert await drained(reader), "second round not drained"
        await asyncio.sleep(0.5)
        reader.seen, reader.count = {}, 0
        code, at_body = await asyncio.to_thread(reset, cluster, "orders", "a",
                                                f"timestamp:{t_reset}".encode())
        assert code == 200, at_body
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not {
                (k, s) for k, ss in reader.seen.items() for s in ss} >= second:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        at_t = reader.seen
        # latest (the CLI): nothing old comes again
        reader.seen, reader.count = {}, 0
        out = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "nsqx.cli.nsqx_cmd", "channel", "reset",
                             "orders", "a", "--latest", f"--lookupd-http-address={lookupd}"],
            capture_output=True, text=True, timeout=60)
        await asyncio.sleep(1.0)
        after_latest = reader.count
        task.cancel()
        reader.close()
        return {"acked": acked, "first": first, "again": again, "ok": ok, "body": body,
                "took": took, "passes_before": passes_before, "passes_after": passes_after,
                "passes_again": passes_again, "cli": out, "after_latest": after_latest, "second": second, "at_t": at_t,
                "at_body": at_body}

    r = asyncio.run(main())
    acked = {(k, s) for k, s in r["acked"] if s < per_key}
    assert len(acked) == keys * per_key
    in_key_order(r["first"], "first pass")
    body = r["body"]
    print("reset:", {k: body[k] for k in ("route_version", "gen", "partitions", "passed")},
          f"{r['took']:.2f} s")
    assert body["route_version"] == 0 and body["passed"] == [] and body["unapplied"] == [], body
    assert set(body["partitions"]) == {"0", "1", "2", "3", "4"}
    assert all(off == 0 for off in body["partitions"].values()), body
    # the retired partitions 0, 1 and 3 had their passes recorded; the reset cleared them
    assert {k.rsplit("/", 1)[1] for k in r["passes_before"]} == {"0", "1", "3"}, r["passes_before"]
    got = {(k, s) for k, ss in r["again"].items() for s in ss}
    assert r["ok"] and got >= acked, f"not delivered again: {sorted(acked - got)[:10]}"
    in_key_order(r["again"], "after the reset")
    # ...and walking them again recorded the passes again
    assert {k.rsplit("/", 1)[1] for k in r["passes_again"]} == {"0", "1", "3"}
    at_body, second = r["at_body"], r["second"]
    print("reset to a time:", {k: at_body[k] for k in ("route_version", "partitions", "passed")})
    assert at_body["route_version"] == 2 and at_body["passed"] == [0, 1, 3], at_body
    assert at_body["partitions"]["5"] == 0 and at_body["partitions"]["6"] == 0, at_body
    assert at_body["partitions"]["2"] > 0, at_body  # after the first round's messages
    got = {(k, s) for k, ss in r["at_t"].items() for s in ss}
    assert got == second, (f"missing {sorted(second - got)[:10]}, "
                           f"extra {sorted(got - second)[:10]}")
    in_key_order({k: [s - per_key for s in ss] for k, ss in r["at_t"].items()}, "from T")
    cli = r["cli"]
    assert cli.returncode == 0, cli.stderr
    assert "walking route versions again from version 3" in cli.stdout, cli.stdout
    assert r["after_latest"] == 0


def test_cluster_reset_refusals_change_nothing(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """Bad input is a 400/404 with the reason (unknown topic or channel, a per-partition
    offset, a time in the future, no position, a route change pending), an nsqd refuses the
    reset itself and names lookupd, and etcd unreachable is a 503; none changes anything: no
    reset record, the pass keys as they were, and the channel still delivers."""
    from nsqx.client import Producer
    from nsqx.cluster.etcd import EtcdClient
    from nsqx.cluster.metadata import ClusterMetadata
    from nsqx.cluster.route_coord import RouteCoordinator
    from tests.client.helpers import run

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    start_ordered_topic(cluster, "t")
    assert lk(cluster, "POST", "/topic/split", topic="t", partition=0, at=16)[0] == 200

    async def consume(n: int, round_: int) -> OrderedReaders:
        lookupd = cluster.lookupd.http_address  # a restarted lookupd has new ports
        reader = OrderedReaders(lookupd, "t", "a", 0)
        task = asyncio.create_task(reader.run())
        await asyncio.sleep(0.7)
        async with Producer(cluster.nodes[0].tcp_address, nsqd_http_addresses=lookupd) as p:
            for i in range(n):
                await p.publish("t", f"k{i}:{round_}".encode(), key=f"k{i}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(delivered(reader)) < n:
            await asyncio.sleep(0.1)
        task.cancel()
        reader.close()
        return reader

    def delivered(reader: OrderedReaders) -> set[str]:  # a redelivery may repeat one
        return {f"{k}:{s}" for k, ss in reader.seen.items() for s in ss}

    assert delivered(run(consume(10, 0))) == {f"k{i}:0" for i in range(10)}
    passes = etcd_keys(etcd_server, "route_passed/t/a/")
    assert set(passes) == {"/nsqx/test/route_passed/t/a/0"}
    now = int(time.time())
    for params, body, status, code in [
        ({"topic": "nope", "channel": "a"}, b"earliest", 404, "TOPIC_NOT_FOUND"),
        ({"topic": "t", "channel": "zz"}, b"earliest", 404, "CHANNEL_NOT_FOUND"),
        ({"topic": "t", "channel": "a"}, b"offset:3", 400, "E_INVALID"),
        ({"topic": "t", "channel": "a"}, f"timestamp:{now + 3600}".encode(), 400, "E_INVALID"),
        ({"topic": "t", "channel": "a"}, b"", 400, "MISSING_POSITION"),
        ({"topic": "t", "channel": "a"}, b"sometime", 400, "E_INVALID"),
        ({"topic": "t", "channel": "a", "partition": "1"}, b"earliest", 400, "E_BAD_PARTITION"),
    ]:
        got, answer = reset(cluster, params.pop("topic"), params.pop("channel"), body, **params)
        assert (got, answer["message"]) == (status, code), (body, answer)
    # an nsqd refuses a cluster reset itself and says where it goes
    n0 = cluster.nodes[0]
    code, answer = http("POST", f"http://{n0.http_address}/channel/setoffset?topic=t&channel=a",
                        b"earliest")
    assert code == 400 and "through nsqlookupd" in answer["message"], answer

    async def propose_only() -> None:  # a change left pending (its coordinator "died")
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            await RouteCoordinator(ClusterMetadata(etcd, "test")).propose(
                "t", lambda h: h.split(1, 40))

    run(propose_only())
    code, answer = reset(cluster, "t", "a", b"earliest")
    assert code == 400 and answer["message"] == "E_ROUTE_CHANGE_PENDING", answer
    assert "still pending" in answer["detail"]
    assert etcd_keys(etcd_server, "route_reset/") == {}
    assert etcd_keys(etcd_server, "route_passed/t/a/") == passes
    # nothing held: the channel delivers what is published next (partitions 2 and 3 are
    # open; partition 1 refuses publishes while the change is pending)
    cluster.lookupd.restart()  # the next coordinator rolls the pending change forward
    wait_until(lambda: lk(cluster, "GET", "/topic/route", topic="t")[1]["pending"] is None,
               what="the change rolled forward")
    # (the first reader's last message may come again: it closed before its FIN went out)
    assert delivered(run(consume(10, 1))) >= {f"k{i}:1" for i in range(10)}
    # etcd unreachable: 503, nothing done
    etcd_server.stop()
    code, answer = reset(cluster, "t", "a", b"earliest")
    assert code == 503, answer
    assert answer["message"] in ("E_CLUSTER_UNAVAILABLE", "E_NO_COORDINATOR"), answer


def test_cluster_reset_refuses_a_position_retention_deleted(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:
    """Small segments and the default retention (consumed segments go): once channel a has
    passed the split's command message, the retired partition's consumed segments are
    deleted, so a reset to earliest - which would walk that partition again - is refused
    with E_RETENTION and changes nothing; a reset to latest still works."""
    from nsqx.client import Producer
    from tests.client.helpers import run

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=2, nsqd_args=["--max-bytes-per-file=4096"])
    start_ordered_topic(cluster, "t")
    lookupd = cluster.lookupd.http_address
    n = 200

    async def main() -> int:
        reader = OrderedReaders(lookupd, "t", "a", 0)
        task = asyncio.create_task(reader.run())
        await asyncio.sleep(0.7)
        async with Producer(cluster.nodes[0].tcp_address, nsqd_http_addresses=lookupd) as p:
            for i in range(n):
                await p.publish("t", f"k{i % 7}:{i // 7}".encode() + b" " * 100,
                                key=f"k{i % 7}")
        code, body = await asyncio.to_thread(lk, cluster, "POST", "/topic/split", topic="t",
                                             partition=0, at=16)
        assert code == 200, body
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and reader.count < n:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # partition 0's command passed: its consumed segments go
        task.cancel()
        reader.close()
        return reader.count

    assert run(main()) >= n
    passes = etcd_keys(etcd_server, "route_passed/t/a/")
    assert set(passes) == {"/nsqx/test/route_passed/t/a/0"}
    code, answer = reset(cluster, "t", "a", b"earliest")
    assert code == 400 and answer["message"] == "E_RETENTION", answer
    assert "partition 0 keeps offsets" in answer["detail"], answer
    assert etcd_keys(etcd_server, "route_reset/") == {}
    assert etcd_keys(etcd_server, "route_passed/t/a/") == passes
    code, answer = reset(cluster, "t", "a", b"latest")
    assert code == 200 and answer["route_version"] == 1, answer


def test_a_node_restarted_between_hold_and_apply_applies_the_reset_at_start(  # type: ignore[no-untyped-def]
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory, monkeypatch) -> None:
    """A coordinator holds channel a on both nodes, commits a reset to earliest (route
    version 0), and node 1 is SIGKILLed before the apply reaches it; the coordinator gives
    up on it (its retry window shortened here). Node 1 comes back after that: it was held
    when it stopped (the hold is kept on disk), so it applies the reset record it finds in
    etcd at start: its barrier state for a restarts on version 0 instead of staying on 1."""
    from nsqx.cluster import route_coord
    from nsqx.cluster.etcd import EtcdClient
    from nsqx.cluster.metadata import ClusterMetadata
    from nsqx.protocol.v2 import parse_start_position
    from tests.client.helpers import run

    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=2)
    start_ordered_topic(cluster, "t")
    assert lk(cluster, "POST", "/topic/split", topic="t", partition=0, at=16)[0] == 200

    reader = OrderedReaders(cluster.lookupd.http_address, "t", "a", 0)

    async def subscribe() -> None:  # the channel exists on every partition's leader
        task = asyncio.create_task(reader.run())
        await asyncio.sleep(1.0)
        task.cancel()
        reader.close()

    run(subscribe())
    wait_until(lambda: all(versions_of(n) == 1 for n in cluster.nodes),
               what="channel a on version 1 on both nodes")
    victim = cluster.nodes[1]
    victim_id = cluster.node_id(victim)
    monkeypatch.setattr(route_coord, "STEP_TIMEOUT", 1.0)

    class KillBeforeApply(route_coord.RouteCoordinator):
        async def _reset_apply(self, topic, channel, gen, nodes):  # type: ignore[no-untyped-def]
            await asyncio.to_thread(victim.kill)  # held, then gone before the apply
            return await super()._reset_apply(topic, channel, gen, nodes)

    async def reset_killing() -> dict:
        async with EtcdClient([etcd_server.endpoint]) as etcd:
            coord = KillBeforeApply(ClusterMetadata(etcd, "test"), cluster.signer("coordinator"))
            try:
                return await coord.reset_channel("t", "a", parse_start_position(b"earliest"))
            finally:
                await coord.close()

    body = run(reset_killing())
    assert body["route_version"] == 0 and body["unapplied"] == [victim_id], body
    assert versions_of(cluster.nodes[0]) == 0
    victim.start()
    wait_until(lambda: versions_of(victim) == 0, timeout=20,
               what="the restarted node's channel on the reset's version 0")


def versions_of(n) -> int | None:  # type: ignore[no-untyped-def]
    from tests.cluster.test_routes_cluster import node_route_soon

    return node_route_soon(n, "t").get("channels", {}).get("a", {}).get("version")
