"""The archive is a Spark table: ``spark.read.parquet(archive)`` gives the same rows as the
nsq source over the same range, and the nsq source itself reads archive + local log as one
offset range per partition (``startingOffsets=earliest`` reaches the archive start); the
same comparison also runs as a job on a real standalone Spark cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.nsqd.test_archive_nsqd import (  # noqa: E402
    archived_and_deleted,
    archived_node,
    bodies,
    http,
    publish,
)
from tests.support.cluster import Cluster, wait_until  # noqa: E402
from tests.support.nsqd_process import NsqdFactory  # noqa: E402
from tests.support.spark_standalone import SparkStandalone  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]
COLS = ["partition", "offset", "id", "timestamp", "body"]


def test_archive_table_equals_nsq_source(spark: Any, nsqd_factory: NsqdFactory,
                                         tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    nsqd, a = archived_node(nsqd_factory, arch, 400)
    end = a["archive_end"]
    assert a["log_start"] > 0 and end >= a["log_start"]
    table = spark.read.parquet(str(arch))
    assert {"topic", "date", "partition", "offset", "timestamp_ns", "headers"} <= set(
        table.columns)
    archived = (table.where("topic = 't'").select(*COLS).orderBy("offset").collect())
    src = (spark.read.format("nsq").option("nsqd", nsqd.http_address).option("topic", "t")
           .option("startingOffsets", "earliest")
           .option("endingOffsets", f'{{"0": {end}}}').load())
    from_source = src.select(*COLS).orderBy("offset").collect()
    assert len(archived) == end > 0
    assert [tuple(r) for r in archived] == [tuple(r) for r in from_source]
    # the source reads the whole partition, archive then local log, as one range
    everything = (spark.read.format("nsq").option("nsqd", nsqd.http_address)
                  .option("topic", "t").load().select("offset", "body").orderBy("offset")
                  .collect())
    assert [r.offset for r in everything] == list(range(400))
    assert [bytes(r.body) for r in everything] == bodies(0, 400)


def test_spark_reads_every_archive_codec(spark: Any, tmp_path: Path) -> None:
    """--archive-compression: one topic per codec written by the archiver, read back by
    one ``spark.read.parquet`` (no setting: the codec is in each column chunk); pyarrow's
    lz4 is Parquet's LZ4_RAW, as parquet-mr reads it from the footer."""
    from nsqx.storage.archive import CODECS, Archive
    from nsqx.storage.archiver import Archiver
    from nsqx.storage.log import LogConfig, PartitionLog

    arch = tmp_path / "archive"
    want = {}
    for codec in CODECS:
        lg = PartitionLog(tmp_path / codec, 0, LogConfig(segment_bytes=4000))
        for k in range(0, 200, 5):
            lg.append([b"%s %d" % (codec.encode(), k + i) for i in range(5)], 10**18 + k)
            lg.flush()
        lg.sync()
        archiver = Archiver(Archive(str(arch), compression=codec))
        archiver.add(codec, 0, lg)
        assert archiver.run_once() >= 1
        end = lg.closed_segments()[-1][1]
        want[codec] = [b"%s %d" % (codec.encode(), i) for i in range(end)]
        archiver.join()
        lg.close()
    rows = spark.read.parquet(str(arch)).select("topic", "offset", "body").collect()
    got: dict[str, list[tuple[int, bytes]]] = {}
    for r in rows:
        got.setdefault(r.topic, []).append((r.offset, bytes(r.body)))
    assert {t: [b for _, b in sorted(v)] for t, v in got.items()} == want
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - parquet-mr's view of the footer
    lz4 = next(arch.glob("topic=lz4/*/*/*.parquet"))
    footer = jvm.org.apache.parquet.hadoop.ParquetFileReader.readFooter(
        spark.sparkContext._jsc.hadoopConfiguration(),  # noqa: SLF001
        jvm.org.apache.hadoop.fs.Path(str(lz4)))
    assert {c.getCodec().name() for b in footer.getBlocks() for c in b.getColumns()} == {
        "LZ4_RAW"}


def test_archive_read_on_a_standalone_spark_cluster(nsqd_factory: NsqdFactory,
                                                    tmp_path: Path) -> None:
    """The same comparison as a job on a real standalone cluster (master + worker from
    pyspark's jars); its executors read the Parquet files and the nsqd."""


    arch = tmp_path / "archive"
    nsqd, a = archived_node(nsqd_factory, arch)
    run_on_standalone(tmp_path, f"nsqd={nsqd.http_address}", arch, a["archive_end"])


def run_on_standalone(tmp_path: Path, where: str, arch: Path, end: int) -> None:
    """archive_driver.py as a job on a fresh standalone cluster: the archive's rows over
    [0, end) equal the nsq source's (reading ``where``)."""
    spark = SparkStandalone(tmp_path / "spark")
    try:
        spark.start()
        env = {**spark.env(), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        res = subprocess.run([sys.executable, str(Path(__file__).with_name("archive_driver.py")),
                              spark.master_url, where, str(arch), str(end)],
                             capture_output=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr.decode()[-5000:]
        out = json.loads(res.stdout.decode().strip().splitlines()[-1])
        assert out["rows"] == end > 0
        assert out["equal"] and out["offsets_ok"]
        apps = spark.state()["completedapps"] + spark.state()["activeapps"]
        assert out["app"] in [x["id"] for x in apps]  # it ran on the standalone master
    finally:
        spark.stop()


def test_standalone_spark_reads_a_3_node_cluster_and_its_archive(
        etcd_server, nsqd_factory: NsqdFactory, lookupd_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The issue's done-when for Spark: a 3-node nsqx cluster archiving to one place, read
    through lookupd (each partition at its leader, archive + local log) by a job on a real
    standalone Spark cluster, equal to spark.read.parquet of the archive."""
    arch = tmp_path / "archive"
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, nsqd_args=["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                            f"--archive-url={arch}"])
    cluster.create_topic("t", partitions=1, replicas=3)
    leader = cluster.leader("t")
    http(leader, "POST", "/channel/create?topic=t&channel=c")
    publish(leader, bodies(0, 400))
    http(leader, "POST", "/channel/empty?topic=t&channel=c")
    a = wait_until(lambda: archived_and_deleted(leader), what="the leader archived", timeout=90)
    run_on_standalone(tmp_path, f"lookupd={cluster.lookupd.http_address}", arch,
                      a["archive_end"])
