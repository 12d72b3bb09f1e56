"""``nsqx``: the admin command. One function per subcommand group adds its parsers.

    nsqx spark archive --nsqd 127.0.0.1:4151 --topic events --to ./archive/events
    nsqx spark stats --nsqd 127.0.0.1:4151 --topic events --from 2026-11-22T10:00
    nsqx bench --nsqd 127.0.0.1:4150,127.0.0.1:4151 --nsqd 127.0.0.1:5150,127.0.0.1:5151

To add a group: write ``add_<group>_commands(subparsers)`` that registers its parser with
``set_defaults(func=...)`` for every leaf command, and list it in ``GROUPS``.

Spark jobs run on ``local[*]`` unless ``--master`` says otherwise; on a cluster, submit this
file with ``spark-submit`` (``spark-submit --master URL .../nsqx/cli/nsqx_cmd.py spark archive
...``) with nsqx installed in the Python the executors run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main", "build_parser", "add_spark_commands", "add_bench_commands", "GROUPS"]


def _kv(value: str) -> tuple[str, str]:
    k, sep, v = value.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return k, v


def _source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--nsqd", help="nsqd HTTP address(es), host:port, comma separated")
    g.add_argument("--lookupd", help="nsqlookupd HTTP address(es), comma separated")
    p.add_argument("--option", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="extra option for the nsq data source (e.g. authSecret=..., "
                        "failOnDataLoss=false); may be repeated")
    p.add_argument("--master", help="Spark master URL (default local[*]; under spark-submit, "
                                    "spark-submit's)")
    p.add_argument("--conf", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="Spark configuration; may be repeated")


def _spark(args: argparse.Namespace, name: str) -> Any:
    from nsqx.spark.jobs import spark_session

    spark = spark_session(args.master, f"nsqx-{name}", dict(args.conf))
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _need_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not args.nsqd and not args.lookupd:
        parser.error("one of --nsqd or --lookupd is required")


def cmd_spark_archive(args: argparse.Namespace) -> int:
    from nsqx.spark.jobs import run_archive

    spark = _spark(args, "archive")
    try:
        return run_archive(
            spark, topic=args.topic, to=args.to, nsqd=args.nsqd, lookupd=args.lookupd,
            fmt=args.format, checkpoint=args.checkpoint, available_now=args.available_now,
            trigger_seconds=args.trigger_seconds,
            max_offsets_per_trigger=args.max_offsets_per_trigger,
            starting_offsets=args.starting_offsets, options=dict(args.option),
            progress=lambda s: print(s, flush=True))
    finally:
        spark.stop()


def cmd_spark_stats(args: argparse.Namespace) -> int:
    from nsqx.spark.jobs import format_stats, parse_time_ms, stats

    try:
        start_ms, end_ms = parse_time_ms(args.from_), parse_time_ms(args.to)
    except ValueError as exc:
        print(f"nsqx spark stats: {exc}", file=sys.stderr)
        return 2
    spark = _spark(args, "stats")
    try:
        result = stats(spark, topic=args.topic, nsqd=args.nsqd, lookupd=args.lookupd,
                       archive_dir=args.archive, start_ms=start_ms, end_ms=end_ms,
                       top=args.top, options=dict(args.option))
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(result, default=lambda o: o.decode("utf-8", "backslashreplace")
                         if isinstance(o, bytes | bytearray) else str(o)))
    else:
        print(format_stats(result))
    return 0


def add_spark_commands(sub: Any) -> None:
    """``nsqx spark archive|stats``."""
    spark = sub.add_parser("spark", help="data pipeline jobs on Apache Spark",
                           description="Spark jobs on the nsq data source (nsqx.spark).")
    ssub = spark.add_subparsers(dest="spark_command", metavar="COMMAND")
    spark.set_defaults(func=lambda a: (spark.print_help(), 2)[1])

    p = ssub.add_parser("archive", help="archive a topic to Parquet, exactly once (streaming)",
                        description="Stream a topic into DIR as Parquet partitioned by "
                                    "date/hour; offsets live in the checkpoint, so a restart "
                                    "resumes without loss or duplicates.")
    _source_args(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (or URI)")
    p.add_argument("--format", default="parquet", help="file format (default parquet)")
    p.add_argument("--checkpoint", metavar="DIR", help="checkpoint (default DIR/_checkpoint)")
    p.add_argument("--available-now", action="store_true",
                   help="archive what is there now, then exit (Trigger.AvailableNow)")
    p.add_argument("--trigger-seconds", type=float, default=None,
                   help="micro-batch interval (default: as fast as data comes)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--starting-offsets", default="earliest",
                   help="earliest (default), latest or JSON; used only without a checkpoint")
    p.set_defaults(func=lambda a: (_need_source(a, p), cmd_spark_archive(a))[1])

    p2 = ssub.add_parser("stats", help="messages/bytes per minute and top keys (batch)",
                         description="Batch statistics over a topic (or its archive).")
    _source_args(p2)
    p2.add_argument("--topic")
    p2.add_argument("--archive", metavar="DIR", help="read this archive instead of the topic")
    p2.add_argument("--from", dest="from_", metavar="TIME",
                    help="start: ms since the epoch or ISO 8601 (UTC)")
    p2.add_argument("--to", metavar="TIME", help="end (exclusive)")
    p2.add_argument("--top", type=int, default=10, help="how many top keys (default 10)")
    p2.add_argument("--json", action="store_true", help="print JSON")

    def run_stats(a: argparse.Namespace) -> int:
        if not a.archive:
            _need_source(a, p2)
            if not a.topic:
                p2.error("--topic is required (or --archive)")
        return cmd_spark_stats(a)

    p2.set_defaults(func=run_stats)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run one scenario against each address in turn; print rates and the ratio."""
    from nsqx.benchmark import scenarios

    targets = [a.split(",", 1) for a in args.nsqd]
    results = []
    for tcp, http in targets:
        topic = f"{args.topic}{len(results)}"
        scenarios.http_post(http, f"/topic/create?topic={topic}")
        scenarios.http_post(http, f"/channel/create?topic={topic}&channel=bench")
        if args.scenario == "pub":
            r = scenarios.pub_latency(tcp, topic, size=args.size, seconds=args.seconds)
        else:
            r = scenarios.ingest(tcp, topic, size=args.size, batch=args.batch,
                                 seconds=args.seconds, writers=args.writers)
            if args.scenario == "drain":
                scenarios.wait_depth(http, topic, "bench", r["messages"])
                r = scenarios.drain(tcp, topic, "bench", expect=r["messages"],
                                    seconds=args.seconds * 10)
        extra = (f"  p50 {r['p50_us']:.0f}us p99 {r['p99_us']:.0f}us p999 {r['p999_us']:.0f}us"
                 if "p50_us" in r else "")
        print(f"{tcp}: {args.scenario} {r['msgs_per_s']:,.0f} msgs/s {r['mb_per_s']:.1f} MB/s"
              f" ({r['messages']:,} msgs){extra}", flush=True)
        if r["errors"]:
            print(f"  errors: {r['errors']}", file=sys.stderr)
        results.append(r["msgs_per_s"])
    if len(results) == 2 and results[1]:
        print(f"ratio {targets[0][0]} / {targets[1][0]}: {results[0] / results[1]:.2f}x")
    return 0


def add_bench_commands(sub: Any) -> None:
    """``nsqx bench``: load any NSQ-compatible nsqd (or two, side by side)."""
    p = sub.add_parser(
        "bench", help="benchmark NSQ-compatible nsqd(s)",
        description="Load one or two nsqd with pre-encoded raw-socket clients and print msgs/s "
                    "(and the ratio of the first to the second). Scenarios: ingest (MPUB), "
                    "drain (ingest, then consume it with RDY 2500 and FIN each), pub (one PUB "
                    "at a time, with latency percentiles).")
    p.add_argument("--nsqd", action="append", required=True, metavar="TCP,HTTP",
                   help="tcp_host:port,http_host:port of an nsqd; give it twice to compare")
    p.add_argument("--scenario", choices=["ingest", "drain", "pub"], default="ingest")
    p.add_argument("--size", type=int, default=200, help="message size in bytes (default 200)")
    p.add_argument("--batch", type=int, default=200, help="messages per MPUB (default 200)")
    p.add_argument("--seconds", type=float, default=10.0, help="duration (default 10)")
    p.add_argument("--writers", type=int, default=2, help="writer processes (default 2)")
    p.add_argument("--topic", default="nsqx_bench", help="topic prefix (default nsqx_bench)")
    p.set_defaults(func=cmd_bench)


GROUPS: list[Callable[[Any], None]] = [add_spark_commands, add_bench_commands]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nsqx", description="nsqx administration")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in GROUPS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
