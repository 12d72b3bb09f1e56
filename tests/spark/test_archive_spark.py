"""The archive is a Spark table: ``spark.read.parquet(archive)`` gives the same rows as the
nsq source over the same range, and the nsq source itself reads archive + local log as one
offset range per partition (``startingOffsets=earliest`` reaches the archive start)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.nsqd.test_archive_nsqd import archived_and_deleted, bodies, http, publish  # noqa: E402
from tests.support.cluster import wait_until  # noqa: E402
from tests.support.nsqd_process import NsqdFactory  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]
COLS = ["partition", "offset", "id", "timestamp", "body"]


def test_archive_table_equals_nsq_source(spark: Any, nsqd_factory: NsqdFactory,
                                         tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                               f"--archive-url={arch}"])
    http(nsqd, "POST", "/topic/create?topic=t")
    http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    publish(nsqd, bodies(0, 400))
    http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
    a = wait_until(lambda: archived_and_deleted(nsqd), what="archiving and local deletion",
                   timeout=60)
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
