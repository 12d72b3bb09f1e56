"""Route-managed ordered topics on one nsqd (nsqx.nsqd.routing, routes_api): HTTP changes and
their refusals, sealed partitions refusing publishes over TCP and HTTP, the command message
never delivered, channel barrier state, restart and roll-forward of a pending change."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from nsqx.protocol import v2
from nsqx.protocol.routes import RouteError, RouteHistory
from tests.nsqd.inprocess import running_node
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient


def wait_for(pred, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def route(nsqd: NsqdProcess, topic: str) -> dict:
    r = http_api.get(nsqd.http_address, "/topic/route", topic=topic)
    assert r.status == 200, r.body
    return r.json()


def refused(r: http_api.Response) -> str:
    assert r.status == 400, (r.status, r.body)
    return r.json()["message"]


def test_http_changes_and_refusals(nsqd: NsqdProcess) -> None:
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="t", partition_num=2, logical=16).status == 200
    assert http_api.post(a, "/topic/create", topic="t", partition_num=2, logical=16).status == 200
    assert refused(http_api.post(a, "/topic/create", topic="t", logical=32)) == "TOPIC_EXISTS"
    h = route(nsqd, "t")
    assert [r[:3] for r in h["versions"][0]["routes"]] == [[0, 8, 0], [8, 16, 1]]
    assert h["pending"] is None and h["next_partition"] == 2
    # bad boundaries, unknown partitions, missing or malformed arguments
    for at in (0, 8, 20):
        assert "boundary must be strictly inside" in refused(
            http_api.post(a, "/topic/split", topic="t", partition=0, at=at))
    assert "(unknown)" in refused(http_api.post(a, "/topic/split", topic="t", partition=7, at=3))
    assert refused(http_api.post(a, "/topic/split", topic="t", partition=0)) == "MISSING_ARG_AT"
    assert refused(http_api.post(a, "/topic/split", topic="t", partition="x", at=3)) == \
        "INVALID_PARTITION"
    assert "cannot merge partition 1 with itself" in refused(
        http_api.post(a, "/topic/merge", topic="t", a=1, b=1))
    assert "already on" in refused(http_api.post(
        a, "/topic/move", topic="t", partition=1, node=h["versions"][0]["routes"][1][3]))
    assert refused(http_api.post(a, "/topic/move", topic="t", partition=1)) == "MISSING_ARG_NODE"
    # a plain topic and a missing one
    assert http_api.post(a, "/topic/create", topic="plain").status == 200
    assert refused(http_api.post(a, "/topic/split", topic="plain", partition=0, at=1)) == \
        "TOPIC_NOT_ROUTE_MANAGED"
    assert refused(http_api.post(a, "/topic/create", topic="plain", logical=16)) == "TOPIC_EXISTS"
    assert http_api.get(a, "/topic/route", topic="nope").status == 404
    # split 0 -> 2,3; merge of non-adjacent 2 and 1 refused; merge 3+1 -> 4; move 4 -> 5
    r = http_api.post(a, "/topic/split", topic="t", partition=0, at=4)
    assert r.status == 200
    assert [x[:3] for x in r.json()["versions"][1]["routes"]] == [[0, 4, 2], [4, 8, 3], [8, 16, 1]]
    assert "not adjacent" in refused(http_api.post(a, "/topic/merge", topic="t", a=2, b=1))
    assert "retired in version 1" in refused(
        http_api.post(a, "/topic/split", topic="t", partition=0, at=2))
    assert http_api.post(a, "/topic/merge", topic="t", a=3, b=1).status == 200
    assert http_api.post(a, "/topic/move", topic="t", partition=4, node="elsewhere:4150").status \
        == 200
    h = route(nsqd, "t")
    assert len(h["versions"]) == 4 and h["pending"] is None and h["next_partition"] == 6
    assert [x[2] for x in h["versions"][3]["routes"]] == [2, 5]
    assert sorted(h["sealed"]) == ["0", "1", "3", "4"]
    RouteHistory.from_json(json.dumps(h))  # the GET answer is a valid history


def test_sealed_partitions_refuse_publishes(nsqd: NsqdProcess) -> None:
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="t", partition_num=2, logical=16).status == 200
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub("t", b"before", partition=0))
        c.expect_ok()
        c.send(b"PUB t 1 0\n" + (1).to_bytes(4, "big") + b"x")  # with a route version
        c.expect_ok()
        c.send(b"PUB t 1 v\n" + (1).to_bytes(4, "big") + b"x")
        c.expect_error("E_BAD_PARTITION", closed=False)
        assert http_api.post(a, "/topic/split", topic="t", partition=0, at=4).status == 200
        for cmd in (v2.pub("t", b"late", partition=0), v2.mpub("t", [b"a", b"b"], partition=0),
                    b"PUB t 0 1\n" + (1).to_bytes(4, "big") + b"x"):
            c.send(cmd)
            c.expect_error("E_BAD_PARTITION", "route version 1 (partition 0 of topic t takes "
                           "no publishes)", closed=False)
        c.send(v2.pub("t", b"x", partition=9))
        c.expect_error("E_BAD_PARTITION", closed=False)
        c.send(v2.pub("t", b"new", partition=2))
        c.expect_ok()
        c.pub("t", b"keyless")  # no partition: any open one
    r = http_api.pub(a, "t", b"late", partition=0)
    assert refused(r).startswith("E_BAD_PARTITION route version 1 ")
    r = http_api.post(a, "/pub", topic="t", partition="1", route_version="x")
    assert r.status == 400
    counts = {p["partition"]: p["message_count"] for p in next(
        t for t in http_api.stats(a, "t")["topics"] if t["topic_name"] == "t")["partitions"]}
    assert counts[0] == 1 and counts[2] + counts[3] + counts[1] == 3


def test_command_message_never_delivered_and_barrier(nsqd: NsqdProcess) -> None:
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="t", partition_num=1, logical=16).status == 200
    with RawClient(nsqd.tcp_address) as pub, RawClient(nsqd.tcp_address) as sub:
        sub.subscribe("t", "c", rdy=10)  # plain SUB: every partition, one in flight each
        pub.send(v2.pub("t", b"old-1", partition=0))
        pub.expect_ok()
        assert http_api.post(a, "/topic/split", topic="t", partition=0, at=8).status == 200
        pub.send(v2.pub("t", b"new-1", partition=1))
        pub.expect_ok()
        m = sub.read_message()
        assert m.body == b"old-1"
        sub.expect_nothing(0.3)  # new-1 waits behind the barrier until old-1 is finished
        sub.send(v2.fin(m.id))
        m = sub.read_message()
        assert m.body == b"new-1"
        sub.send(v2.fin(m.id))
        sub.expect_nothing(0.3)
    h = route(nsqd, "t")
    assert h["channels"]["c"] == {"version": 1, "passed": [], "readable": [1, 2]}
    # a channel created now starts on the newest version (nothing of partition 0)
    with RawClient(nsqd.tcp_address) as sub:
        sub.subscribe("t", "late", rdy=10)
        sub.expect_nothing(0.3)
    assert route(nsqd, "t")["channels"]["late"]["version"] == 1


def test_restart_keeps_routes_and_channel_state(nsqd: NsqdProcess) -> None:
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="t", partition_num=1, logical=16).status == 200
    with RawClient(nsqd.tcp_address) as pub, RawClient(nsqd.tcp_address) as sub:
        sub.subscribe("t", "c", rdy=10)
        pub.send(v2.pub("t", b"old", partition=0))
        pub.expect_ok()
        assert sub.read_message().body == b"old"  # in flight, not finished
        assert http_api.post(a, "/topic/split", topic="t", partition=0, at=8).status == 200
        pub.send(v2.pub("t", b"new", partition=2))
        pub.expect_ok()
    before = route(nsqd, "t")
    nsqd.kill()
    nsqd.start()
    after = route(nsqd, "t")
    assert after["versions"] == before["versions"] and after["sealed"] == before["sealed"]
    assert after["channels"]["c"]["version"] == 0
    with RawClient(nsqd.tcp_address) as sub:
        sub.subscribe("t", "c", rdy=10)
        m = sub.read_message()
        assert m.body == b"old"  # delivered again; "new" waits behind the barrier
        sub.expect_nothing(0.3)
        sub.send(v2.fin(m.id))
        assert sub.read_message().body == b"new"
    assert route(nsqd, "t")["channels"]["c"]["version"] == 1


def test_one_change_at_a_time_and_roll_forward(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as n:
            from nsqx.nsqd.routes_api import create_routed

            routes = await create_routed(n, "t", {"partition_num": ["2"], "logical": ["16"]})
            await n.publish("t", [b"a"], partition=0)
            first = asyncio.create_task(routes.change(lambda h: h.split(0, 4)))
            await asyncio.sleep(0)  # pending and sealed; its command is being written
            with pytest.raises(RouteError, match="still pending; one change at a time"):
                await routes.change(lambda h: h.merge(0, 1))
            await first
            assert routes.history.newest.version == 1
            # an interrupted change: stored pending, no command message yet, then a restart
            pending = routes.history.split(1, 12)
            (n.topics["t"].dir / "routes.json").write_bytes(pending.to_json())
        async with running_node(tmp_path) as n:
            routes = n.topics["t"].routes
            assert routes is not None
            h = routes.history
            assert h.pending is None and h.newest.version == 2
            assert [r.partition for r in h.newest.routes] == [2, 3, 4, 5]
            assert set(routes.sealed) == {0, 1} and len(n.topics["t"].partitions) == 6
            with pytest.raises(Exception, match="route version 2"):
                await n.publish("t", [b"x"], partition=1)

    asyncio.run(main())


def test_keyed_order_across_split_merge_move(nsqd: NsqdProcess) -> None:
    """Two producers publish keyed, numbered messages (one key's publishes one after another)
    while splits, merges and moves run; ordered consumers on two channels (b restarted half
    way), then a third created late and reset to the start, must see every acknowledged
    message and each key's numbers in order, no gap."""
    from nsqx.client import Consumer, Producer

    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="orders", partition_num=2,
                         logical=64).status == 200
    keys, per_key = 200, 15

    async def main() -> dict:
        seen: dict[str, dict[str, list[int]]] = {"a": {}, "b": {}}
        acked: set[tuple[str, int]] = set()

        def handler(chan: str):  # type: ignore[no-untyped-def]
            def handle(m) -> None:  # type: ignore[no-untyped-def]
                k, s = m.body.decode().split(":")
                seen[chan].setdefault(k, []).append(int(s))
            return handle

        def consumer(chan: str) -> Consumer:
            return Consumer("orders", chan, handler(chan), nsqd_tcp_addresses=nsqd.tcp_address,
                            max_in_flight=50, msg_timeout=3.0)

        ca, cb = consumer("a"), consumer("b")
        await ca.start()
        await cb.start()
        producers = [Producer(nsqd.tcp_address, nsqd_http_addresses=a) for _ in range(2)]

        async def publish_key(p: Producer, k: int) -> None:
            for s in range(per_key):
                await p.publish("orders", f"k{k}:{s}".encode(), key=f"k{k}")
                acked.add((f"k{k}", s))
                await asyncio.sleep(0.05 + (k % 7) * 0.02)

        async def operate() -> None:
            node = route(nsqd, "orders")["versions"][0]["routes"][0][3]
            ops = [("/topic/split", {"partition": 0, "at": 16}),
                   ("/topic/split", {"partition": 1, "at": 48}),
                   ("/topic/merge", {"a": 3, "b": 4}),
                   ("/topic/move", {"partition": 2, "node": "other:4150"}),
                   ("/topic/merge", {"a": 6, "b": 5}),
                   ("/topic/split", {"partition": 8, "at": 40}),
                   ("/topic/move", {"partition": 7, "node": node})]
            for path, params in ops:
                await asyncio.sleep(0.25)
                r = await asyncio.to_thread(http_api.post, a, path, topic="orders", **params)
                assert r.status == 200, (path, r.body)

        async def restart_b() -> None:
            nonlocal cb
            await asyncio.sleep(0.9)
            await cb.close()
            await asyncio.sleep(0.3)
            cb = consumer("b")
            await cb.start()

        await asyncio.gather(operate(), restart_b(), *(
            publish_key(producers[k % 2], k) for k in range(keys)))
        retries = sum(p.route_retries for p in producers)
        for p in producers:
            await p.close()
        want = {k for k, _ in acked}
        for _ in range(600):
            if all(sum(len(v) for v in seen[c].values()) >= len(acked)
                   and set(seen[c]) >= want for c in seen):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        await ca.close()
        await cb.close()
        # a channel created now starts on the newest version; reset to the start, it walks
        # every version again in order
        assert http_api.post(a, "/channel/create", topic="orders", channel="r").status == 200
        assert route(nsqd, "orders")["channels"]["r"]["version"] == 7
        r = http_api.post(a, "/channel/setoffset", topic="orders", channel="r", to="offset:0")
        assert r.status == 400 and "not to a partition's offset" in r.json()["message"]
        r = http_api.post(a, "/channel/setoffset", topic="orders", channel="r", to="earliest")
        assert r.status == 200 and r.json()["route_version"] == 0, r.body
        seen["r"] = {}
        cr = consumer("r")
        await cr.start()
        for _ in range(600):
            if sum(len(v) for v in seen["r"].values()) >= len(acked):
                break
            await asyncio.sleep(0.1)
        await cr.close()
        return {"seen": seen, "acked": acked, "retries": retries}

    out = asyncio.run(main())
    acked = out["acked"]
    assert len(acked) == keys * per_key
    for chan, seen in out["seen"].items():
        got = {(k, s) for k, ss in seen.items() for s in ss}
        assert got == acked, f"channel {chan}: missing {sorted(acked - got)[:10]}"
        for k, ss in seen.items():
            prev = -1
            for s in ss:  # in order, no gap; a redelivery repeats the previous one only
                assert s in (prev, prev + 1), f"channel {chan} key {k}: {ss}"
                prev = s
    h = route(nsqd, "orders")
    assert len(h["versions"]) == 8
    assert {c: s["version"] for c, s in h["channels"].items()} == {"a": 7, "b": 7, "r": 7}
    assert 0 < out["retries"] <= keys * 7  # at most one retry per key and change


def test_a_retired_partition_is_released_once_every_channel_passed_it(
        nsqd_factory) -> None:  # type: ignore[no-untyped-def]
    nsqd = nsqd_factory.start(["--max-bytes-per-file=4096"])
    a = nsqd.http_address
    assert http_api.post(a, "/topic/create", topic="t", partition_num=1, logical=16).status == 200
    for c in ("a", "b"):
        assert http_api.post(a, "/channel/create", topic="t", channel=c).status == 200
    with RawClient(nsqd.tcp_address) as pub:
        for i in range(0, 200, 20):
            pub.send(v2.mpub("t", [b"%0100d" % j for j in range(i, i + 20)], partition=0))
            pub.expect_ok()
    assert http_api.post(a, "/topic/split", topic="t", partition=0, at=8).status == 200

    def earliest() -> int:
        doc = http_api.get(a, "/nsqx/offsets", topic="t").json()
        return next(p["earliest"] for p in doc["partitions"] if p["partition"] == 0)

    def drain(channel: str) -> None:
        with RawClient(nsqd.tcp_address) as sub:
            sub.subscribe("t", channel, rdy=10)
            for _ in range(200):
                sub.send(v2.fin(sub.read_message().id))
            sub.expect_nothing(0.3)
        assert wait_for(lambda: route(nsqd, "t")["channels"][channel]["version"] == 1)

    drain("a")
    assert earliest() == 0  # channel b has not read partition 0 yet: all of it is kept
    drain("b")
    assert wait_for(lambda: earliest() > 100)  # consumed segments went at once
    assert http_api.get(a, "/message/get", topic="t", partition=0, search_mode="count",
                        search_pos="0").status == 404
