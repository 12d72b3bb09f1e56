"""``nsqx trace get|enable|disable``: message tracing through nsqd's HTTP API.

    nsqx trace enable orders --nsqd-http-address 127.0.0.1:4151
    nsqx trace get orders --id 000000000000002a --nsqd-http-address 127.0.0.1:4151
    nsqx trace get orders --trace-id 12345 --nsqd-http-address 127.0.0.1:4151
    nsqx trace get orders --header order_id:A-17 --nsqd-http-address 127.0.0.1:4151
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from nsqx.cli.common import command_group, http_call, http_failed

__all__ = ["add_trace_commands", "format_timeline"]


def _http(prog: str, method: str, address: str, path: str, params: dict[str, str]
          ) -> tuple[int, bytes] | None:
    got = http_call(prog, method, address, path, params, b"" if method == "POST" else None)
    return None if got is None else (got[0], got[1])


def _event_line(ev: dict[str, Any], t0: int) -> str:
    when = datetime.fromtimestamp(ev["ts"] / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]
    since = f"+{(ev['ts'] - t0) / 1e6:.1f}ms"
    parts = [f"{when} {since:>11}", f"{ev['event']:<8}"]
    if ev.get("channel"):
        parts.append(f"channel={ev['channel']}")
    client = ev.get("client")
    if client:
        parts.append(f"client={client.get('id')}" + (f"@{client['addr']}" if client.get("addr") else ""))
    if ev["event"] == "pub":
        parts.append(f"producer={ev.get('producer') or '?'}")
    if "attempts" in ev:
        parts.append(f"attempts={ev['attempts']}")
    if "delay_ms" in ev:
        parts.append(f"delay={ev['delay_ms']}ms")
    if ev.get("count", 1) > 1:
        parts.append(f"(batch of {ev['count']} from offset {ev['offset']})")
    parts.append(f"node={ev.get('node', '')}")
    return "  " + "  ".join(parts)


def format_timeline(doc: dict[str, Any]) -> str:
    """/trace/search's JSON for a terminal: each message, then its events in time order."""
    lines = []
    if not doc.get("traced"):
        lines.append(f"note: topic {doc['topic']} is not traced now (nsqx trace enable)")
    if not doc["messages"]:
        lines.append(f"no message of {doc['topic']} found")
    for m in doc["messages"]:
        head = f"message {m['id']}  partition {m['partition']}  offset {m['offset']}"
        if "trace_id" in m:
            head += f"  trace_id {m['trace_id']}"
        lines.append(head)
        if "timestamp" in m:
            ts = datetime.fromtimestamp(m["timestamp"] / 1e9, UTC).isoformat(timespec="milliseconds")
            lines.append(f"  published {ts}")
        for k, v in sorted((m.get("headers") or {}).items()):
            lines.append(f"  header {k}: {v}")
        evs = m["events"]
        if not evs:
            lines.append("  no trace events (not traced then, or older than the scan)")
        t0 = evs[0]["ts"] if evs else 0
        lines += [_event_line(ev, t0) for ev in evs]
    if doc.get("truncated"):
        lines.append(f"(scanned the newest {doc['scanned']} trace events only; --limit reads more)")
    return "\n".join(lines)


def cmd_trace_get(args: argparse.Namespace) -> int:
    prog = "nsqx trace get"
    params = {"topic": args.topic}
    if args.id is not None:
        params["id"] = args.id
    elif args.trace_id is not None:
        params["trace_id"] = str(args.trace_id)
    else:
        params["header"] = args.header
    if args.limit is not None:
        params["limit"] = str(args.limit)
    if bool(args.nsqd_http_address) == bool(args.lookupd_http_address):
        print(f"{prog}: give one of --nsqd-http-address (one node) and --lookupd-http-address "
              "(every node a lookupd knows)", file=sys.stderr)
        return 2
    addr = args.nsqd_http_address or args.lookupd_http_address
    got = _http(prog, "GET", addr, "/trace/search", params)
    if got is None:
        return 1
    status, data = got
    if status != 200:
        return http_failed(prog, status, data)
    doc = json.loads(data)
    if args.json:
        print(json.dumps(doc))
        found = doc["messages"] if args.nsqd_http_address else [
            m for n in doc["nodes"] for m in n["messages"] if m.get("events")]
        return 0 if found else 3
    if args.nsqd_http_address:
        print(format_timeline(doc))
        return 0 if doc["messages"] else 3
    # through nsqlookupd: each node's answer; a node without events for it is left out
    found = 0
    for n in doc["nodes"]:
        msgs = [m for m in n["messages"] if m.get("events")]
        if msgs:
            found += len(msgs)
            print(f"node {n['node']}:")
            print(format_timeline({**n, "messages": msgs}))
    for err in doc.get("errors") or ():
        print(f"note: {err}", file=sys.stderr)
    if not found:
        print(f"no traced message of {args.topic} found on {len(doc['nodes'])} node(s)")
    return 0 if found else 3


def cmd_trace_switch(args: argparse.Namespace, on: bool) -> int:
    prog = f"nsqx trace {'enable' if on else 'disable'}"
    got = _http(prog, "POST", args.nsqd_http_address, "/topic/trace",
                {"topic": args.topic, "enable": "true" if on else "false"})
    if got is None:
        return 1
    status, data = got
    if status != 200:
        return http_failed(prog, status, data)
    print(f"{args.topic}: tracing {'on' if on else 'off'}")
    return 0


def _nonneg(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return int(value)


def _header(value: str) -> str:
    key, sep, _ = value.partition(":")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY:VALUE, got {value!r}")
    return value


def add_trace_commands(sub: Any) -> None:
    """``nsqx trace get|enable|disable``."""
    tsub = command_group(sub, "trace", "message tracing: switch it per topic, read timelines",
                         "Message tracing through nsqd's HTTP API (events are kept in the "
                         "topic __trace of each nsqd).")
    p = tsub.add_parser(
        "get", help="print the timeline of a message (published, delivered, FIN/REQ/timeout)",
        description="Find TOPIC's messages by id, trace id or a header value and print what "
                    "happened to each (GET /trace/search; a scan of the newest trace events, "
                    "--limit of them). Exit status 3 when no message matched.",
        epilog="examples:\n"
               "  nsqx trace get orders --id 000000000000002a --nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx trace get orders --trace-id 12345 --nsqd-http-address 127.0.0.1:4151\n"
               "  nsqx trace get orders --header order_id:A-17 --nsqd-http-address 127.0.0.1:4151")
    p.add_argument("topic", metavar="TOPIC")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", metavar="ID", help="message id as consumers see it (16 hex)")
    which.add_argument("--trace-id", type=_nonneg, metavar="N",
                       help="trace id given with PUB_TRACE or the ##trace_id header")
    which.add_argument("--header", type=_header, metavar="KEY:VALUE",
                       help="messages whose header KEY is VALUE (newest 100)")
    p.add_argument("--limit", type=_nonneg, metavar="N",
                   help="trace events to scan, newest first (nsqd's default 200,000)")
    p.add_argument("--nsqd-http-address", metavar="HOST:PORT", help="search one nsqd")
    p.add_argument("--lookupd-http-address", metavar="HOST:PORT",
                   help="search every nsqd this nsqlookupd knows (its GET /trace/search)")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=cmd_trace_get)
    for name, on in (("enable", True), ("disable", False)):
        q = tsub.add_parser(name, help=f"{'start' if on else 'stop'} tracing a topic "
                                       "(every partition, kept across restarts)")
        q.add_argument("topic", metavar="TOPIC")
        q.add_argument("--nsqd-http-address", metavar="HOST:PORT",
                       help="the nsqd (default 127.0.0.1:4151)")
        q.set_defaults(func=lambda a, on=on: cmd_trace_switch(a, on))
