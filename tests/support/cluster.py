"""A real cluster for tests: one etcd, nsqlookupd(s) and several nsqd processes in cluster mode.

Every process is started by the test's factories, so each is killed in their finalizers
whatever the test did. Helpers talk plain HTTP to the processes (no shared Python state).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from nsqx.cluster.etcd_server import EtcdServer
from nsqx.cluster.trust import Signer, generate_secret_file
from tests.client.helpers import free_port
from tests.support.lookupd_process import LookupdFactory, LookupdProcess
from tests.support.nsqd_process import NsqdFactory, NsqdProcess


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        raw, code = e.read(), e.code
    try:
        return code, json.loads(raw) if raw else None
    except ValueError:
        return code, raw.decode(errors="replace")


def wait_until(pred, timeout: float = 30.0, step: float = 0.1, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except (OSError, ValueError, KeyError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Cluster:
    def __init__(self, etcd: EtcdServer, nsqd_factory: NsqdFactory,
                 lookupd_factory: LookupdFactory, *, cluster_id: str = "test",
                 secret: bool = True) -> None:
        """``secret``: every process gets a shared ``--cluster-secret-file`` (made here)."""
        self.etcd = etcd
        self.secret_file: str | None = None
        if secret:
            tmp = tempfile.mkdtemp(prefix="nsqx-secret-")
            weakref.finalize(self, shutil.rmtree, tmp, True)
            self.secret_file = str(generate_secret_file(f"{tmp}/cluster.secret"))
        self.cluster_id = cluster_id
        self.nsqd_factory = nsqd_factory
        self.lookupd_factory = lookupd_factory
        self.lookupds: list[LookupdProcess] = []
        self.nodes: list[NsqdProcess] = []

    @property
    def flags(self) -> list[str]:
        return [f"--cluster-leadership-addresses={self.etcd.endpoint}",
                f"--cluster-id={self.cluster_id}", *self.secret_flags]

    @property
    def secret_flags(self) -> list[str]:
        return [f"--cluster-secret-file={self.secret_file}"] if self.secret_file else []

    def start(self, nodes: int = 3, lookupds: int = 1, nsqd_args: list[str] | None = None,
              lookupd_args: list[str] | None = None) -> Cluster:
        for _ in range(lookupds):
            self.lookupds.append(self.lookupd_factory.start(
                ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                 "--broadcast-address=127.0.0.1", *self.flags, *(lookupd_args or [])]))
        for _ in range(nodes):
            self.add_node(nsqd_args)
        wait_until(lambda: len(self.stats()["nodes"]) == nodes, what=f"{nodes} nodes registered")
        return self

    def add_node(self, args: list[str] | None = None, *, ports: tuple[int, int] | None = None,
                 etcd_endpoint: str | None = None) -> NsqdProcess:
        """Start an nsqd in the cluster (on ``ports`` (tcp, http) if given, reaching etcd at
        ``etcd_endpoint`` if given: how tests put fault proxies in its way)."""
        tcp, http_ = ports or (free_port(), free_port())
        flags = self.flags if etcd_endpoint is None else [
            f"--cluster-leadership-addresses={etcd_endpoint}", f"--cluster-id={self.cluster_id}",
            *self.secret_flags]
        proc = self.nsqd_factory.start([
            f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http_}",
            "--broadcast-address=127.0.0.1",
            *[f"--lookupd-tcp-address={lk.tcp_address}" for lk in self.lookupds],
            *flags, *(args or [])])
        self.nodes.append(proc)
        return proc

    @property
    def lookupd(self) -> LookupdProcess:
        return next(lk for lk in self.lookupds if lk.is_running())

    def stats(self) -> dict[str, Any]:
        code, body = http("GET", f"http://{self.lookupd.http_address}/cluster/stats")
        assert code == 200, body
        return body

    def create_topic(self, name: str, partitions: int = 1, replicas: int = 3,
                     extra: str = "") -> dict[str, Any]:
        code, body = http("POST", f"http://{self.lookupd.http_address}/topic/create?topic={name}"
                          f"&partition_num={partitions}&replicator={replicas}{extra}")
        assert code == 200, body
        wait_until(lambda: all(self.role_of(self.node_by_id(p["leader"]), name, p["partition"])
                               == "leader" for p in self.partitions(name)),
                   what=f"leaders of {name} ready")
        # and every replica knows its role (a test that stops etcd next must not race the
        # followers' first watch event)
        wait_until(lambda: all(self.role_of(self.node_by_id(r), name, p["partition"])
                               in ("leader", "follower")
                               for p in self.partitions(name) for r in p["replicas"]),
                   what=f"replicas of {name} ready")
        return body

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        return self.stats()["topics"][topic]["partitions"]

    def node_by_id(self, node_id: str) -> NsqdProcess:
        for n in self.nodes:
            if n.is_running() and self.node_id(n) == node_id:
                return n
        raise KeyError(node_id)

    def node_id(self, n: NsqdProcess) -> str:
        return (n.data_path / "cluster-node-id").read_text().strip()

    def state(self, n: NsqdProcess) -> dict[str, Any]:
        code, body = http("GET", f"http://{n.http_address}/nsqx/cluster/state", timeout=3)
        assert code == 200, body
        return body

    def role_of(self, n: NsqdProcess, topic: str, partition: int = 0) -> str | None:
        for p in self.state(n)["partitions"]:
            if p["topic"] == topic and p["partition"] == partition:
                return p["role"]
        return None

    def leader(self, topic: str, partition: int = 0) -> NsqdProcess:
        p = self.partitions(topic)[partition]
        return self.node_by_id(p["leader"])

    def roles(self, topic: str) -> tuple[NsqdProcess, NsqdProcess, NsqdProcess]:
        """Partition 0 of ``topic`` (on three nodes): its leader, a follower, the other one."""
        leader = self.leader(topic)
        follower = next(n for n in self.nodes if n is not leader)
        other = next(n for n in self.nodes if n not in (leader, follower))
        return leader, follower, other

    def lookup(self, topic: str) -> dict[str, Any]:
        code, body = http("GET", f"http://{self.lookupd.http_address}/lookup?topic={topic}"
                          "&metainfo=true")
        assert code == 200, body
        return body

    def signer(self, node_id: str) -> Signer:
        """A signer with the cluster's secret, speaking as ``node_id`` (a member's credential)."""
        assert self.secret_file is not None
        with open(self.secret_file, "rb") as f:
            return Signer(f.read().strip(), node_id)

    def internal(self, n: NsqdProcess, method: str, path: str, query: dict[str, Any], *,
                 as_node: str | None = "probe", timeout: float = 10.0) -> tuple[int, Any]:
        """A request to ``n``'s cluster listener, signed as ``as_node`` (None: unsigned)."""
        q = {k: str(v) for k, v in query.items()}
        addr = self.state(n)["cluster_address"]
        headers = self.signer(as_node).headers(method, path, q, to=addr) if as_node else None
        return http(method, f"http://{addr}{path}?{urlencode(q)}", headers=headers,
                    timeout=timeout)


def publish_with_followers_stopped(cluster: Cluster, topic: str, forge: Callable[[], None],
                                   forging: Callable[[], bool], after: int = 200) -> list[int]:
    """The impersonation of issue 23: ``forge`` (one round of forged requests) runs in a
    loop in a thread while every follower of ``topic`` is SIGSTOPped; once ``forging`` says
    it is under way, 40 publishes to the leader, then ``after`` more once the followers'
    leases ended; the followers are continued. Returns the publishes' HTTP statuses."""
    leader = cluster.leader(topic)
    followers = [n for n in cluster.nodes if n is not leader]
    ids = {cluster.node_id(f) for f in followers}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            forge()

    def pub(body: bytes) -> int:
        return http("POST", f"http://{leader.http_address}/pub?topic={topic}", body,
                    timeout=15)[0]

    forger = threading.Thread(target=loop, daemon=True)
    forger.start()
    try:
        for f in followers:
            f.signal(signal.SIGSTOP)
        wait_until(forging, what="forged requests under way")
        results = [pub(b"m%d" % i) for i in range(40)]
        # long enough for the followers' leases to end (the unpatched leader re-admitted them)
        wait_until(lambda: not ids & {n["id"] for n in cluster.stats()["nodes"]},
                   timeout=30, what="the stopped followers' leases ended")
        results += [pub(b"n%d" % i) for i in range(after)]
    finally:
        stop.set()
        forger.join(10)
        for f in followers:
            f.signal(signal.SIGCONT)
    return results
