"""``nsqx topic create|describe|move``: partitioned and ordered topics, on one nsqd or a cluster.

    nsqx topic create orders --partitions 8 --ordered --nsqd-http-address 127.0.0.1:4151
    nsqx topic create orders --partitions 8 --replicas 3 --lookupd-http-address 127.0.0.1:4161
    nsqx topic describe orders --nsqd-http-address 127.0.0.1:4151
    nsqx topic move orders 0 --from NODE --to NODE --lookupd-http-address 127.0.0.1:4161
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode

__all__ = ["add_topic_commands"]


def _call(method: str, address: str, path: str, params: dict[str, str]) -> tuple[int, Any]:
    base = address if "://" in address else f"http://{address}"
    req = urllib.request.Request(f"{base.rstrip('/')}{path}?{urlencode(params)}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _fail(prog: str, who: str, status: int, body: Any) -> int:
    if isinstance(body, dict):
        text = str(body.get("message"))
        if body.get("detail"):
            text += f": {body['detail']}"
    else:
        text = str(body)
    print(f"{prog}: {who} answered {status} {text}", file=sys.stderr)
    return 1


def _target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, str]:
    if bool(args.nsqd_http_address) == bool(args.lookupd_http_address):
        parser.error("give exactly one of --nsqd-http-address (one node) and "
                     "--lookupd-http-address (cluster mode)")
    if args.lookupd_http_address:
        return "nsqlookupd", args.lookupd_http_address
    return "nsqd", args.nsqd_http_address


def cmd_topic_create(args: argparse.Namespace) -> int:
    prog = "nsqx topic create"
    who, addr = _target(args, args.parser)
    params = {"topic": args.topic, "partition_num": str(args.partitions)}
    if args.ordered:
        params["orderedmulti"] = "true"
    if who == "nsqlookupd":
        if args.replicas:
            params["replicator"] = str(args.replicas)
        if args.min_isr:
            params["min_isr"] = str(args.min_isr)
    elif args.replicas or args.min_isr:
        args.parser.error("--replicas and --min-isr need --lookupd-http-address (cluster mode)")
    try:
        status, body = _call("POST", addr, "/topic/create", params)
    except OSError as e:
        print(f"{prog}: cannot reach {who} at {addr}: {e}", file=sys.stderr)
        return 1
    if status != 200:
        return _fail(prog, who, status, body)
    what = f"{args.partitions} partition{'s' if args.partitions != 1 else ''}"
    print(f"topic {args.topic}: {what}{', ordered' if args.ordered else ''}"
          + (f", leaders {', '.join(str(p['leader']) for p in body['partitions'])}"
             if isinstance(body, dict) and "partitions" in body else ""))
    return 0


def cmd_topic_describe(args: argparse.Namespace) -> int:
    prog = "nsqx topic describe"
    who, addr = _target(args, args.parser)
    try:
        if who == "nsqlookupd":
            status, body = _call("GET", addr, "/cluster/stats", {})
        else:
            status, body = _call("GET", addr, "/stats", {"format": "json", "topic": args.topic})
    except OSError as e:
        print(f"{prog}: cannot reach {who} at {addr}: {e}", file=sys.stderr)
        return 1
    if status != 200:
        return _fail(prog, who, status, body)
    if who == "nsqlookupd":
        t = (body.get("topics") or {}).get(args.topic)
        if t is None:
            print(f"{prog}: no topic {args.topic} in the cluster", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(t, indent=2))
            return 0
        print(f"topic {args.topic}: {t['partition_num']} partitions x {t['replica']} replicas, "
              f"min ISR {t['min_isr']}{', ordered' if t['ordered'] else ''}")
        for p in t["partitions"]:
            print(f"  {p['partition']:>3}  leader {p['leader']}  epoch {p['epoch']}  "
                  f"ISR {','.join(p['isr'])}  catch-up {','.join(p['catchup']) or '-'}")
        return 0
    topics = [t for t in body.get("topics", []) if t["topic_name"] == args.topic]
    if not topics:
        print(f"{prog}: no topic {args.topic} on {addr}", file=sys.stderr)
        return 1
    t = topics[0]
    if args.json:
        print(json.dumps(t, indent=2))
        return 0
    parts = t.get("partitions") or [{"partition": 0, "depth": t["depth"],
                                     "message_count": t["message_count"], "channels": [
                                         {"channel_name": c["channel_name"], "depth": c["depth"],
                                          "in_flight_count": c["in_flight_count"]}
                                         for c in t["channels"]]}]
    print(f"topic {args.topic}: {len(parts)} partition{'s' if len(parts) != 1 else ''}"
          f"{', ordered' if t.get('ordered') else ''}, {t['message_count']} messages, "
          f"depth {t['depth']}")
    for p in parts:
        span = (f"  log {p['log_start']}..{p['log_end']}" if "log_start" in p else "")
        print(f"  {p['partition']:>3}  messages {p['message_count']}  depth {p['depth']}{span}")
        for c in p["channels"]:
            print(f"       channel {c['channel_name']}: depth {c['depth']}, in flight "
                  f"{c['in_flight_count']}")
    return 0


def cmd_topic_move(args: argparse.Namespace) -> int:
    prog = "nsqx topic move"
    addr = args.lookupd_http_address
    if not args.source and not args.leader:
        args.parser.error("give --from NODE (move a replica) or --leader (move leadership only)")
    try:
        move_leader = args.leader
        if args.source and not move_leader:
            # Youzan's API wants move_leader=true when the source leads: say it for the user
            status, body = _call("GET", addr, "/cluster/stats", {})
            if status != 200:
                return _fail(prog, "nsqlookupd", status, body)
            parts = ((body.get("topics") or {}).get(args.topic) or {}).get("partitions") or []
            move_leader = any(p["partition"] == args.partition and p["leader"] == args.source
                              for p in parts)
        params = {"topic": args.topic, "partition": str(args.partition), "move_to": args.target}
        if args.source:
            params["move_from"] = args.source
        if move_leader:
            params["move_leader"] = "true"
        status, body = _call("POST", addr, "/topic/partition/move", params)
        if status != 200:
            return _fail(prog, "nsqlookupd", status, body)
        what = (f"leadership {body['move_from']} -> {body['move_to']}" if body["leader_only"]
                else f"replica {body['move_from']} -> {body['move_to']}"
                + (" (with its leadership)" if move_leader else ""))
        print(f"topic {args.topic} partition {args.partition}: moving {what}", flush=True)
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            status, body = _call("GET", addr, "/cluster/stats", {})
            if status == 200 and not any(m["topic"] == args.topic
                                         and m["partition"] == args.partition
                                         for m in body.get("moves") or ()):
                t = (body.get("topics") or {}).get(args.topic) or {}
                for p in t.get("partitions") or ():
                    if p["partition"] == args.partition:
                        print(f"  done: leader {p['leader']}  epoch {p['epoch']}  "
                              f"replicas {','.join(p['replicas'])}  ISR {','.join(p['isr'])}")
                return 0
            time.sleep(0.2)
        print(f"{prog}: still under way after {args.wait:g} s (see `nsqx cluster status`)",
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{prog}: cannot reach nsqlookupd at {addr}: {e}", file=sys.stderr)
        return 1


def add_topic_commands(sub: Any) -> None:
    t = sub.add_parser("topic", help="create, describe and move partitioned/ordered topics")
    tsub = t.add_subparsers(dest="topic_command", metavar="COMMAND")
    p = tsub.add_parser(
        "create", help="create a topic with partitions (ordered, replicated in a cluster)",
        description="Create TOPIC with --partitions on one nsqd (--nsqd-http-address) or in "
        "a cluster (--lookupd-http-address, with --replicas and --min-isr). --ordered "
        "makes consumers use SUB_ORDERED and producers name a partition (or a key in "
        "nsqx.client). Creating it again with the same shape is harmless; another shape "
        "is refused.")
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=1, help="partition count (default 1)")
    p.add_argument("--ordered", action="store_true", help="strictly ordered partitions")
    p.add_argument("--replicas", type=int, default=0, help="replica count (cluster mode)")
    p.add_argument("--min-isr", type=int, default=0,
                   help="in-sync replicas needed to take a publish (cluster; default 2)")
    p.add_argument("--nsqd-http-address", help="one nsqd: host:port of its HTTP API")
    p.add_argument("--lookupd-http-address", help="a cluster: any nsqlookupd's HTTP API")
    p.set_defaults(func=cmd_topic_create, parser=p)
    p = tsub.add_parser(
        "describe", help="partitions of a topic: log range and channels, or leader/ISR",
        description="On one nsqd: each partition's messages, depth, log range and channels. "
        "In a cluster: each partition's leader, epoch, ISR and catch-up set.")
    p.add_argument("topic")
    p.add_argument("--nsqd-http-address")
    p.add_argument("--lookupd-http-address")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=cmd_topic_describe, parser=p)
    p = tsub.add_parser(
        "move", help="move a partition's replica (or only its leadership) to another node",
        description="Cluster mode (nsqlookupd's /topic/partition/move). With --from and --to: "
        "the --to node becomes a replica, catches up outside the ISR, joins it, then the "
        "--from replica leaves (if it led, leadership moves to --to); no acknowledged "
        "message is lost. With --leader and --to naming an in-sync replica: only "
        "leadership moves. NODE ids are those of `nsqx cluster status`.")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--from", dest="source", metavar="NODE", help="node giving up its replica")
    p.add_argument("--to", dest="target", metavar="NODE", required=True,
                   help="node taking the replica (or the leadership)")
    p.add_argument("--leader", action="store_true",
                   help="move leadership (alone if --to is already in sync)")
    p.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                   help="wait up to SECONDS for the move to finish")
    p.add_argument("--lookupd-http-address", default="127.0.0.1:4161")
    p.set_defaults(func=cmd_topic_move, parser=p)
