"""The nsq data source against a real cluster: etcd, nsqlookupd (coordinator) and three nsqd.

A topic of 3 partitions x 3 replicas: a batch read through lookupd alone finds every
partition's leader and reads each partition there, once, in one Spark partition per topic
partition (no follower copy read again), up to the high watermark; a stream keys its offsets
by partition number; a write through lookupd publishes each partition's rows at its leader.
After a kill -9 of a partition leader and its failover, the batch read
still returns every acknowledged message and the stream resumes with exactly the new ones.
"""

from __future__ import annotations

import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from nsqx.cluster.etcd_server import EtcdServer  # noqa: E402
from nsqx.spark.source import (  # noqa: E402
    BASE_SCHEMA,
    NsqPartition,
    Settings,
    _discover,
    _read_leaders,
    arrow_schema,
    read_partition,
)
from tests.support.cluster import Cluster, http, wait_until  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "sparked"
PARTS = 3


@pytest.fixture
def cluster(etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> Cluster:  # type: ignore[no-untyped-def]
    return Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)


def mpub(cluster: Cluster, partition: int, bodies: list[bytes]) -> None:
    """Publish to a partition's leader (acknowledged once the partition's ISR has them)."""
    leader = cluster.leader(TOPIC, partition)
    q = urllib.parse.urlencode({"topic": TOPIC, "partition": partition})
    code, resp = http("POST", f"http://{leader.http_address}/mpub?{q}", b"\n".join(bodies))
    assert code == 200, resp


def read_all(spark: Any, cluster: Cluster) -> tuple[int, list[set[int]], dict[int, list[Any]]]:
    """(Spark partitions, topic partitions seen by each, rows by topic partition)."""
    df = (spark.read.format("nsq").option("lookupd", cluster.lookupd.http_address)
          .option("topic", TOPIC).option("timeout", "5").load())
    n = df.rdd.getNumPartitions()
    per_task = df.rdd.mapPartitions(lambda rows: [sorted({r.partition for r in rows})]).collect()
    rows: dict[int, list[Any]] = {}
    for r in df.select("partition", "offset", "id", "body").orderBy("partition", "offset").collect():
        rows.setdefault(r.partition, []).append(r)
    return n, [set(p) for p in per_task], rows


def settings(cluster: Cluster) -> Settings:
    return Settings.parse({"lookupd": cluster.lookupd.http_address, "topic": TOPIC,
                           "timeout": "5"})


def state_of(cluster: Cluster, node: Any, partition: int) -> dict[str, Any]:
    return next(x for x in cluster.state(node)["partitions"]
                if x["topic"] == TOPIC and x["partition"] == partition)


def check(rows: dict[int, list[Any]], sent: dict[int, list[bytes]]) -> None:
    assert sorted(rows) == sorted(sent)
    for p, want in sent.items():
        got = rows[p]
        # each partition exactly once, in publish order, offsets dense from 0
        assert [r.offset for r in got] == list(range(len(want))), p
        assert [r.body for r in got] == want, p


def archived(spark: Any, out: Path) -> list[tuple[int, int, bytes]]:
    rows = spark.read.parquet(str(out)).select("partition", "offset", "body").collect()
    return sorted((r.partition, r.offset, bytes(r.body)) for r in rows)


def test_reads_through_lookupd_every_partition_once_at_its_leader_across_a_failover(
        spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    from nsqx.spark.jobs import archive

    cluster.create_topic(TOPIC, partitions=PARTS, replicas=3)
    parts = cluster.partitions(TOPIC)
    assert len({p["leader"] for p in parts}) == PARTS  # one leader per node
    sent: dict[int, list[bytes]] = {}
    for p in range(PARTS):
        sent[p] = [b"p%d-%04d" % (p, i) for i in range(100 + 50 * p)]
        mpub(cluster, p, sent[p])
    # every node holds every partition: a node-by-node read would see each message 3 times
    for p in parts:
        for r in p["replicas"]:
            node = cluster.node_by_id(r)
            wait_until(lambda node=node, p=p: state_of(cluster, node, p["partition"])["log_end"]
                       == len(sent[p["partition"]]), what="replicas caught up")

    n, per_task, rows = read_all(spark, cluster)
    assert n == PARTS and per_task == [{0}, {1}, {2}]
    check(rows, sent)
    # the driver planned each partition at its leader, keyed by its number (not by node)
    found = _discover(settings(cluster))
    assert {k: (p.node, p.latest) for k, p in found.items()} == {
        str(p["partition"]): (cluster.node_by_id(p["leader"]).http_address,
                              len(sent[p["partition"]])) for p in parts}
    # a stream (the archive job) through lookupd: its checkpoint holds one offset per partition
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = archive(spark, lookupd=cluster.lookupd.http_address, topic=TOPIC, to=str(out),
                checkpoint=str(ckpt), available_now=True, options={"timeout": "5"})
    q.awaitTermination()
    end = json.loads([p for p in q.recentProgress if p["numInputRows"]][-1]
                     ["sources"][0]["endOffset"])
    assert end["p"] == {str(p): len(b) for p, b in sent.items()}

    # a write through lookupd: each partition's rows at its leader, once per writer id
    cluster.create_topic("written", partitions=PARTS, replicas=3)
    src = spark.range(300).selectExpr("cast(id % 3 as int) AS partition",
                                      "format_string('w%03d', id) AS body")
    w = (src.write.format("nsq").option("lookupd", cluster.lookupd.http_address)
         .option("topic", "written").option("writerId", "w1").option("timeout", "5")
         .mode("append"))
    w.save()
    w.save()  # the same writer again (a re-run): nothing twice
    back = (spark.read.format("nsq").option("lookupd", cluster.lookupd.http_address)
            .option("topic", "written").load().select("partition", "body").collect())
    assert sorted((r.partition, bytes(r.body)) for r in back) == sorted(
        (i % 3, b"w%03d" % i) for i in range(300))

    # kill -9 the leader of partition 1; a follower takes over with every acked message
    victim_id = parts[1]["leader"]
    victim = cluster.node_by_id(victim_id)
    victim.kill()
    # meanwhile partition 0's leader appends a publish it cannot acknowledge until its ISR
    # drops the victim (lag timeout): above the high watermark, so not read yet
    leader = cluster.leader(TOPIC, 0)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(http, "POST", f"http://{leader.http_address}/pub?topic={TOPIC}"
                              "&partition=0", b"late-ack", 30)
        wait_until(lambda: (x := state_of(cluster, leader, 0))["log_end"] >
                   x["readable_end"], timeout=5, step=0.02, what="an append above the HW")
        # (the driver's read of that leader; the whole discovery would wait for partition
        # 1's new leader, by when this append may be acknowledged)
        probe = _read_leaders(settings(cluster), {0: leader.http_address}, None)
        assert probe["0"].latest == len(sent[0])
        assert pending.result() == (200, "OK")  # acknowledged by the 2 left in the ISR
    sent[0].append(b"late-ack")
    wait_until(lambda: all(p["leader"] not in (None, victim_id)
                           for p in cluster.partitions(TOPIC)), what="failover")
    for p in range(PARTS):  # every partition (partition 1 at its new leader) takes more
        more = [b"q%d-%02d" % (p, i) for i in range(20)]
        mpub(cluster, p, more)
        sent[p] += more

    n, per_task, rows = read_all(spark, cluster)
    assert n == PARTS and per_task == [{0}, {1}, {2}]
    check(rows, sent)
    # an executor handed a range planned at the killed leader goes on at the new one
    task = NsqPartition(TOPIC, "1", victim.http_address, 1, 0, len(sent[1]), settings(cluster))
    got = [b for rb in read_partition(task, arrow_schema(BASE_SCHEMA))
           for b in rb.column("body").to_pylist()]
    assert got == sent[1]
    # the stream resumes from its checkpoint (keys survive the leader change): only the new
    # messages, each once
    q = archive(spark, lookupd=cluster.lookupd.http_address, topic=TOPIC, to=str(out),
                checkpoint=str(ckpt), available_now=True, options={"timeout": "5"})
    q.awaitTermination()
    assert sum(p["numInputRows"] for p in q.recentProgress) == 20 * PARTS + 1
    assert archived(spark, out) == sorted((p, i, b) for p, bs in sent.items()
                                          for i, b in enumerate(bs))
