"""Spark jobs on the ``nsq`` data source: archive a topic to Parquet, statistics over a topic.

Both run on ``local[*]`` by default and unchanged on a cluster::

    nsqx spark archive --nsqd 127.0.0.1:4151 --topic events --to /data/archive/events
    nsqx spark stats --nsqd 127.0.0.1:4151 --topic events --from 2026-11-22T10:00 --to 2026-11-22T11:00

    # on a cluster (nsqx installed on every node, in the Python the executors run):
    spark-submit --master spark://host:7077 "$(python -c 'import nsqx.cli.nsqx_cmd as m; print(m.__file__)')" \\
        spark archive --nsqd nsqd1:4151 --topic events --to hdfs:///archive/events

``archive`` is a streaming query: the offsets of every micro-batch are in its checkpoint and
the Parquet file sink records the files of each batch in ``_spark_metadata``, so after a stop or
a crash the restarted job neither loses nor duplicates a record (read the archive with
``spark.read.parquet(DIR)``, which honours ``_spark_metadata``). Output is partitioned by
``date=YYYY-MM-DD/hour=H`` of the publish time (UTC).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nsqx.spark import register

__all__ = ["spark_session", "archive", "run_archive", "stats", "parse_time_ms"]


def spark_session(master: str | None = None, app_name: str = "nsqx",
                  conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with the ``nsq`` source registered.

    ``master`` defaults to ``local[*]`` unless the job was started by ``spark-submit``
    (which decides the master itself)."""
    conf = dict(conf or {})
    # Spark would start its workers with ``python3`` from PATH, which lacks nsqx when the
    # venv's python runs without the venv activated: register() gives them this interpreter
    # unless the user chose one: --conf, PYSPARK_PYTHON (the setting ranks above the
    # environment, as in Spark) or spark-defaults.conf, where a cluster's gateway names the
    # executors' Python (so nothing is forced into the session here when nobody chose)
    worker = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if worker:
        os.environ["PYSPARK_PYTHON"] = worker
        conf["spark.pyspark.python"] = worker
    conf.setdefault("spark.pyspark.driver.python",
                    os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        b = b.master("local[*]")
    b = b.config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone",
                                                                 "UTC")
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    register(spark)
    return spark


def parse_time_ms(value: str | int | None) -> int | None:
    """ms since the epoch from an int, digits (ms), or an ISO-8601 time (UTC unless it says)."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.isdigit():
        return int(s)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {value!r}: use ms since the epoch or ISO 8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def source_options(*, nsqd: str | None, lookupd: str | None, topic: str,
                   extra: dict[str, str] | None = None) -> dict[str, str]:
    o: dict[str, str] = {"topic": topic}
    if nsqd:
        o["nsqd"] = nsqd
    if lookupd:
        o["lookupd"] = lookupd
    o.update(extra or {})
    return o


def archive(spark: Any, *, topic: str, to: str, nsqd: str | None = None,
            lookupd: str | None = None, fmt: str = "parquet", checkpoint: str | None = None,
            available_now: bool = False, trigger_seconds: float | None = None,
            max_offsets_per_trigger: int | None = None, starting_offsets: str = "earliest",
            options: dict[str, str] | None = None) -> Any:
    """Start the archive streaming query and return it (``StreamingQuery``)."""
    from pyspark.sql import functions as F

    extra = {"startingOffsets": starting_offsets, **(options or {})}
    if max_offsets_per_trigger:
        extra["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    df = (spark.readStream.format("nsq")
          .options(**source_options(nsqd=nsqd, lookupd=lookupd, topic=topic, extra=extra))
          .load())
    df = (df.withColumn("date", F.date_format(F.col("timestamp"), "yyyy-MM-dd"))
            .withColumn("hour", F.hour(F.col("timestamp"))))
    w = (df.writeStream.format(fmt).partitionBy("date", "hour")
         .option("checkpointLocation", checkpoint or os.path.join(to, "_checkpoint"))
         .option("path", to).queryName(f"nsqx-archive-{topic}"))
    if available_now:
        w = w.trigger(availableNow=True)
    elif trigger_seconds:
        w = w.trigger(processingTime=f"{trigger_seconds} seconds")
    return w.start()


def _describe(p: dict[str, Any]) -> str:
    src = (p.get("sources") or [{}])[0]
    return (f"batch {p.get('batchId')}: {p.get('numInputRows', 0)} rows, "
            f"{float(p.get('processedRowsPerSecond') or 0):.0f} rows/s, "
            f"offsets {src.get('endOffset')}, latest {src.get('latestOffset')}")


def run_archive(spark: Any, *, progress: Callable[[str], None] = print,
                interval: float = 5.0, **kw: Any) -> int:
    """Run the archive query until it ends (availableNow) or SIGINT/SIGTERM; reports progress."""
    q = archive(spark, **kw)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    progress(f"archiving topic {kw.get('topic')} to {kw.get('to')} (query {q.id})")
    seen = -1
    try:
        while q.isActive and not stop.is_set():
            q.awaitTermination(min(interval, 1.0))
            for p in q.recentProgress:
                if p.get("batchId", -1) > seen and p.get("numInputRows", 0) > 0:
                    seen = p["batchId"]
                    progress(_describe(p))
        if stop.is_set():
            progress("stopping (the next start resumes from the checkpoint)")
            q.stop()
        for p in q.recentProgress:
            if p.get("batchId", -1) > seen and p.get("numInputRows", 0) > 0:
                seen = p["batchId"]
                progress(_describe(p))
        exc = q.exception()
        if exc is not None:
            progress(f"archive failed: {exc}")
            return 1
        return 0
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def stats(spark: Any, *, topic: str | None = None, nsqd: str | None = None,
          lookupd: str | None = None, archive_dir: str | None = None,
          start_ms: int | None = None, end_ms: int | None = None, top: int = 10,
          options: dict[str, str] | None = None) -> dict[str, Any]:
    """Messages and bytes per minute, per partition and the top keys, over the topic or its
    archive.

    Returns ``{"total": {...}, "per_minute": [...], "per_partition": [...], "top_keys": [...]}``
    (plain Python); per partition also its first and last offset, so a gap shows (a dense
    range has ``messages == last_offset - first_offset + 1``)."""
    from pyspark.sql import functions as F

    if archive_dir:
        df = spark.read.parquet(archive_dir)
        if start_ms is not None:
            df = df.where(F.col("timestamp") >= F.timestamp_millis(F.lit(start_ms)))
        if end_ms is not None:
            df = df.where(F.col("timestamp") < F.timestamp_millis(F.lit(end_ms)))
    else:
        if not topic:
            raise ValueError("stats needs a topic (or an archive directory)")
        extra = dict(options or {})
        extra.setdefault("includeHeaders", "true")
        if start_ms is not None:
            extra["startingTimestamp"] = str(start_ms)
        if end_ms is not None:
            extra["endingTimestamp"] = str(end_ms)
        df = (spark.read.format("nsq")
              .options(**source_options(nsqd=nsqd, lookupd=lookupd, topic=topic, extra=extra))
              .load())
    df = df.select("timestamp", "partition", "offset", F.length("body").alias("nbytes"),
                   *(["key"] if "key" in df.columns else [])).cache()
    try:
        total = df.agg(F.count(F.lit(1)).alias("messages"),
                       F.coalesce(F.sum("nbytes"), F.lit(0)).alias("bytes"),
                       F.min("timestamp").alias("first"),
                       F.max("timestamp").alias("last")).collect()[0].asDict()
        per_minute = [r.asDict() for r in (
            df.groupBy(F.date_trunc("minute", "timestamp").alias("minute"))
              .agg(F.count(F.lit(1)).alias("messages"), F.sum("nbytes").alias("bytes"))
              .orderBy("minute").collect())]
        per_partition = [r.asDict() for r in (
            df.groupBy("partition")
              .agg(F.count(F.lit(1)).alias("messages"), F.sum("nbytes").alias("bytes"),
                   F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"))
              .orderBy("partition").collect())]
        top_keys: list[dict[str, Any]] = []
        if "key" in df.columns:
            top_keys = [r.asDict() for r in (
                df.where(F.col("key").isNotNull()).groupBy("key")
                  .agg(F.count(F.lit(1)).alias("messages"), F.sum("nbytes").alias("bytes"))
                  .orderBy(F.desc("messages"), "key").limit(top).collect())]
    finally:
        df.unpersist()
    return {"total": total, "per_minute": per_minute, "per_partition": per_partition,
            "top_keys": top_keys}


def format_stats(result: dict[str, Any]) -> str:
    t = result["total"]
    lines = [f"messages {t['messages']}  bytes {t['bytes']}  first {t['first']}  "
             f"last {t['last']}", "", "minute (UTC)          messages        bytes"]
    for r in result["per_minute"]:
        lines.append(f"{r['minute']!s:20}  {r['messages']:>8}  {r['bytes']:>11}")
    if result.get("per_partition"):
        lines += ["", "partition             messages        bytes  offsets"]
        for r in result["per_partition"]:
            lines.append(f"{r['partition']!s:20}  {r['messages']:>8}  {r['bytes']:>11}  "
                         f"{r['first_offset']}-{r['last_offset']}")
    if result["top_keys"]:
        lines += ["", "top keys               messages        bytes"]
        for r in result["top_keys"]:
            k = r["key"]
            ks = k.decode("utf-8", "backslashreplace") if isinstance(k, bytes | bytearray) else k
            lines.append(f"{ks!s:20}  {r['messages']:>8}  {r['bytes']:>11}")
    return "\n".join(lines)


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()
