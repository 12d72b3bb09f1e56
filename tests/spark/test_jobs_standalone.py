"""The ``nsqx spark`` jobs as a user runs them on their own Spark cluster: ``nsqx spark
stats|archive|trace-report --master spark://...`` as processes, against a real standalone
Spark cluster (master + worker from pyspark's jars, loopback only) reading a 3-node nsqx
cluster (etcd, lookupd, 3 nsqd; a topic of 3 partitions, each led by another node) through
lookupd.

Each job's output is checked against what the test published and consumed, and each must
have run on the cluster: a new application of the job's name on the master (its ``/json/``)
whose executor the worker launched (the worker's work dir holds the application). One
nsqx cluster and one Spark cluster serve every job (module fixture), stopped even when a
test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from nsqx.cluster.etcd_server import EtcdServer  # noqa: E402
from nsqx.protocol import v2  # noqa: E402
from nsqx.protocol.v2 import TRACE_TOPIC  # noqa: E402
from nsqx.spark.client import NodeClient, encode_pub_body  # noqa: E402
from tests.support.cluster import Cluster, http, wait_until  # noqa: E402
from tests.support.lookupd_process import LookupdFactory  # noqa: E402
from tests.support.nsqd_process import NsqdFactory  # noqa: E402
from tests.support.rawclient import consumer  # noqa: E402
from tests.support.spark_standalone import SparkStandalone  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "events"
PARTS = 3
CHANNEL = "work"


def key_of(i: int) -> bytes | None:
    return None if i % 10 == 9 else b"k%d" % (i % 3)


@dataclass
class World:
    cluster: Cluster
    spark: SparkStandalone
    tmp: Path
    sent: dict[int, list[bytes]] = field(default_factory=dict)  # partition -> bodies
    keys: dict[int, list[bytes | None]] = field(default_factory=dict)
    clients: set[str] = field(default_factory=set)  # consumer addresses as nsqd sees them

    @property
    def lookupd(self) -> str:
        return self.cluster.lookupd.http_address

    def run(self, job: str, *args: str) -> tuple[str, dict[str, Any]]:
        """``nsqx spark JOB ARGS --master URL`` as a process; (its stdout, the application
        the master ran for it)."""
        before = {a["id"] for a in self.apps()}
        env = {**self.spark.env(), "PYSPARK_PYTHON": sys.executable}  # nsqx on the workers
        nsqx = str(Path(sys.executable).with_name("nsqx"))
        res = subprocess.run(
            [nsqx, "spark", job, *args, "--master", self.spark.master_url,
             "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=4"],
            capture_output=True, env=env, timeout=400, cwd=self.tmp)
        assert res.returncode == 0, res.stderr.decode()[-6000:]
        new = [a for a in self.apps() if a["id"] not in before]
        assert [a["name"] for a in new] == [f"nsqx-{job}"], new  # it ran on this master
        app = new[0]
        # ... and on its worker: the executor's work dir (its stdout/stderr) is there
        assert list((self.spark.work / "w" / app["id"]).glob("*/stderr")), app
        return res.stdout.decode(), app

    def apps(self) -> list[dict[str, Any]]:
        s = self.spark.state()
        return [*s["activeapps"], *s["completedapps"]]


def java_or_skip() -> None:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        if os.environ.get("CI"):
            pytest.fail("Spark tests need Java 17 (java on PATH or JAVA_HOME)")
        pytest.skip("no Java: Spark tests need Java 17")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    java_or_skip()
    base = tmp_path_factory.mktemp("jobs-standalone")
    etcd = EtcdServer(base / "etcd")
    nsqds, lookupds = NsqdFactory(base / "nsqd"), LookupdFactory(base / "lookupd")
    spark = SparkStandalone(base / "spark")
    try:
        etcd.start()
        cluster = Cluster(etcd, nsqds, lookupds).start(nodes=3)
        w = World(cluster, spark, base)
        traffic(w)
        spark.start()
        yield w
    finally:
        spark.stop()
        nsqds.close()
        lookupds.close()
        etcd.stop(kill=True)


def traffic(w: World) -> None:
    """A traced topic of 3 partitions (one leader per node), a few hundred keyed messages,
    all consumed on one channel with the first delivery of each partition's offset 0 REQ'd."""
    c = w.cluster
    # in a cluster the trace events go to the cluster topic __trace (every node's, at its
    # leader), which must exist; 3 replicas: every node has every event
    c.create_topic(TRACE_TOPIC, partitions=1, replicas=3)
    c.create_topic(TOPIC, partitions=PARTS, replicas=2)
    assert len({p["leader"] for p in c.partitions(TOPIC)}) == PARTS
    for p in range(PARTS):
        leader = c.leader(TOPIC, p)
        code, body = http("POST", f"http://{leader.http_address}/topic/trace?topic={TOPIC}"
                          "&enable=true")
        assert code == 200, body
        n = 100 + 30 * p
        w.sent[p] = [b"p%d-%04d-" % (p, i) + b"x" * (i % 7) for i in range(n)]
        w.keys[p] = [key_of(i) for i in range(n)]
        NodeClient(leader.http_address).pub(
            TOPIC, encode_pub_body(w.sent[p], w.keys[p]), writer="test", batch="1",
            task=str(p), partition=p, keys=True)
    for p in range(PARTS):
        leader = c.leader(TOPIC, p)
        with consumer(leader.tcp_address, TOPIC, CHANNEL, rdy=50) as cons:
            w.clients.add(f"127.0.0.1:{cons.sock.getsockname()[1]}")
            fins, requeued, last = 0, False, b""
            while fins < len(w.sent[p]):
                m = cons.read_message(timeout=10)
                if m.body == w.sent[p][0] and not requeued:
                    cons.send(v2.req(m.id, 0))
                    requeued = True
                    continue
                cons.send(v2.fin(m.id))
                fins, last = fins + 1, m.id
            cons.expect_nothing(0.2)
        # a node records its events in order: the last FIN on every replica of __trace
        # (so below its high watermark), all are
        wait_until(lambda mid=last.decode(): all(fin_recorded(n.http_address, mid)
                                                 for n in c.nodes),
                   what="trace events recorded")


def fin_recorded(addr: str, mid: str) -> bool:
    code, r = http("GET", f"http://{addr}/trace/search?topic={TOPIC}&id={mid}")
    return code == 200 and any(e["event"] == "fin" and e.get("channel") == CHANNEL
                               for m in r["messages"] for e in m["events"])


def total(w: World) -> int:
    return sum(len(b) for b in w.sent.values())


def test_stats_on_the_standalone_cluster(world: World) -> None:
    out, _ = world.run("stats", "--lookupd", world.lookupd, "--topic", TOPIC, "--json")
    res = json.loads(out.strip().splitlines()[-1])
    nbytes = {p: sum(len(b) for b in bs) for p, bs in world.sent.items()}
    assert res["total"]["messages"] == total(world)
    assert res["total"]["bytes"] == sum(nbytes.values())
    assert res["per_partition"] == [
        {"partition": p, "messages": len(bs), "bytes": nbytes[p], "first_offset": 0,
         "last_offset": len(bs) - 1} for p, bs in sorted(world.sent.items())]
    assert sum(r["messages"] for r in res["per_minute"]) == total(world)
    keys: dict[str, int] = {}
    for ks in world.keys.values():
        for k in ks:
            if k is not None:
                keys[k.decode()] = keys.get(k.decode(), 0) + 1
    assert {r["key"]: r["messages"] for r in res["top_keys"]} == keys


def test_archive_on_the_standalone_cluster(world: World) -> None:
    to = world.tmp / "archive"
    out, _ = world.run("archive", "--lookupd", world.lookupd, "--topic", TOPIC,
                       "--to", str(to), "--available-now")
    assert f"archiving topic {TOPIC}" in out
    files = sorted(to.glob("date=*/hour=*/*.parquet"))
    # the file sink's log names exactly the files written (no leftover of a failed task)
    logged = {urlparse(json.loads(line)["path"]).path
              for f in (to / "_spark_metadata").iterdir() if f.name.isdigit()
              for line in f.read_text().splitlines()[1:]}
    assert logged == {str(f) for f in files} and files
    rows = sorted((r["partition"], r["offset"], r["body"])
                  for f in files for r in pq.read_table(f).to_pylist())
    assert rows == sorted((p, i, b) for p, bs in world.sent.items() for i, b in enumerate(bs))
    # a second run finds nothing new (offsets in the checkpoint): no file added
    world.run("archive", "--lookupd", world.lookupd, "--topic", TOPIC, "--to", str(to),
              "--available-now")
    assert sorted(to.glob("date=*/hour=*/*.parquet")) == files
    # the stats job over the archive (its executors read the Parquet files) count the same
    out, _ = world.run("stats", "--archive", str(to), "--json")
    res = json.loads(out.strip().splitlines()[-1])
    assert res["total"]["messages"] == total(world)
    assert [(r["partition"], r["messages"], r["last_offset"]) for r in res["per_partition"]] \
        == [(p, len(bs), len(bs) - 1) for p, bs in sorted(world.sent.items())]


def test_trace_report_on_the_standalone_cluster(world: World) -> None:
    out_dir = world.tmp / "report"
    start = time.time_ns()
    out, _ = world.run("trace-report", "--lookupd", world.lookupd, "--topic", TOPIC,
                       "--out", out_dir.as_uri(), "--json")  # a URI: the summary goes via Hadoop
    s = json.loads(out.strip().splitlines()[-1])
    n = total(world)
    (ch,) = s["channels"]
    assert (ch["topic"], ch["channel"]) == (TOPIC, CHANNEL)
    assert (ch["messages"], ch["deliveries"], ch["redelivered_messages"]) == (n, n + PARTS,
                                                                             PARTS)
    assert (ch["fin"], ch["req"], ch["timeout"], ch["dlq"]) == (n, PARTS, 0, 0)
    assert ch["redelivery_rate"] == pytest.approx(PARTS / n)
    assert ch["pub_to_deliver_ms_p50"] is not None and ch["deliver_to_fin_ms_max"] >= 0
    assert {c["client_addr"] for c in s["slowest_consumers"]} == world.clients
    assert sum(c["deliveries"] for c in s["slowest_consumers"]) == n + PARTS
    assert s["last_ts"] < start
    assert json.loads((out_dir / "summary.json").read_text())["channels"] == s["channels"]
    assert "<h2>Slowest consumers</h2>" in (out_dir / "summary.html").read_text()
    deliveries = [r for f in sorted((out_dir / "deliveries").glob("*.parquet"))
                  for r in pq.read_table(f).to_pylist()]
    assert len(deliveries) == n + PARTS
    assert sorted((r["partition"], r["offset"], r["attempts"], r["outcome"])
                  for r in deliveries if r["offset"] == 0) == sorted(
        (p, 0, a, o) for p in range(PARTS) for a, o in ((1, "req"), (2, "fin")))
