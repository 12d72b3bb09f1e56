"""``nsqx``: the admin command. One function per subcommand group adds its parsers.

    nsqx spark archive --nsqd 127.0.0.1:4151 --topic events --to ./archive/events
    nsqx spark stats --nsqd 127.0.0.1:4151 --topic events --from 2026-11-22T10:00
    nsqx bench --nsqd 127.0.0.1:4150,127.0.0.1:4151 --nsqd 127.0.0.1:5150,127.0.0.1:5151
    nsqx channel reset orders billing --to-time 2026-11-24T10:00 --nsqd-http-address 127.0.0.1:4151
    nsqx message get orders 000000000000002a --nsqd-http-address 127.0.0.1:4151
    nsqx trace get orders --id 000000000000002a --nsqd-http-address 127.0.0.1:4151
    nsqx spark trace-report --nsqd 127.0.0.1:4151 --out ./trace-report
    nsqx cluster up --nodes 3; nsqx cluster status; nsqx node drain NODE_ID
    nsqx archive ls orders --archive-url /mnt/archive

To add a group: write ``add_<group>_commands(subparsers)`` that registers its parser with
``set_defaults(func=...)`` for every leaf command, and list it in ``GROUPS``.

Spark jobs run on ``local[*]`` unless ``--master`` says otherwise; on a cluster, submit this
file with ``spark-submit`` (``spark-submit --master URL .../nsqx/cli/nsqx_cmd.py spark archive
...``) with nsqx installed in the Python the executors run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from nsqx import NSQ_VERSION, __version__
from nsqx.benchmark import scenarios
from nsqx.cli.archive_cmd import add_archive_commands
from nsqx.cli.cluster_cmd import add_cluster_commands, add_node_commands
from nsqx.cli.common import (
    AUTH_SECRET_ENV,
    LOCAL_NSQD_HTTP,
    LOCAL_NSQD_TCP,
    command_group,
    default_to_local,
    help_when_bare,
    http_call,
    http_failed,
    option,
)
from nsqx.cli.import_cmd import add_import_commands
from nsqx.cli.topic_cmd import add_topic_commands
from nsqx.cli.trace_cmd import add_trace_commands
from nsqx.spark.jobs import format_stats, parse_time_ms, run_archive, spark_session, stats
from nsqx.spark.trace_report import format_report, trace_report

__all__ = ["main", "build_parser", "add_spark_commands", "add_bench_commands",
           "add_channel_commands", "add_message_commands", "GROUPS"]


def _kv(value: str) -> tuple[str, str]:
    k, sep, v = value.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return k, v


def _source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--nsqd", help="nsqd HTTP address(es), host:port, comma separated "
                                  f"(default {LOCAL_NSQD_HTTP} unless --lookupd)")
    g.add_argument("--lookupd", help="nsqlookupd HTTP address(es), comma separated")
    p.add_argument("--option", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="extra option for the nsq data source (e.g. authSecret=..., "
                        "failOnDataLoss=false); may be repeated")
    p.add_argument("--master", help="Spark master URL (default local[*]; under spark-submit, "
                                    "spark-submit's)")
    p.add_argument("--conf", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="Spark configuration; may be repeated")


def _spark(args: argparse.Namespace, name: str) -> Any:
    spark = spark_session(args.master, f"nsqx-{name}", dict(args.conf))
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _need_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not args.nsqd and not args.lookupd:
        parser.error("one of --nsqd or --lookupd is required")


def cmd_spark_archive(args: argparse.Namespace) -> int:
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


def cmd_spark_trace_report(args: argparse.Namespace) -> int:
    spark = _spark(args, "trace-report")
    try:
        summary = trace_report(spark, out=args.out, nsqd=args.nsqd, lookupd=args.lookupd,
                               topic=args.topic, top=args.top, options=dict(args.option))
    finally:
        spark.stop()
    print(json.dumps(summary) if args.json else format_report(summary))
    if not args.json:
        print(f"report: {args.out}/summary.html (tables: deliveries/, channels/, consumers/)")
    return 0


def add_spark_commands(sub: Any) -> None:
    """``nsqx spark archive|stats|trace-report``."""
    spark = sub.add_parser("spark", help="data pipeline jobs on Apache Spark",
                           description="Spark jobs on the nsq data source (nsqx.spark).")
    ssub = spark.add_subparsers(dest="spark_command", metavar="COMMAND")
    help_when_bare(spark)

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

    p2 = ssub.add_parser("stats", help="messages/bytes per minute, per partition, top keys (batch)",
                         description="Batch statistics over a topic (or its archive).")
    _source_args(p2)
    p2.add_argument("--topic")
    p2.add_argument("--archive", metavar="DIR", help="read this archive instead of the topic")
    p2.add_argument("--from", dest="from_", metavar="TIME",
                    help="start: ms since the epoch or ISO 8601 (UTC)")
    p2.add_argument("--to", metavar="TIME", help="end (exclusive)")
    p2.add_argument("--top", type=int, default=10, help="how many top keys (default 10)")
    p2.add_argument("--json", action="store_true", help="print JSON")

    p3 = ssub.add_parser(
        "trace-report", help="delivery latency, redeliveries, slowest consumers from __trace",
        description="Read the trace events of an nsqd (its __trace topic) and write per-"
                    "delivery, per-channel and per-consumer tables (Parquet) plus "
                    "summary.html/summary.json to DIR: pub->deliver and deliver->fin "
                    "percentiles, redelivery rates, slowest consumers.")
    _source_args(p3)
    p3.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p3.add_argument("--topic", help="only this traced topic's messages")
    p3.add_argument("--top", type=int, default=10, help="slowest consumers listed (default 10)")
    p3.add_argument("--json", action="store_true", help="print the summary as JSON")
    p3.set_defaults(func=lambda a: (_need_source(a, p3), cmd_spark_trace_report(a))[1])

    def run_stats(a: argparse.Namespace) -> int:
        if not a.archive:
            _need_source(a, p2)
            if not a.topic:
                p2.error("--topic is required (or --archive)")
        return cmd_spark_stats(a)

    p2.set_defaults(func=run_stats)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run one scenario against each address in turn; print rates and the ratio."""
    targets = [a.split(",", 1) for a in args.nsqd or [f"{LOCAL_NSQD_TCP},{LOCAL_NSQD_HTTP}"]]
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
    p.add_argument("--nsqd", action="append", metavar="TCP,HTTP",
                   help="tcp_host:port,http_host:port of an nsqd; give it twice to compare "
                        f"(default {LOCAL_NSQD_TCP},{LOCAL_NSQD_HTTP})")
    p.add_argument("--scenario", choices=["ingest", "drain", "pub"], default="ingest")
    p.add_argument("--size", type=int, default=200, help="message size in bytes (default 200)")
    p.add_argument("--batch", type=int, default=200, help="messages per MPUB (default 200)")
    p.add_argument("--seconds", type=float, default=10.0, help="duration (default 10)")
    p.add_argument("--writers", type=int, default=2, help="writer processes (default 2)")
    p.add_argument("--topic", default="nsqx_bench", help="topic prefix (default nsqx_bench)")
    p.set_defaults(func=cmd_bench)


def cmd_channel_reset(args: argparse.Namespace) -> int:
    """POST /channel/setoffset with the position the flags name."""
    prog = "nsqx channel reset"
    if args.to_time is not None:
        try:
            ms = parse_time_ms(args.to_time)
        except ValueError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        assert ms is not None
        if ms < 0:
            print(f"{prog}: --to-time before 1970", file=sys.stderr)
            return 2
        position = f"timestamp:{ms // 1000}"
    elif args.to_offset is not None:
        position = f"msgcount:{args.to_offset}"
    else:
        position = "earliest" if args.earliest else "latest"
    params = {"topic": args.topic, "channel": args.channel}
    if args.partition is not None:
        params["partition"] = str(args.partition)
    lookupd = args.lookupd_http_address
    if lookupd and position.startswith("msgcount:"):
        print(f"{prog}: through nsqlookupd a route-managed topic's channel is reset on every "
              f"partition: use --to-time, --earliest or --latest", file=sys.stderr)
        return 2
    got = http_call(prog, "POST", lookupd or args.nsqd_http_address, "/channel/setoffset",
                     params, position.encode())
    if got is None:
        return 1
    status, data, _ = got
    if status != 200:
        if lookupd:
            try:
                doc = json.loads(data)
                msg = doc["message"] + (f": {doc['detail']}" if doc.get("detail") else "")
            except (ValueError, KeyError, TypeError):
                msg = data.decode("utf-8", "replace").strip()[:300]
            print(f"{prog}: nsqlookupd answered {status} {msg}", file=sys.stderr)
            return 1
        return http_failed(prog, status, data)
    doc = json.loads(data)
    if args.json:
        print(json.dumps(doc))
        return 0
    if lookupd:  # a cluster reset of a route-managed topic's channel
        print(f"{doc['topic']}/{doc['channel']}: reset on every node (reset {doc['gen']}), "
              f"walking route versions again from version {doc['route_version']}")
        for p, off in doc["partitions"].items():
            note = " (beyond its command message)" if int(p) in doc["passed"] else ""
            print(f"  partition {p}: offset {off}{note}")
        if doc.get("unapplied"):
            print(f"  not confirmed by {', '.join(doc['unapplied'])} (they apply it from "
                  f"etcd)", file=sys.stderr)
        return 0
    print(f"{doc['topic']}/{doc['channel']} partition {doc['partition']}: reset to offset "
          f"{doc['offset']} (log holds {doc['earliest']}..{doc['latest']})")
    if doc.get("clamped"):
        print("  the position was before the oldest kept message: moved up to it")
    if not doc.get("persisted", True):
        print("  ephemeral: the position is kept in memory only")
    return 0


def add_channel_commands(sub: Any) -> None:
    """``nsqx channel reset``: replay or skip a channel by moving its cursor."""
    csub = command_group(sub, "channel", "channel administration (reset = replay/skip)",
                         "Channel administration through nsqd's HTTP API.")
    p = csub.add_parser(
        "reset", help="move a channel to a time, an offset, the start or the end of its log",
        description="Move CHANNEL of TOPIC so that it delivers again from a point of the log "
                    "(replay) or skips ahead (POST /channel/setoffset).\n\n"
                    "Messages in flight are forgotten (a late FIN of one fails), finished ones "
                    "from the new position on are delivered again, a paused channel stays "
                    "paused. The new position is on disk before this returns.",
        epilog="examples:\n"
               "  nsqx channel reset orders billing --to-time 2026-11-24T10:00 "
               "--nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx channel reset orders billing --to-offset 1200 --partition 0 "
               "--nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx channel reset orders billing --latest --nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx channel reset orders billing --earliest --lookupd-http-address "
               "127.0.0.1:4161")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("channel", metavar="CHANNEL")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-time", metavar="TIME",
                       help="the first message stored at or after TIME: ISO 8601 (UTC unless "
                            "it says, e.g. 2026-11-24T10:00 or 2026-11-24T10:00+01:00) or ms "
                            "since the epoch; a seek in the time index, whole seconds")
    where.add_argument("--to-offset", metavar="N", type=_offset_arg,
                       help="log offset N (the partition's N-th message, 0-based; Youzan's "
                            "msgcount); before the oldest kept message means that one, past "
                            "the end is refused")
    where.add_argument("--earliest", action="store_true",
                       help="the oldest message the log still keeps")
    where.add_argument("--latest", action="store_true",
                       help="the end of the log: only messages published from now on")
    p.add_argument("--partition", type=_offset_arg, metavar="P",
                   help="partition of the topic (default 0)")
    at = p.add_mutually_exclusive_group()
    at.add_argument("--nsqd-http-address", metavar="HOST:PORT",
                    help="HTTP address of the nsqd that holds the partition (default "
                         f"{LOCAL_NSQD_HTTP} unless --lookupd-http-address)")
    at.add_argument("--lookupd-http-address", metavar="HOST:PORT",
                    help="a cluster's nsqlookupd: resets a route-managed ordered topic's "
                         "channel on every node at once (--to-time, --earliest, --latest)")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=cmd_channel_reset)


def _offset_arg(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return int(value)


def cmd_message_get(args: argparse.Namespace) -> int:
    """GET /message/get by id or offset; print it (or its JSON, or the raw body)."""
    prog = "nsqx message get"
    if (args.id is None) == (args.offset is None):
        print(f"{prog}: give either a message ID or --offset N", file=sys.stderr)
        return 2
    params = {"topic": args.topic}
    if args.id is not None:
        params.update(search_mode="id", search_pos=args.id)
    else:
        params.update(search_mode="count", search_pos=str(args.offset))
    if args.partition is not None:
        params["partition"] = str(args.partition)
    if args.raw:
        params["raw"] = "1"
    got = http_call(prog, "GET", args.nsqd_http_address, "/message/get", params)
    if got is None:
        return 1
    status, data, _ = got
    if status != 200:
        return http_failed(prog, status, data)
    if args.raw:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    doc = json.loads(data)
    if args.json:
        print(json.dumps(doc))
        return 0
    print(format_message(doc))
    return 0


def format_message(doc: dict[str, Any]) -> str:
    """/message/get's JSON for a terminal: metadata, headers, then the body."""
    import base64
    from datetime import UTC, datetime

    ts = int(doc["timestamp"])
    when = datetime.fromtimestamp(ts / 1e9, UTC).isoformat(timespec="microseconds")
    lines = [f"id         {doc['id']}", f"partition  {doc['partition']}",
             f"offset     {doc['offset']}", f"timestamp  {when} ({ts} ns)",
             f"attempts   {doc['attempts']}"]
    b64h = set(doc.get("headers_base64") or ())
    for k, v in sorted((doc.get("headers") or {}).items()):
        lines.append(f"header     {k}: {v}" + (" (base64)" if k in b64h else ""))
    if doc.get("body_encoding") == "base64":
        size = len(base64.b64decode(doc["body"]))
        lines.append(f"body       {size} bytes, not UTF-8, base64 (use --raw for the bytes):")
    else:
        lines.append(f"body       {len(doc['body'].encode())} bytes:")
    lines.append(doc["body"])
    return "\n".join(lines)


def add_message_commands(sub: Any) -> None:
    """``nsqx message get``: read one message of a topic's log."""
    msub = command_group(sub, "message", "look a message up in a topic's log",
                         "Message lookup through nsqd's HTTP API.")
    p = msub.add_parser(
        "get", help="print one message by id or offset (body, time, attempts, headers)",
        description="Read one message of TOPIC from the log, whether or not a channel has "
                    "consumed it (GET /message/get). Messages removed by retention are not "
                    "found.",
        epilog="examples:\n"
               "  nsqx message get orders 000000000000002a --nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx message get orders --offset 42 --partition 0 --raw "
               "--nsqd-http-address 127.0.0.1:4151 > body.bin")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("id", metavar="ID", nargs="?",
                   help="the message id a consumer received (16 hex digits; it names the "
                        "partition and offset)")
    p.add_argument("--offset", type=_offset_arg, metavar="N", help="log offset instead of an id")
    p.add_argument("--partition", type=_offset_arg, metavar="P",
                   help="partition for --offset (default 0)")
    p.add_argument("--nsqd-http-address", metavar="HOST:PORT", default=LOCAL_NSQD_HTTP,
                   help="HTTP address of the nsqd that holds the partition (default "
                        f"{LOCAL_NSQD_HTTP})")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print nsqd's JSON answer")
    out.add_argument("--raw", action="store_true", help="write the body's bytes to stdout")
    p.set_defaults(func=cmd_message_get)


GROUPS: list[Callable[[Any], None]] = [add_spark_commands, add_bench_commands,
                                       add_channel_commands, add_message_commands,
                                       add_topic_commands, add_cluster_commands,
                                       add_node_commands, add_trace_commands,
                                       add_import_commands, add_archive_commands]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nsqx", description="nsqx administration")
    parser.add_argument("--version", action="version",
                        version=f"nsqx {__version__} (speaks NSQ {NSQ_VERSION})")
    parser.add_argument("--auth-secret", metavar="SECRET",
                        help="secret sent to nodes with --auth-http-address (as "
                             "'Authorization: Bearer SECRET'); the environment variable "
                             f"{AUTH_SECRET_ENV} does the same without showing it in ps")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in GROUPS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    default_to_local(args)
    func = option(args, "func")
    if func is None:
        parser.print_help()
        return 2
    if args.auth_secret is None:
        return int(func(args) or 0)
    before = os.environ.get(AUTH_SECRET_ENV)
    os.environ[AUTH_SECRET_ENV] = args.auth_secret  # what every request of the CLI reads
    try:
        return int(func(args) or 0)
    finally:
        if before is None:
            del os.environ[AUTH_SECRET_ENV]
        else:
            os.environ[AUTH_SECRET_ENV] = before


if __name__ == "__main__":
    sys.exit(main())
