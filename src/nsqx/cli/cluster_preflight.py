"""What ``nsqx cluster up`` checks before it starts anything, and its ``--background`` mode.

Why before: a member that cannot start (etcd missing, a port taken) used to be found only
by the supervisor, after every other member had started, in a log file; a newcomer saw a
hang. Each check answers one line naming the flag or command that fixes it:

* etcd: the binary exists (unless ``--etcd`` names a running one), else the install command;
* ports: every port the members will listen on is free on 127.0.0.1, within 1..65535, and
  no two members share one;
* the data directory: an nsqd keeps its cluster node id (``127.0.0.1:TCP:HTTP`` of its
  first start) in its data path, so starting the same directory on other ports would
  make nodes join under their old addresses: refused, naming the ports it was made with.

``--background`` runs the same checks in the foreground, then forks: the child is the
usual supervisor (its output in DATA_PATH/cluster-up.log), the parent returns once every
member answers and the coordinator sees every nsqd, or fails with the log's last lines.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import socket
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from nsqx.cluster.etcd_server import EtcdNotFound, etcd_binary

__all__ = ["LOG_FILE", "PID_FILE", "Port", "exit_detached", "planned_ports", "preflight",
           "wait_in_foreground"]

LOG_FILE = "cluster-up.log"  # --background: what the supervisor prints
PID_FILE = "cluster-up.pid"  # --background: the supervisor to `kill`


@dataclass(frozen=True)
class Port:
    port: int
    who: str  # "nsqd1 HTTP"
    flag: str  # the flag that moves it: "--base-port"


def planned_ports(args: argparse.Namespace) -> list[Port]:
    """Every port the members of ``cluster up`` will listen on (cluster_cmd's layout)."""
    out: list[Port] = []
    if not args.etcd:
        out += [Port(args.etcd_port, "etcd client", "--etcd-port"),
                Port(args.etcd_port + 1, "etcd peer", "--etcd-port")]
    for j in range(args.lookupds):
        base = args.lookupd_port + 100 * j
        out += [Port(base, f"nsqlookupd{j} TCP", "--lookupd-port"),
                Port(base + 1, f"nsqlookupd{j} HTTP", "--lookupd-port")]
    for i in range(args.nodes):
        base = args.base_port + 100 * i
        out += [Port(base + k, f"nsqd{i} {kind}", "--base-port")
                for k, kind in enumerate(("TCP", "HTTP", "HTTPS", "cluster"))]
    return out


def _in_use(port: int) -> bool:
    """True when a listener holds ``port`` on 127.0.0.1 (or on every address). SO_REUSEADDR
    as the servers themselves bind: a port in TIME_WAIT from a previous run counts as free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def check_ports(ports: list[Port]) -> str | None:
    bad = [p for p in ports if not 0 < p.port < 65536]
    if bad:
        return (f"port {bad[0].port} ({bad[0].who}) is not a port (1..65535): change "
                f"{bad[0].flag}")
    seen: dict[int, Port] = {}
    for p in ports:
        if p.port in seen:
            q = seen[p.port]
            return (f"port {p.port} would serve both {q.who} and {p.who}: move one with "
                    f"{p.flag if p.flag != q.flag else '--nodes'} or {q.flag}")
        seen[p.port] = p
    busy = [p for p in ports if _in_use(p.port)]
    if not busy:
        return None
    flags = sorted({p.flag for p in busy})
    listed = ", ".join(f"{p.port} ({p.who})" for p in busy)
    return (f"{'port' if len(busy) == 1 else 'ports'} {listed} already in use on 127.0.0.1; "
            f"nothing was started: choose others with {' / '.join(flags)}")


def check_etcd(args: argparse.Namespace) -> str | None:
    if args.etcd:
        return None
    try:
        binary = etcd_binary()
    except EtcdNotFound as e:
        return str(e)
    if not os.access(binary, os.X_OK):
        return f"etcd binary {binary} (NSQX_ETCD) is not an executable file"
    return None


def check_node_ids(root: Path, args: argparse.Namespace) -> str | None:
    """The nsqd data paths of ``root`` were made on these ports (see the module's doc)."""
    for i in range(args.nodes):
        try:
            old = (root / f"nsqd{i}" / "cluster-node-id").read_text().strip()
        except OSError:
            continue
        tcp = args.base_port + 100 * i
        new = f"127.0.0.1:{tcp}:{tcp + 1}"
        if old and old != new:
            made = old.split(":")
            hint = (f"--base-port {int(made[1]) - 100 * i}" if len(made) == 3
                    and made[1].isdigit() else "the ports it was made with")
            return (f"{root} was made with other ports: nsqd{i} is node {old} and would "
                    f"join under that address; run with {hint}, or use another --data-path")
    return None


def preflight(root: Path, args: argparse.Namespace) -> str | None:
    """The first problem that would stop ``cluster up`` (one line), or None."""
    return (check_etcd(args) or check_ports(planned_ports(args))
            or check_node_ids(root, args))


# ------------------------------------------------------------------------------ background
def _answers(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read()
    except (OSError, ValueError):
        return None


def _ready(args: argparse.Namespace) -> bool:
    """Every member answers /ping and the coordinator lists every nsqd."""
    https = [args.lookupd_port + 1 + 100 * j for j in range(args.lookupds)]
    https += [args.base_port + 1 + 100 * i for i in range(args.nodes)]
    if not all(_answers(f"http://127.0.0.1:{p}/ping") == b"OK" for p in https):
        return False
    if not args.lookupds:
        return True
    raw = _answers(f"http://127.0.0.1:{args.lookupd_port + 1}/cluster/stats")
    try:
        stats = json.loads(raw or b"")
    except ValueError:
        return False
    return bool(stats.get("coordinator")) and len(stats.get("nodes") or ()) >= args.nodes


def wait_in_foreground(root: Path, args: argparse.Namespace) -> int | None:
    """Fork. In the child return None: it goes on as the supervisor, its output in
    LOG_FILE. In the parent wait until the cluster is ready (exit status 0, the
    supervisor's table printed) or failed (1, the log's tail printed, nothing left running)."""
    log = root / LOG_FILE
    with open(log, "ab") as out:
        start = out.tell()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the supervisor: no terminal, its own log; ends with os._exit (cluster_cmd)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlives the terminal it came from
        (root / PID_FILE).write_text(f"{os.getpid()}\n")
        return None
    deadline = time.monotonic() + args.wait
    prog = "nsqx cluster up"
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            print(f"{prog}: failed (exit {code}); the end of {log}:", file=sys.stderr)
            sys.stderr.write(_tail(log, start))
            return 1
        if _ready(args):
            sys.stdout.write(_tail(log, start, lines=10_000))
            print(f"{prog}: running in the background (pid {pid}); stop it with "
                  f"kill $(cat {_short(root / PID_FILE)})")
            return 0
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
            print(f"{prog}: not ready within {args.wait:g} s, stopped; the end of {log}:",
                  file=sys.stderr)
            sys.stderr.write(_tail(log, start))
            return 1
        time.sleep(0.3)


def exit_detached(root: Path, run: Callable[[], int]) -> NoReturn:
    """The forked supervisor: run, then leave the process (never back into the caller that
    forked, e.g. a test runner), flushing what it printed into the log first."""
    code = 1
    try:
        code = run()
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            (root / PID_FILE).unlink(missing_ok=True)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _tail(log: Path, start: int, lines: int = 15) -> str:
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:])


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
