"""A cluster whose processes are hosts: etcd, nsqlookupd and three nsqd, each in a namespace.

Every server listens on its host's own address on the default ports and announces that
address (``--broadcast-address``); the test and the pynsq clients sit on a ``client`` host
that no nemesis touches (as Jepsen's control node). Helpers talk plain HTTP through
:meth:`Net.call`, so the only shared state is what the servers say.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from nsqx.cluster.etcd_server import etcd_binary
from nsqx.cluster.trust import generate_secret_file
from tests.faults import power
from tests.faults.clock import NodeClock, build_shim
from tests.faults.netns import Host, Net
from tests.support.cluster import http, wait_until
from tests.support.lookupd_process import lookupd_command
from tests.support.nsqd_process import nsqd_command


class Server:
    """One server process on a host; restarted with the same command and data."""

    def __init__(self, host: Host, cmd: list[str], log_dir: Path, health_url: str,
                 env: dict[str, str] | None = None) -> None:
        self.host, self.cmd, self.log_dir, self.health_url = host, cmd, log_dir, health_url
        self.env = env
        self.clock: NodeClock | None = None
        self.journal: Path | None = None  # the power-loss journal, when it has one
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def log_paths(self) -> list[Path]:
        return [self.log_dir / f"{self.name}-{i}.log" for i in range(1, self.starts + 1)]

    def start(self, timeout: float = 60.0) -> Server:
        self.starts += 1
        self.proc = self.host.spawn(self.cmd, self.log_dir / f"{self.name}-{self.starts}.log",
                                    self.env)

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_paths[-1].read_text()[-3000:]}")
            return self.host.net.call(http, "GET", self.health_url, timeout=2)[0] == 200

        wait_until(healthy, timeout=timeout, step=0.2, what=f"{self.name} healthy")
        return self

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9 (a crash: no shutdown code runs), reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.log_paths if p.exists())


class HostCluster:
    """etcd, nsqlookupd and ``nodes`` nsqd, each on its own host, plus the client host.

    Each nsqd runs with the clock shim when it builds (``node.clock`` shifts its wall
    clock; None without a C compiler); with ``power_shim`` also with the power-loss journal
    (``node.journal``, see tests/faults/power.py)."""

    def __init__(self, net: Net, base: Path, nodes: int = 3,
                 nsqd_args: list[str] | None = None, power_shim: Path | None = None) -> None:
        self.net, self.base = net, base
        self.client = net.add_host("client")
        etcd_host = net.add_host("etcd")
        lk_host = net.add_host("lookupd")
        node_hosts = [net.add_host(f"n{i + 1}") for i in range(nodes)]
        secret = str(generate_secret_file(str(base / "cluster.secret")))
        endpoint = f"http://{etcd_host.ip}:2379"
        cluster = [f"--cluster-leadership-addresses={endpoint}", "--cluster-id=faults",
                   f"--cluster-secret-file={secret}"]
        self.etcd = Server(etcd_host, [
            etcd_binary(), "--name", "nsqx", "--data-dir", str(base / "etcd-data"),
            "--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
            "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "nsqx=http://127.0.0.1:2380", "--log-level", "warn"],
            base, f"{endpoint}/health")
        self.lookupd = Server(lk_host, [
            *lookupd_command(), f"--tcp-address={lk_host.ip}:4160",
            f"--http-address={lk_host.ip}:4161", f"--broadcast-address={lk_host.ip}",
            *cluster], base, f"http://{lk_host.ip}:4161/ping")
        shim = build_shim(base)
        self.nodes = []
        for h in node_hosts:
            data = base / f"{h.name}-data"
            data.mkdir()
            env = {"LD_PRELOAD": str(shim), "NSQX_CLOCK_FILE": str(base / f"{h.name}.clock")} \
                if shim else {}
            if power_shim:
                pw = power.env(power_shim, data, base / f"{h.name}.journal")
                env = {**env, **pw, "LD_PRELOAD": " ".join(filter(None, (
                    env.get("LD_PRELOAD"), pw["LD_PRELOAD"])))}
            node = Server(h, [
                *nsqd_command(), f"--tcp-address={h.ip}:4150", f"--http-address={h.ip}:4151",
                f"--broadcast-address={h.ip}", f"--data-path={data}",
                f"--lookupd-tcp-address={lk_host.ip}:4160", *cluster, *(nsqd_args or [])],
                base, f"http://{h.ip}:4151/ping", env or None)
            node.clock = NodeClock(base / f"{h.name}.clock") if shim else None
            node.journal = base / f"{h.name}.journal" if power_shim else None
            self.nodes.append(node)

    def start(self) -> HostCluster:
        self.etcd.start()
        self.lookupd.start()
        for n in self.nodes:
            n.start()
        wait_until(lambda: len(self.stats()["nodes"]) == len(self.nodes), timeout=60,
                   what="every nsqd registered")
        return self

    # -- HTTP through the client host -------------------------------------------------------
    def get(self, url: str, method: str = "GET", body: bytes | None = None,
            timeout: float = 5.0) -> tuple[int, Any]:
        return self.net.call(http, method, url, body, timeout)

    @property
    def lookupd_http(self) -> str:
        return f"{self.lookupd.host.ip}:4161"

    def stats(self) -> dict[str, Any]:
        code, body = self.get(f"http://{self.lookupd_http}/cluster/stats")
        if code != 200:
            raise ValueError(f"/cluster/stats: {code} {body}")
        return body

    def create_topic(self, name: str, partitions: int = 1, replicas: int = 3,
                     extra: str = "") -> None:
        """``extra``: more query, e.g. ``&syncdisk=1``."""
        code, body = self.get(f"http://{self.lookupd_http}/topic/create?topic={name}"
                              f"&partition_num={partitions}&replicator={replicas}{extra}", "POST")
        assert code == 200, body
        wait_until(lambda: all(len(p["isr"]) == replicas and p["leader"]
                               for p in self.partitions(name)), timeout=60,
                   what=f"{name}: every partition led with a full ISR")

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        return self.stats()["topics"][topic]["partitions"]

    def node_id(self, n: Server) -> str:
        return (self.base / f"{n.name}-data" / "cluster-node-id").read_text().strip()

    def by_id(self, node_id: str) -> Server:
        return next(n for n in self.nodes if self.node_id(n) == node_id)

    def stale_refusals(self) -> dict[str, tuple[int, int]]:
        """Per nsqd: (its start number, signed requests it refused as too old or too new),
        from its /metrics; a restart starts the count again (see :func:`refusals_since`)."""
        out = {}
        for n in self.nodes:
            code, text = self.get(f"http://{n.host.ip}:4151/metrics", timeout=3)
            count = 0
            for line in str(text).splitlines() if code == 200 else ():
                if 'reason="E_STALE_SIGNATURE"' in line:
                    count += int(float(line.split()[-1]))
            out[n.name] = (n.starts, count)
        return out

    def leader(self, topic: str) -> Server:
        return self.by_id(self.partitions(topic)[0]["leader"])


def refusals_since(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    """Refusals counted between two :meth:`HostCluster.stale_refusals` (a node restarted in
    between counts from 0)."""
    total = 0
    for name, (starts, count) in after.items():
        b_starts, b_count = before.get(name, (starts, 0))
        total += count - (b_count if b_starts == starts else 0)
    return total
