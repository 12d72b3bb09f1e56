"""The nsq data source in a real SparkSession (one per run): batch reads, writes, streams,
the archive job exactly once across a stop and a SIGKILL, the stats job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from nsqx.client import publish as _publish  # noqa: E402
from nsqx.spark.client import NodeClient  # noqa: E402
from tests.support.nsqd_process import NsqdProcess  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def publish(node: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    for i in range(0, len(bodies), 2000):
        _publish(node.http_address, topic, bodies[i:i + 2000], http=True)


def read(spark: Any, node: NsqdProcess, topic: str, **opts: str) -> Any:
    return (spark.read.format("nsq").option("nsqd", node.http_address).option("topic", topic)
            .options(**opts).load())


def test_batch_read(spark: Any, nsqd: NsqdProcess) -> None:
    publish(nsqd, "t", [b"m%05d" % i for i in range(3000)])
    df = read(spark, nsqd, "t", minPartitions="3")
    assert df.columns == ["topic", "partition", "offset", "id", "timestamp", "body"]
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("offset", "body", "id").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(3000))
    assert rows[42].body == b"m00042" and rows[42].id == f"{42:016x}"
    part = read(spark, nsqd, "t", startingOffsets='{"0": 100}', endingOffsets='{"t": {"0": 110}}')
    assert [r.offset for r in part.select("offset").collect()] == list(range(100, 110))
    # a DataFrame pins its offsets at load time
    publish(nsqd, "t", [b"more"] * 5)
    assert df.count() == 3000 and read(spark, nsqd, "t").count() == 3005


def test_batch_read_errors_surface(spark: Any, nsqd: NsqdProcess) -> None:
    publish(nsqd, "t", [b"x"] * 3)
    with pytest.raises(Exception, match="TOPIC_NOT_FOUND|does not exist"):
        read(spark, nsqd, "missing").count()
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, nsqd, "t", startingOffsets="whenever").count()
    with pytest.raises(Exception, match="ends at 3"):
        read(spark, nsqd, "t", endingOffsets='{"0": 10}').count()
    with pytest.raises(Exception, match="unreachable"):
        (spark.read.format("nsq").option("nsqd", "127.0.0.1:1").option("topic", "t")
         .option("timeout", "2").load().count())
    with pytest.raises(Exception, match="unreachable"):  # a failed publish fails the job
        (spark.range(3).selectExpr("cast(id as string) AS body").write.format("nsq")
         .option("nsqd", "127.0.0.1:1").option("topic", "t").mode("append").save())


def test_write_then_read_with_keys_idempotent(spark: Any, nsqd: NsqdProcess) -> None:
    from pyspark.sql import functions as F

    df = spark.range(500).select(F.format_string("v%d", "id").alias("body"),
                                 F.when(F.col("id") % 5 == 0, F.lit("hot").cast("binary"))
                                 .alias("key"))
    w = (df.write.format("nsq").option("nsqd", nsqd.http_address).option("topic", "w")
         .option("writerId", "job-1").option("batchSize", "100").mode("append"))
    w.save()
    w.save()  # the same writer id again (a re-run job): nothing is duplicated
    out = read(spark, nsqd, "w", includeHeaders="true")
    assert out.count() == 500
    assert out.where("key = cast('hot' as binary)").count() == 100
    assert out.select("body").distinct().count() == 500


def _archive_rows(spark: Any, path: Path) -> list[tuple[int, int]]:
    df = spark.read.parquet(str(path))  # honours _spark_metadata: only committed files
    return [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]


def assert_exactly_once(spark: Any, path: Path, n: int) -> None:
    rows = _archive_rows(spark, path)
    offsets = sorted(o for _, o in rows)
    assert len(offsets) == n, (len(offsets), n)
    assert offsets == list(range(n)), "duplicates or gaps in the archive"


def test_stream_available_now_resumes(spark: Any, nsqd: NsqdProcess, tmp_path: Path) -> None:
    from nsqx.spark.jobs import archive

    publish(nsqd, "s", [b"s%05d" % i for i in range(1000)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = archive(spark, nsqd=nsqd.http_address, topic="s", to=str(out), checkpoint=str(ckpt),
                available_now=True, max_offsets_per_trigger=400)
    q.awaitTermination()
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [400, 400, 200]
    assert json.loads(batches[-1]["sources"][0]["endOffset"]) == {"v": 1, "topic": "s",
                                                                  "p": {"0": 1000}}
    assert_exactly_once(spark, out, 1000)
    assert any(p.name.startswith("date=") for p in out.iterdir())
    publish(nsqd, "s", [b"late"] * 10)
    q = archive(spark, nsqd=nsqd.http_address, topic="s", to=str(out), checkpoint=str(ckpt),
                available_now=True)
    q.awaitTermination()
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0] == [10]
    assert_exactly_once(spark, out, 1010)


def _wait(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _commits(ckpt: Path) -> int:
    d = ckpt / "commits"
    return len([p for p in d.iterdir() if p.name.isdigit()]) if d.exists() else 0


def test_archive_exactly_once_across_stop_and_kill(spark: Any, nsqd: NsqdProcess,
                                                   tmp_path: Path) -> None:
    """Stopped mid-stream, then SIGKILLed mid-stream (the CLI job in its own process), then
    restarted: the archive holds every published message exactly once."""
    from nsqx.spark.jobs import archive

    total = 6000
    publish(nsqd, "e", [b"e%06d" % i + b"." * 90 for i in range(total)])
    out, ckpt = tmp_path / "archive", tmp_path / "ckpt"
    # 1. a running query (continuous triggers) stopped after a few batches
    q = archive(spark, nsqd=nsqd.http_address, topic="e", to=str(out), checkpoint=str(ckpt),
                max_offsets_per_trigger=500)
    _wait(lambda: _commits(ckpt) >= 2, 120)
    q.stop()
    done = len(_archive_rows(spark, out))
    assert 0 < done < total
    # 2. the CLI job in another process, killed with SIGKILL while batches are running
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, "-m", "nsqx.cli.nsqx_cmd", "spark", "archive",
           "--nsqd", nsqd.http_address, "--topic", "e", "--to", str(out),
           "--checkpoint", str(ckpt), "--max-offsets-per-trigger", "300", "--master", "local[1]",
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"]
    log = open(tmp_path / "archive-job.log", "wb")  # noqa: SIM115
    before = _commits(ckpt)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        job_log = tmp_path / "archive-job.log"
        # mid-stream: two batches committed by the job, and its progress reported
        _wait(lambda: (_commits(ckpt) >= before + 2 and "rows/s" in job_log.read_text())
              or proc.poll() is not None, 150)
        assert proc.poll() is None, (tmp_path / "archive-job.log").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
    text = (tmp_path / "archive-job.log").read_text()
    assert "archiving topic e" in text and "rows/s" in text
    assert len(_archive_rows(spark, out)) < total
    # 3. restart in this session: finishes the topic, exactly once
    q = archive(spark, nsqd=nsqd.http_address, topic="e", to=str(out), checkpoint=str(ckpt),
                available_now=True)
    q.awaitTermination()
    assert_exactly_once(spark, out, total)


def test_stream_writer_replay_is_deduplicated(spark: Any, nsqd: NsqdProcess,
                                              tmp_path: Path) -> None:
    publish(nsqd, "src", [b"x%04d" % i for i in range(300)])
    ckpt = tmp_path / "ckpt"

    def run() -> list[int]:
        q = (spark.readStream.format("nsq").option("nsqd", nsqd.http_address)
             .option("topic", "src").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "100").load()
             .select("body", "offset")
             .writeStream.format("nsq").option("nsqd", nsqd.http_address)
             .option("topic", "dst").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0]

    assert run() == [100, 100, 100]
    c = NodeClient(nsqd.http_address)
    assert c.offsets("dst")[0]["latest"] == 300
    # a crash after the sink wrote batch 2 but before Spark recorded it: the batch is replayed
    for name in ("2", ".2.crc"):
        (ckpt / "commits" / name).unlink()
    assert run() == [100]  # batch 2 again, same offsets
    assert c.offsets("dst")[0]["latest"] == 300
    bodies = sorted(r.body for r in read(spark, nsqd, "dst").select("body").collect())
    assert bodies == [b"x%04d" % i for i in range(300)]


def test_stats_job_over_topic_and_archive(spark: Any, nsqd: NsqdProcess,
                                          tmp_path: Path) -> None:
    from nsqx.spark.client import encode_pub_body
    from nsqx.spark.jobs import archive, format_stats, stats

    c = NodeClient(nsqd.http_address)
    keys = [b"a"] * 6 + [b"b"] * 3 + [None]
    c.pub("st", encode_pub_body([b"0123456789"] * 10, keys), writer="w", batch="1", task="0",
          keys=True)
    res = stats(spark, nsqd=nsqd.http_address, topic="st")
    assert res["total"]["messages"] == 10 and res["total"]["bytes"] == 100
    assert sum(r["messages"] for r in res["per_minute"]) == 10
    assert [(bytes(r["key"]), r["messages"]) for r in res["top_keys"]] == [(b"a", 6), (b"b", 3)]
    assert res["per_partition"] == [{"partition": 0, "messages": 10, "bytes": 100,
                                     "first_offset": 0, "last_offset": 9}]
    assert "top keys" in format_stats(res) and "0-9" in format_stats(res)
    out = tmp_path / "arch"
    archive(spark, nsqd=nsqd.http_address, topic="st", to=str(out), available_now=True
            ).awaitTermination()
    res2 = stats(spark, archive_dir=str(out))
    assert res2["total"]["messages"] == 10 and res2["top_keys"] == []
    shutil.rmtree(out)


def test_partitioned_topic_read_and_keyed_write(spark: Any, nsqd: NsqdProcess) -> None:
    """Every partition is read (one Spark partition each at least); a key column routes rows
    as nsqx.client does (crc32(key) % partitions) and stays idempotent per partition."""
    import urllib.request
    import zlib

    from pyspark.sql import functions as F

    urllib.request.urlopen(urllib.request.Request(
        f"http://{nsqd.http_address}/topic/create?topic=parts&partition_num=3", method="POST"),
        timeout=10).read()
    df = spark.range(300).select(F.format_string("v%d", "id").alias("body"),
                                 F.format_string("k%d", F.col("id") % 7).cast("binary")
                                 .alias("key"))
    w = (df.write.format("nsq").option("nsqd", nsqd.http_address).option("topic", "parts")
         .option("writerId", "keyed").mode("append"))
    w.save()
    w.save()  # idempotent per partition
    out = read(spark, nsqd, "parts", includeHeaders="true")
    assert out.count() == 300
    rows = out.select("partition", "key").collect()
    assert {r.partition for r in rows} == {0, 1, 2}
    assert all(r.partition == zlib.crc32(bytes(r.key)) % 3 for r in rows)
    stats = NodeClient(nsqd.http_address).offsets("parts")
    assert sorted(p["partition"] for p in stats) == [0, 1, 2]
    assert sum(p["latest"] for p in stats) == 300
