"""``/topic/partition/move`` and ``nsqx topic move`` on a real cluster.

Bad requests are refused with 400 and the reason; a move of the leader's replica to a spare
node and then a leader-only move run under a pynsq producer and consumer, and the total-queue
checker must find 0 lost acknowledged messages; `nsqx topic describe` and /cluster/stats show
the new replica set.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.chaos_check import Load
from tests.support.cluster import Cluster, http, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.compat]


def nsqx(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", *args], capture_output=True,
                          text=True, timeout=timeout)


def move(cluster: Cluster, query: str) -> tuple[int, dict]:
    return http("POST", f"http://{cluster.lookupd.http_address}/topic/partition/move?{query}")


def test_bad_move_requests_are_refused_with_the_reason(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                                       lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=4)
    cluster.create_topic("m", partitions=1, replicas=3)
    p = cluster.partitions("m")[0]
    leader, follower = p["leader"], next(n for n in p["isr"] if n != p["leader"])
    spare = next(n["id"] for n in cluster.stats()["nodes"] if n["id"] not in p["replicas"])
    cases = [
        ("partition=0&move_from=a&move_to=b", "MISSING_ARG_TOPIC", ""),
        ("topic=m&move_from=a&move_to=b", "MISSING_ARG_TOPIC_PARTITION", ""),
        (f"topic=m&partition=0&move_from={follower}", "MISSING_ARG_MOVE_TO", ""),
        (f"topic=nope&partition=0&move_from={follower}&move_to={spare}", "E_TOPIC_NOT_EXIST",
         "no topic nope"),
        (f"topic=m&partition=7&move_from={follower}&move_to={spare}",
         "INVALID_ARG_TOPIC_PARTITION", "partitions 0..0, not 7"),
        (f"topic=m&partition=x&move_from={follower}&move_to={spare}", "E_INVALID",
         "partition must be an integer"),
        (f"topic=m&partition=0&move_from={follower}&move_to=127.0.0.1:1:2", "E_INVALID",
         "move_to 127.0.0.1:1:2 is not a live node"),
        (f"topic=m&partition=0&move_from={spare}&move_to={follower}", "E_INVALID",
         f"move_from {spare} holds no replica of m/0"),
        (f"topic=m&partition=0&move_from={follower}&move_to={leader}", "E_INVALID",
         f"move_to {leader} already holds a replica of m/0"),
        (f"topic=m&partition=0&move_from={leader}&move_to={spare}", "E_INVALID",
         "add move_leader=true"),
        (f"topic=m&partition=0&move_from={follower}&move_to={spare}&move_leader=true",
         "E_INVALID", f"move_from {follower} is not the leader"),
        (f"topic=m&partition=0&move_from={follower}&move_to={spare}&move_leader=maybe",
         "E_INVALID", "move_leader must be true or false"),
    ]
    for query, code, detail in cases:
        status, body = move(cluster, query)
        assert status == 400, (query, status, body)
        assert body["message"] == code and detail in body.get("detail", ""), (query, body)
    # a node that stopped is no longer live: refused as a target
    victim = cluster.node_by_id(spare)
    victim.stop()
    wait_until(lambda: spare not in {n["id"] for n in cluster.stats()["nodes"]},
               what="the stopped node's lease gone")
    status, body = move(cluster, f"topic=m&partition=0&move_from={follower}&move_to={spare}")
    assert status == 400 and "is not a live node" in body["detail"], body
    out = nsqx("topic", "move", "m", "0", "--from", follower, "--to", spare,
               f"--lookupd-http-address={cluster.lookupd.http_address}")
    assert out.returncode == 1 and "is not a live node" in out.stderr, out
    assert cluster.stats()["moves"] == [] and cluster.partitions("m")[0] == p  # nothing moved


def test_move_under_load_loses_nothing(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                       lookupd_factory, tmp_path: Path) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=4)
    cluster.create_topic("moving", partitions=1, replicas=3)
    lk = cluster.lookupd.http_address
    before = cluster.partitions("moving")[0]
    old_leader = before["leader"]
    spare = next(n["id"] for n in cluster.stats()["nodes"] if n["id"] not in before["replicas"])
    load = Load(lk, "moving", 30, tmp_path)
    try:
        wait_until(lambda: load.acked() > 200, what="traffic before the move")
        # 1. the leader's replica moves to the spare node (the CLI adds move_leader=true)
        t0 = time.monotonic()
        out = nsqx("topic", "move", "moving", "0", "--from", old_leader, "--to", spare,
                   "--wait", "60", f"--lookupd-http-address={lk}")
        took = time.monotonic() - t0
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"moving replica {old_leader} -> {spare} (with its leadership)" in out.stdout
        p = cluster.partitions("moving")[0]
        assert p["leader"] == spare and old_leader not in p["replicas"]
        assert len(p["isr"]) == 3 and p["epoch"] == before["epoch"] + 1
        print(f"replica move under load done in {took:.2f} s; acked so far {load.acked()}")
        n = load.acked()
        wait_until(lambda: load.acked() > n + 200, what="traffic through the new leader")
        # 2. leadership alone moves to an in-sync follower; the spare stays a follower
        other = next(r for r in p["isr"] if r != spare)
        out = nsqx("topic", "move", "moving", "0", "--leader", "--to", other, "--wait", "30",
                   f"--lookupd-http-address={lk}")
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"moving leadership {spare} -> {other}" in out.stdout
        q = cluster.partitions("moving")[0]
        assert q["leader"] == other and set(q["replicas"]) == set(p["replicas"])
        assert q["epoch"] == p["epoch"] + 1
        n = load.acked()
        wait_until(lambda: load.acked() > n + 200, what="traffic after the leader-only move")
        tally = load.finish()
    finally:
        load.stop()
    print(f"partition move: {tally}")
    assert len(tally.acked) > 1000, str(tally)
    assert not tally.lost, f"lost acknowledged messages: {sorted(tally.lost)[:20]}"
    # what an operator sees: the new replica set, nothing pending
    stats = cluster.stats()
    assert stats["moves"] == []
    final = stats["topics"]["moving"]["partitions"][0]
    assert final["leader"] == other and old_leader not in final["replicas"]
    assert spare in final["replicas"] and final["catchup"] == []
    out = nsqx("topic", "describe", "moving", f"--lookupd-http-address={lk}")
    assert out.returncode == 0, out.stderr
    assert f"leader {other}  epoch {final['epoch']}" in out.stdout
    assert spare in out.stdout and old_leader not in out.stdout
