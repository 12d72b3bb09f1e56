"""Driver of tests/spark/test_archive_spark.py's standalone-cluster test (run as a process:
one SparkContext per JVM, and the suite's session is local[2]).

    python archive_driver.py MASTER_URL nsqd=HTTP_ADDR|lookupd=HTTP_ADDR ARCHIVE_DIR END

Prints one JSON line: rows read from the archive, whether they equal the nsq source's rows
over [0, END), and the application id (the test finds it on the master)."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from nsqx.spark import register

COLS = ["partition", "offset", "id", "timestamp", "body"]


def main() -> None:
    master, where, archive, end = sys.argv[1:5]
    how, _, addr = where.partition("=")  # the source reads one nsqd, or a cluster by lookupd
    spark = (SparkSession.builder.master(master).appName("nsqx-archive-standalone")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    register(spark)
    table = spark.read.parquet(archive).where("topic = 't'").select(*COLS)
    archived = table.orderBy("offset").collect()
    source = (spark.read.format("nsq").option(how, addr).option("topic", "t")
              .option("startingOffsets", "earliest")
              .option("endingOffsets", json.dumps({"0": int(end)})).load())
    from_source = source.select(*COLS).orderBy("offset").collect()
    print(json.dumps({"rows": len(archived),
                      "equal": [tuple(r) for r in archived] == [tuple(r) for r in from_source],
                      "offsets_ok": [r.offset for r in archived] == list(range(int(end))),
                      "app": spark.sparkContext.applicationId}))
    spark.stop()


if __name__ == "__main__":
    main()
