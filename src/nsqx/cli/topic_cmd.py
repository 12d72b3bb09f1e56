"""``nsqx topic create|describe|move``: partitioned and ordered topics, on one nsqd or a cluster.

    nsqx topic create orders --partitions 8 --ordered --nsqd-http-address 127.0.0.1:4151
    nsqx topic create orders --partitions 8 --replicas 3 --lookupd-http-address 127.0.0.1:4161
    nsqx topic describe orders --nsqd-http-address 127.0.0.1:4151
    nsqx topic move orders 0 --from NODE --to NODE --lookupd-http-address 127.0.0.1:4161

Route-managed ordered topics (``/topic/create?...&logical=L``) on one nsqd, or in a cluster
through nsqlookupd (``--lookupd-http-address``; ``move --route`` there, as a plain ``move``
in a cluster moves a replica):

    nsqx topic create orders --partitions 2 --logical 1024 --lookupd-http-address 127.0.0.1:4161
    nsqx topic routes orders --nsqd-http-address 127.0.0.1:4151
    nsqx topic split orders 0 --at 512 --nsqd-http-address 127.0.0.1:4151
    nsqx topic merge orders 1 2 --lookupd-http-address 127.0.0.1:4161
    nsqx topic move orders 3 --to NODE --nsqd-http-address 127.0.0.1:4151
    nsqx topic move orders 3 --route --to NODE --lookupd-http-address 127.0.0.1:4161
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from nsqx.cli.common import answer_failed, help_when_bare, nsqd_http, option

__all__ = ["add_topic_commands"]


def _call(method: str, address: str, path: str, params: dict[str, str]) -> tuple[int, Any]:
    status, raw, _ = nsqd_http(method, address, path, params, timeout=15)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, str]:
    if args.nsqd_http_address and args.lookupd_http_address:
        parser.error("give one of --nsqd-http-address (one node, default 127.0.0.1:4151) "
                     "and --lookupd-http-address (cluster mode), not both")
    if args.lookupd_http_address:
        return "nsqlookupd", args.lookupd_http_address
    return "nsqd", args.nsqd_http_address


def cmd_topic_create(args: argparse.Namespace) -> int:
    prog = "nsqx topic create"
    who, addr = _target(args, args.parser)
    params = {"topic": args.topic, "partition_num": str(args.partitions)}
    if args.ordered or args.logical:
        params["orderedmulti"] = "true"
    if args.logical:  # route-managed: keys -> logical partitions -> physical ones by route
        params["logical"] = str(args.logical)
    if who == "nsqlookupd":
        if args.replicas:
            params["replicator"] = str(args.replicas)
        if args.min_isr:
            params["min_isr"] = str(args.min_isr)
        if args.sync_every:
            params["syncdisk"] = str(args.sync_every)
    elif args.replicas or args.min_isr:
        args.parser.error("--replicas and --min-isr need --lookupd-http-address (cluster mode)")
    if args.sync_every is not None and args.sync_every < 0:
        args.parser.error("--sync-every must be >= 0")
    try:
        status, body = _call("POST", addr, "/topic/create", params)
        if status == 200 and who != "nsqlookupd" and args.sync_every:
            status, body = _call("POST", addr, "/topic/config",
                                 {"topic": args.topic, "sync_every": str(args.sync_every)})
    except OSError as e:
        print(f"{prog}: cannot reach {who} at {addr}: {e}", file=sys.stderr)
        return 1
    if status != 200:
        return answer_failed(prog, who, status, body)
    what = f"{args.partitions} partition{'s' if args.partitions != 1 else ''}"
    ordered = (f", ordered over {args.logical} logical partitions" if args.logical
               else ", ordered" if args.ordered else "")
    print(f"topic {args.topic}: {what}{ordered}"
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
        return answer_failed(prog, who, status, body)
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
    archive = {a["partition"]: a for a in t.get("archive") or ()}  # --archive-url nodes
    for p in parts:
        span = (f"  log {p['log_start']}..{p['log_end']}" if "log_start" in p else "")
        print(f"  {p['partition']:>3}  messages {p['message_count']}  depth {p['depth']}{span}")
        a = archive.get(p["partition"])
        if a:
            print(f"       archive {a['archive_start']}..{a['archive_end']} "
                  f"({a['archived_files']} files, {a['archived_bytes']} bytes), local log from "
                  f"{a['log_start']}, lag {a['archive_lag_segments']} segments / "
                  f"{a['archive_lag_bytes']} bytes"
                  + (f", error: {a['archive_error']}" if a.get("archive_error") else ""))
        for c in p["channels"]:
            print(f"       channel {c['channel_name']}: depth {c['depth']}, in flight "
                  f"{c['in_flight_count']}")
    return 0


def _print_routes(topic: str, body: dict) -> None:
    """The route history as a table: per version, logical ranges -> physical partitions."""
    print(f"topic {topic}: {body.get('logical')} logical partitions")
    print(f"{'version':>7}  {'committed':<19}  ranges (logical lo-hi -> partition @ node)")
    for v in body.get("versions") or ():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.get("committed_ms", 0) / 1000))
        ranges = ", ".join(f"{lo}-{hi - 1} -> {p} @ {node}" for lo, hi, p, node in v["routes"])
        print(f"{v['version']:>7}  {when:<19}  {ranges}")
    if body.get("pending"):
        print(f"pending: {body['pending']}")
    for key in sorted(k for k in body if k not in ("versions", "pending", "logical", "topic",
                                                    "next_partition")):
        print(f"{key}: {json.dumps(body[key], sort_keys=True)}")


def _route_call(prog: str, args: argparse.Namespace, path: str, params: dict[str, str],
                method: str = "POST") -> int:
    """A route request (a change, or GET the history) to one nsqd or, in a cluster, to
    nsqlookupd (same paths and parameters; its coordinator runs the change); prints the
    history."""
    lookupd = option(args, "lookupd_http_address")
    who, addr = ("nsqlookupd", lookupd) if lookupd else ("nsqd", args.nsqd_http_address)
    if not addr:
        args.parser.error("give --nsqd-http-address (one node) or --lookupd-http-address "
                          "(cluster mode)")
    try:
        status, body = _call(method, addr, path, {"topic": args.topic, **params})
    except OSError as e:
        print(f"{prog}: cannot reach {who} at {addr}: {e}", file=sys.stderr)
        return 1
    if status != 200:
        return answer_failed(prog, who, status, body)
    if args.json:
        print(json.dumps(body, indent=2, sort_keys=True))
    else:
        _print_routes(args.topic, body if isinstance(body, dict) else {})
    return 0


def cmd_topic_routes(args: argparse.Namespace) -> int:
    return _route_call("nsqx topic routes", args, "/topic/route", {}, "GET")


def cmd_topic_split(args: argparse.Namespace) -> int:
    return _route_call("nsqx topic split", args, "/topic/split",
                         {"partition": str(args.partition), "at": str(args.at)})


def cmd_topic_merge(args: argparse.Namespace) -> int:
    return _route_call("nsqx topic merge", args, "/topic/merge",
                         {"a": str(args.a), "b": str(args.b)})


def cmd_topic_move(args: argparse.Namespace) -> int:
    if args.nsqd_http_address or args.route:  # a route-managed topic's range -> a new
        if args.nsqd_http_address:            # partition on NODE (one nsqd or a cluster)
            args.lookupd_http_address = None
        return _route_call("nsqx topic move", args, "/topic/move",
                             {"partition": str(args.partition), "node": args.target})
    prog = "nsqx topic move"
    addr = args.lookupd_http_address
    if not args.source and not args.leader:
        args.parser.error("give --from NODE (move a replica), --leader (move leadership only) "
                          "or --route (a route-managed topic's range to a new partition)")
    try:
        move_leader = args.leader
        if args.source and not move_leader:
            # Youzan's API wants move_leader=true when the source leads: say it for the user
            status, body = _call("GET", addr, "/cluster/stats", {})
            if status != 200:
                return answer_failed(prog, "nsqlookupd", status, body)
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
            return answer_failed(prog, "nsqlookupd", status, body)
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


def _route_command(tsub: Any, func: Any, name: str, help: str, description: str,
                   partitions: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """``nsqx topic routes|split|merge``: TOPIC, the partition numbers, where (one nsqd,
    default the local one, or a cluster's nsqlookupd) and --json."""
    p = tsub.add_parser(name, help=help, description=description)
    p.add_argument("topic")
    for arg in partitions:
        p.add_argument(arg, type=int)
    p.add_argument("--nsqd-http-address", default="127.0.0.1:4151")
    p.add_argument("--lookupd-http-address", help="a cluster: any nsqlookupd's HTTP API")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=func, parser=p)
    return p


def add_topic_commands(sub: Any) -> None:
    t = sub.add_parser("topic", help="create, describe, move, split and merge partitioned/ordered "
                       "topics")
    tsub = t.add_subparsers(dest="topic_command", metavar="COMMAND")
    help_when_bare(t)
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
    p.add_argument("--logical", type=int, default=0, metavar="L",
                   help="route-managed ordered topic: keys hash to L logical partitions, "
                   "mapped onto the physical ones by a versioned route (split/merge/move)")
    p.add_argument("--replicas", type=int, default=0, help="replica count (cluster mode)")
    p.add_argument("--min-isr", type=int, default=0,
                   help="in-sync replicas needed to take a publish (cluster; default 2)")
    p.add_argument("--sync-every", type=int, default=None, metavar="N",
                   help="fsync the topic's log after every N messages (1: each publish is "
                   "acknowledged only once fsynced, on every replica); default: each nsqd's "
                   "--sync-every")
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
        "leadership moves. NODE ids are those of `nsqx cluster status`. With "
        "--nsqd-http-address (a route-managed ordered topic on one nsqd): the partition's "
        "logical range moves to a new partition labelled --to (a route change).")
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
    p.add_argument("--nsqd-http-address",
                   help="a route-managed ordered topic on this nsqd: a route move")
    p.add_argument("--route", action="store_true",
                   help="with --lookupd-http-address: a route move of a route-managed topic "
                   "(its range to a new partition led by --to, a node id or TCP address)")
    p.add_argument("--json", action="store_true", help="print the JSON answer (route move)")
    p.set_defaults(func=cmd_topic_move, parser=p)
    _route_command(tsub, cmd_topic_routes, "routes",
                   "a route-managed ordered topic's route history",
                   "Each route version: the logical ranges and the physical partition (and "
                   "node) each maps to, when it was committed; then the sealed partitions and "
                   "each channel's barrier state as nsqd reports them (GET /topic/route).")
    p = _route_command(
        tsub, cmd_topic_split, "split", "split a route-managed partition's logical range in two",
        "POST /topic/split: PARTITION's logical range [lo, hi) becomes [lo, AT) and [AT, hi) "
        "on two new partitions; PARTITION gets a command message and refuses publishes from "
        "then on. Consumers keep each key's order with no cooperation.", ("partition",))
    p.add_argument("--at", type=int, required=True, help="first logical partition of the upper half")
    _route_command(tsub, cmd_topic_merge, "merge",
                   "merge two route-managed partitions with adjacent ranges",
                   "POST /topic/merge: partitions A and B (adjacent logical ranges) become one "
                   "new partition; both get a command message and refuse publishes from then "
                   "on.", ("a", "b"))
