"""``nsqx spark trace-report``: delivery latencies, redeliveries and slow consumers from the
trace events nsqd records in its ``__trace`` topic (format: docs/design-notes.md, "Headers,
tags, tracing").

    nsqx spark trace-report --nsqd 127.0.0.1:4151 --out ./trace-report [--topic orders]

Reads ``__trace`` with the ``nsq`` source (a batch read of what is there now), expands
events that cover runs of offsets to one row per message, and pairs every ``deliver`` with
what ended that attempt (the next ``fin``/``req``/``timeout``/``dlq`` of the same message on
the same channel). Writes, under ``--out``:

- ``deliveries/`` (Parquet): one row per delivery: topic, channel, partition, offset,
  attempts, client id/address, deliver time, outcome, outcome time, ``handle_ms`` (deliver ->
  outcome), ``pub_to_deliver_ms`` (publish -> this delivery);
- ``channels/`` (Parquet): per topic and channel: messages, deliveries, redelivered
  messages and ``redelivery_rate`` (their share of the messages), fin/req/timeout/dlq
  counts, p50/p90/p99/max of pub -> first delivery and of deliver -> fin (ms);
- ``consumers/`` (Parquet): per client: deliveries, outcomes, deliver -> fin p50/p99/mean,
  slowest first;
- ``summary.json`` and ``summary.html`` (the same numbers, for people).

Percentiles are exact (Spark's ``percentile``, linear interpolation). Events of messages
published before the scanned range have no publish time (``pub_to_deliver_ms`` null).
"""

from __future__ import annotations

import html
import json
import os
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from nsqx.spark.jobs import source_options

__all__ = ["EVENT_SCHEMA_DDL", "trace_report", "format_report"]

TRACE_TOPIC = "__trace"
EVENT_SCHEMA_DDL = (
    "ts LONG, event STRING, topic STRING, `partition` INT, `offset` LONG, `count` LONG, "
    "id STRING, node STRING, producer STRING, trace_id DECIMAL(20,0), channel STRING, "
    "client STRUCT<id: LONG, addr: STRING>, attempts INT, delay_ms LONG")
OUTCOMES = ("fin", "req", "timeout", "dlq")
PCTS = (0.5, 0.9, 0.99)


def events(spark: Any, *, nsqd: str | None = None, lookupd: str | None = None,
           options: dict[str, str] | None = None) -> Any:
    """``__trace`` as one row per (event, message): ranges expanded, times in ns."""
    from pyspark.sql import functions as F

    raw = (spark.read.format("nsq")
           .options(**source_options(nsqd=nsqd, lookupd=lookupd, topic=TRACE_TOPIC,
                                     extra=options))
           .load())
    ev = raw.select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA_DDL).alias("e")) \
        .select("e.*").where(F.col("event").isNotNull() & F.col("offset").isNotNull())
    n = F.greatest(F.coalesce(F.col("count"), F.lit(1)), F.lit(1))
    return (ev.withColumn("offset", F.explode(F.sequence(F.col("offset"),
                                                         F.col("offset") + n - 1)))
              .drop("count"))


def trace_report(spark: Any, *, out: str, nsqd: str | None = None, lookupd: str | None = None,
                 topic: str | None = None, top: int = 10,
                 options: dict[str, str] | None = None) -> dict[str, Any]:
    """Build the report (tables + summary files under ``out``); returns the summary."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ev = events(spark, nsqd=nsqd, lookupd=lookupd, options=options)
    if topic:
        ev = ev.where(F.col("topic") == topic)
    ev = ev.cache()
    try:
        key = ["topic", "partition", "offset"]
        pubs = (ev.where(F.col("event") == "pub").groupBy(*key)
                  .agg(F.min("ts").alias("pub_ts")))
        chan = ev.where(F.col("event").isin("deliver", *OUTCOMES) & F.col("channel").isNotNull())
        w = Window.partitionBy("topic", "channel", "partition", "offset").orderBy("ts")
        paired = (chan.withColumn("outcome", F.lead("event").over(w))
                      .withColumn("outcome_ts", F.lead("ts").over(w))
                      .where(F.col("event") == "deliver")
                      .withColumn("outcome", F.when(F.col("outcome").isin(*OUTCOMES),
                                                    F.col("outcome")))
                      .withColumn("outcome_ts", F.when(F.col("outcome").isNotNull(),
                                                       F.col("outcome_ts"))))
        deliveries = (paired.join(pubs, key, "left").select(
            "topic", "channel", "partition", "offset", "id", "attempts",
            F.col("client.id").alias("client_id"), F.col("client.addr").alias("client_addr"),
            F.col("ts").alias("deliver_ts"), "outcome", "outcome_ts",
            ((F.col("outcome_ts") - F.col("ts")) / 1e6).alias("handle_ms"),
            ((F.col("ts") - F.col("pub_ts")) / 1e6).alias("pub_to_deliver_ms"),
            "pub_ts", "node")).cache()
        deliveries.write.mode("overwrite").parquet(os.path.join(out, "deliveries"))

        def pct(col: str, name: str) -> list[Any]:
            return [F.percentile(col, p).alias(f"{name}_p{int(p * 100)}") for p in PCTS] + [
                F.max(col).alias(f"{name}_max")]

        first = (deliveries.where(F.col("attempts") == 1)
                 .groupBy("topic", "channel")
                 .agg(*pct("pub_to_deliver_ms", "pub_to_deliver_ms")))
        per_msg = (deliveries.groupBy("topic", "channel", "partition", "offset")
                   .agg(F.count(F.lit(1)).alias("n")))
        counts = (per_msg.groupBy("topic", "channel")
                  .agg(F.count(F.lit(1)).alias("messages"),
                       F.sum("n").alias("deliveries"),
                       F.sum(F.when(F.col("n") > 1, 1).otherwise(0)).alias("redelivered_messages")))
        outcomes = (ev.where(F.col("event").isin(*OUTCOMES) & F.col("channel").isNotNull())
                    .groupBy("topic", "channel").pivot("event", list(OUTCOMES))
                    .agg(F.count(F.lit(1))).na.fill(0))
        handle = (deliveries.where(F.col("outcome") == "fin").groupBy("topic", "channel")
                  .agg(*pct("handle_ms", "deliver_to_fin_ms")))
        channels = (counts.join(outcomes, ["topic", "channel"], "left")
                    .join(first, ["topic", "channel"], "left")
                    .join(handle, ["topic", "channel"], "left")
                    .withColumn("redelivery_rate",
                                F.col("redelivered_messages") / F.col("messages"))
                    .orderBy("topic", "channel")).cache()
        channels.write.mode("overwrite").parquet(os.path.join(out, "channels"))
        consumers = (deliveries.groupBy("topic", "channel", "client_id", "client_addr")
                     .agg(F.count(F.lit(1)).alias("deliveries"),
                          *[F.sum(F.when(F.col("outcome") == o, 1).otherwise(0)).alias(o)
                            for o in OUTCOMES],
                          F.percentile(F.when(F.col("outcome") == "fin", F.col("handle_ms")),
                                       0.5).alias("deliver_to_fin_ms_p50"),
                          F.percentile(F.when(F.col("outcome") == "fin", F.col("handle_ms")),
                                       0.99).alias("deliver_to_fin_ms_p99"),
                          F.avg(F.when(F.col("outcome") == "fin", F.col("handle_ms")))
                          .alias("deliver_to_fin_ms_mean"))
                     .orderBy(F.desc_nulls_last("deliver_to_fin_ms_p50"), F.desc("timeout"),
                              "client_id")).cache()
        consumers.write.mode("overwrite").parquet(os.path.join(out, "consumers"))
        span = ev.agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("first"),
                      F.max("ts").alias("last")).collect()[0]
        summary = {
            "generated": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": nsqd or lookupd, "topic": topic,
            "message_events": span["n"], "first_ts": span["first"], "last_ts": span["last"],
            "channels": [_plain(r.asDict()) for r in channels.collect()],
            "slowest_consumers": [_plain(r.asDict()) for r in consumers.limit(top).collect()],
        }
        deliveries.unpersist()
        channels.unpersist()
        consumers.unpersist()
    finally:
        ev.unpersist()
    write_text(spark, os.path.join(out, "summary.json"), json.dumps(summary, indent=1))
    write_text(spark, os.path.join(out, "summary.html"), _html(summary))
    return summary


def write_text(spark: Any, path: str, text: str) -> None:
    """Write a small file next to the tables the executors wrote: a plain path with
    ``open()``, a URI (``hdfs://``, ``s3a://``, ``file://``: what a job on a cluster is
    given, as the executors' local disks are not the driver's) through Spark's Hadoop file
    system, which ``open()`` cannot reach."""
    if ":" not in path.split("/", 1)[0]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON takes it: Spark's decimals (``percentile_approx`` of a decimal) as floats."""
    return {k: (float(v) if isinstance(v, Decimal) else v) for k, v in d.items()}


def _ms(v: Any) -> str:
    return "" if v is None else f"{v:,.1f}"


_CH_COLS = [("topic", "topic"), ("channel", "channel"), ("messages", "messages"),
            ("deliveries", "deliveries"), ("redelivery_rate", "redelivered"),
            ("fin", "fin"), ("req", "req"), ("timeout", "timeout"), ("dlq", "dlq"),
            ("pub_to_deliver_ms_p50", "pub→deliver p50"),
            ("pub_to_deliver_ms_p99", "p99"), ("pub_to_deliver_ms_max", "max"),
            ("deliver_to_fin_ms_p50", "deliver→fin p50"), ("deliver_to_fin_ms_p99", "p99"),
            ("deliver_to_fin_ms_max", "max")]
_CO_COLS = [("topic", "topic"), ("channel", "channel"), ("client_addr", "client"),
            ("client_id", "id"), ("deliveries", "deliveries"), ("fin", "fin"), ("req", "req"),
            ("timeout", "timeout"), ("deliver_to_fin_ms_p50", "deliver→fin p50"),
            ("deliver_to_fin_ms_p99", "p99"), ("deliver_to_fin_ms_mean", "mean")]


def _cell(k: str, v: Any) -> str:
    if v is None:
        return ""
    if k == "redelivery_rate":
        return f"{100 * v:.1f}%"
    if k.endswith(("_p50", "_p90", "_p99", "_max", "_mean")):
        return _ms(v)
    return html.escape(str(v))


def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(k, r.get(k))}</td>" for k, _ in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html(s: dict[str, Any]) -> str:
    def when(ns: int | None) -> str:
        return "" if ns is None else datetime.fromtimestamp(ns / 1e9, UTC).isoformat(
            timespec="seconds")

    return f"""<!doctype html><html><head><meta charset="utf-8"><title>nsqx trace report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:right}}th{{background:#eee}}</style>
</head><body><h1>nsqx trace report</h1>
<p>{s['message_events']} message events from {html.escape(str(s['source']))}, {when(s['first_ts'])} to
{when(s['last_ts'])} (UTC){' for topic ' + html.escape(s['topic']) if s['topic'] else ''};
generated {s['generated']}. Latencies in ms; "redelivered" is the share of messages
delivered more than once.</p>
<h2>Channels</h2>{_table(s['channels'], _CH_COLS)}
<h2>Slowest consumers</h2><p>By median deliver → FIN time, then timeouts.</p>
{_table(s['slowest_consumers'], _CO_COLS)}
</body></html>
"""


def format_report(s: dict[str, Any]) -> str:
    """The summary for a terminal."""
    lines = [f"{s['message_events']} message events (trace events expanded per message)"]
    for c in s["channels"]:
        lines.append(
            f"{c['topic']}/{c['channel']}: {c['messages']} messages, {c['deliveries']} "
            f"deliveries, redelivered {100 * (c['redelivery_rate'] or 0):.1f}%, "
            f"fin {c['fin']} req {c['req']} timeout {c['timeout']} dlq {c['dlq']}; "
            f"pub->deliver p50 {_ms(c['pub_to_deliver_ms_p50'])} p99 "
            f"{_ms(c['pub_to_deliver_ms_p99'])} ms; deliver->fin p50 "
            f"{_ms(c['deliver_to_fin_ms_p50'])} p99 {_ms(c['deliver_to_fin_ms_p99'])} ms")
    if s["slowest_consumers"]:
        lines.append("slowest consumers (deliver->fin p50 ms):")
        for c in s["slowest_consumers"]:
            lines.append(f"  {c['topic']}/{c['channel']} {c['client_addr']} (id {c['client_id']}):"
                         f" {_ms(c['deliver_to_fin_ms_p50'])} ms, {c['deliveries']} deliveries, "
                         f"{c['timeout']} timeouts")
    return "\n".join(lines)
