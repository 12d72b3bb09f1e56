"""The archive is a Spark table: ``spark.read.parquet(archive)`` gives the same rows as the
nsq source over the same range, and the nsq source itself reads archive + local log as one
offset range per partition (``startingOffsets=earliest`` reaches the archive start); the
same comparison also runs as a job on a real standalone Spark cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.nsqd.test_archive_nsqd import archived_node, bodies  # noqa: E402
from tests.support.nsqd_process import NsqdFactory  # noqa: E402

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


def test_archive_read_on_a_standalone_spark_cluster(nsqd_factory: NsqdFactory,
                                                    tmp_path: Path) -> None:
    """The same comparison as a job on a real standalone cluster (master + worker from
    pyspark's jars); its executors read the Parquet files and the nsqd."""
    import json
    import subprocess
    import sys

    from tests.support.spark_standalone import SparkStandalone

    arch = tmp_path / "archive"
    nsqd, a = archived_node(nsqd_factory, arch)
    spark = SparkStandalone(tmp_path / "spark")
    try:
        spark.start()
        env = {**spark.env(), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        res = subprocess.run([sys.executable, str(Path(__file__).with_name("archive_driver.py")),
                              spark.master_url, nsqd.http_address, str(arch),
                              str(a["archive_end"])], capture_output=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr.decode()[-5000:]
        out = json.loads(res.stdout.decode().strip().splitlines()[-1])
        assert out["rows"] == a["archive_end"] > 0
        assert out["equal"] and out["offsets_ok"]
        apps = spark.state()["completedapps"] + spark.state()["activeapps"]
        assert out["app"] in [x["id"] for x in apps]  # it ran on the standalone master
    finally:
        spark.stop()
