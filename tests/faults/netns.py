"""Nodes as hosts: every process of a test cluster in its own network namespace.

A :class:`Net` makes one bridge namespace and, per host, a namespace with one veth whose
peer is enslaved to the bridge; each host gets ``10.28.0.<i>/24``, an address that exists
only inside the namespaces of this run (nothing is created in the root namespace, so runs
never collide; names carry the pid). Processes start with ``ip netns exec`` (which execs,
so their pid is the server's own and SIGSTOP/kill -9 reach it). The test itself talks to
the hosts from a ``client`` host through :meth:`Net.call`, which runs a function on a
thread that entered the client namespace (setns(2) applies to the calling thread only).

Faults are nftables rules in the receiving host's namespace: :meth:`Net.block` drops the
packets ``src`` sends to ``dst`` (one way); :meth:`Net.heal` removes every rule.
:meth:`Net.close` kills every process it started (by pid) and deletes the namespaces,
whatever state the test left them in.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SUBNET = "10.28.0"
TABLE = "nsqxfault"


class NetUnavailable(RuntimeError):
    """Namespaces, veths or nftables cannot be made here (the reason is the message)."""


def _run(*cmd: str, stdin: str | None = None) -> None:
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise NetUnavailable(f"{' '.join(cmd)} failed: {r.stderr.strip() or r.stdout.strip()}")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the namespace suite, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed (scripts/install-fault-deps.sh installs it)"
    probe = f"nxprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", TABLE)
    except (NetUnavailable, OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Host:
    """One namespace with one address; the processes started in it."""

    def __init__(self, net: Net, name: str, index: int) -> None:
        self.net, self.name, self.index = net, name, index
        self.ns = f"nx{net.tag}-{name}"
        self.ip = f"{SUBNET}.{index}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, cmd: list[str], log: Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=full_env, cwd=str(log.parent))
        self.procs.append(p)
        return p

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.ip})"


class Net:
    """The namespaces of one test run; use as a context manager (cleans up on exit)."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or str(os.getpid())
        self.bridge_ns = f"nx{self.tag}-br"
        self.hosts: dict[str, Host] = {}
        self.blocked: set[tuple[str, str]] = set()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._made: list[str] = []

    def __enter__(self) -> Net:
        try:
            _run("ip", "netns", "add", self.bridge_ns)
            self._made.append(self.bridge_ns)
            _run("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        host = Host(self, name, len(self.hosts) + 2)
        _run("ip", "netns", "add", host.ns)
        self._made.append(host.ns)
        peer = f"v{host.index}"
        _run("ip", "-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer,
             "netns", self.bridge_ns)
        _run("ip", "-n", self.bridge_ns, "link", "set", peer, "master", "br0", "up")
        _run("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _run("ip", "-n", host.ns, "link", "set", "eth0", "up")
        _run("ip", "-n", host.ns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    # -- talking to the hosts --------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run ``fn`` on a thread inside the ``client`` host's namespace."""
        if self._pool is None:
            ns_path = f"/var/run/netns/{self.hosts['client'].ns}"

            def enter() -> None:
                fd = os.open(ns_path, os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)

            self._pool = concurrent.futures.ThreadPoolExecutor(1, initializer=enter)
        return self._pool.submit(fn, *args, **kw).result()

    # -- faults ----------------------------------------------------------------------------
    def block(self, src: str, dst: str) -> None:
        """``dst`` stops receiving what ``src`` sends (one way)."""
        self.blocked.add((src, dst))
        self._apply(dst)

    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b`` either way."""
        self.blocked |= {(a, b), (b, a)}
        self._apply(a)
        self._apply(b)

    def heal(self) -> None:
        touched = {dst for _, dst in self.blocked}
        self.blocked.clear()
        for name in touched:
            self._apply(name)

    def _apply(self, name: str) -> None:
        """Rewrite ``name``'s input filter from :attr:`blocked` (atomically, with nft -f)."""
        host = self.hosts[name]
        drops = sorted(self.hosts[s].ip for s, d in self.blocked if d == name)
        script = f"table inet {TABLE}\ndelete table inet {TABLE}\n"
        if drops:
            script += (f"table inet {TABLE} {{\n chain input {{\n"
                       f"  type filter hook input priority 0; policy accept;\n"
                       f"  ip saddr {{ {', '.join(drops)} }} drop\n }}\n}}\n")
        _run("ip", "netns", "exec", host.ns, "nft", "-f", "-", stdin=script)

    # -- cleanup ---------------------------------------------------------------------------
    def close(self) -> None:
        for host in self.hosts.values():
            for p in host.procs:
                if p.poll() is None:
                    try:
                        os.kill(p.pid, signal.SIGCONT)
                        os.kill(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

