"""Operating a real cluster: `nsqx cluster up/status`, `nsqx node drain` under load, the
coordinator (nsqlookupd) dying, etcd restarting, and a replica with a corrupt tail rejoining."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from nsqx.cluster.etcd_server import EtcdServer
from tests.cluster.test_cluster_processes import fetch_bodies, pub
from tests.support.cluster import Cluster, http, wait_until
from tests.support.ports import free_block

pytestmark = pytest.mark.slow


def nsqx(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", *args], capture_output=True,
                          text=True, timeout=timeout)


class Publisher(threading.Thread):
    """Publishes numbered messages over HTTP to whoever leads (asking lookupd after errors)."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic = cluster, topic
        self.acked: list[bytes] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        node = None
        while not self.stop.is_set():
            try:
                if node is None:
                    prods = self.cluster.lookup(self.topic)["producers"]
                    node = f"127.0.0.1:{prods[0]['http_port']}" if prods else None
                    if node is None:
                        time.sleep(0.05)
                        continue
                body = b"%08d" % n
                code, _ = http("POST", f"http://{node}/pub?topic={self.topic}", body, timeout=5)
                n += 1
                if code == 200:
                    self.acked.append(body)
                else:
                    node = None
                    time.sleep(0.05)
            except (OSError, AssertionError, KeyError, IndexError):
                node = None
                time.sleep(0.05)


def test_cluster_up_status_and_clean_stop(tmp_path: Path) -> None:
    base = free_block([0, 1, 2, 3, 100, 101, 102, 103])
    lk = free_block([0, 1])
    etcd_port = free_block([0, 1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqx.cli.nsqx_cmd", "cluster", "up", "--nodes", "2",
         f"--base-port={base}", f"--lookupd-port={lk}", f"--etcd-port={etcd_port}",
         f"--data-path={tmp_path / 'c'}", "--cluster-id=up"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = None
    try:
        lookupd = f"127.0.0.1:{lk + 1}"
        wait_until(lambda: proc.poll() is None and http(
            "GET", f"http://{lookupd}/cluster/stats")[0] == 200
                   and len(http("GET", f"http://{lookupd}/cluster/stats")[1]["nodes"]) == 2,
                   timeout=60, what="two nodes up")
        code, body = http("POST", f"http://{lookupd}/topic/create?topic=t&replicator=2"
                          "&partition_num=1")
        assert code == 200, body
        out = nsqx("cluster", "status", f"--lookupd-http-address={lookupd}")
        assert out.returncode == 0, out.stderr
        assert "topic t: 1 partitions x 2 replicas" in out.stdout
        assert out.stdout.count("  node ") == 2
        status = json.loads(nsqx("cluster", "status", f"--lookupd-http-address={lookupd}",
                                 "--json").stdout)
        assert status["cluster_id"] == "up" and status["coordinator"]
    except AssertionError as e:
        failed = e
    finally:
        proc.send_signal(signal.SIGTERM)
        out_text = proc.communicate(timeout=60)[0]
    assert failed is None, f"{failed}\n{out_text}\n" + "".join(
        f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted((tmp_path / "c").glob("*.log")))
    assert proc.returncode == 0, out_text
    assert f"nsqd0       tcp 127.0.0.1:{base}" in out_text
    for port in (base, base + 100, lk, etcd_port):  # everything it started is gone
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))


def _up(tmp_path: Path, nodes: int, *extra: str) -> tuple[subprocess.Popen[str], int, Path]:
    base = free_block([o + 100 * i for i in range(nodes) for o in range(4)])
    lk = free_block([0, 1])
    etcd_port = free_block([0, 1])
    root = tmp_path / "c"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqx.cli.nsqx_cmd", "cluster", "up", f"--nodes={nodes}",
         f"--base-port={base}", f"--lookupd-port={lk}", f"--etcd-port={etcd_port}",
         f"--data-path={root}", "--cluster-id=up", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, lk + 1, root


def _member_pid(root: Path, name: str) -> int | None:
    return json.loads((root / "cluster-up.json").read_text())["members"][name]["pid"]


def test_cluster_up_survives_a_member_death_and_restarts_it(tmp_path: Path) -> None:
    """kill -9 of the leader: `cluster up` reports it, the others fail over, and
    `nsqx cluster restart` brings it back into the ISR; the members sign their requests."""
    proc, lk_http, root = _up(tmp_path, 3)
    lookupd = f"127.0.0.1:{lk_http}"
    try:
        wait_until(lambda: len(http("GET", f"http://{lookupd}/cluster/stats")[1]["nodes"]) == 3,
                   what="three nodes up")
        assert (root / "cluster.secret").stat().st_mode & 0o777 == 0o600
        code, body = http("POST", f"http://{lookupd}/topic/create?topic=t&replicator=3"
                          "&partition_num=1")
        assert code == 200, body

        def part() -> dict:
            return http("GET", f"http://{lookupd}/cluster/stats")[1]["topics"]["t"]["partitions"][0]

        leader_id = wait_until(lambda: part()["leader"], what="a leader")
        state = json.loads((root / "cluster-up.json").read_text())["members"]
        name = next(n for n, m in state.items() if m["node_id"] == leader_id)
        old_pid = state[name]["pid"]
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: part()["leader"] not in (None, leader_id), timeout=30,
                   what="a new leader after the kill")
        assert proc.poll() is None  # the rest keeps running
        wait_until(lambda: _member_pid(root, name) is None, what="the death recorded")
        out = nsqx("cluster", "restart", name, f"--data-path={root}", timeout=60)
        assert out.returncode == 0, out.stderr
        assert _member_pid(root, name) not in (None, old_pid)
        wait_until(lambda: leader_id in part()["isr"], timeout=60, what="back in the ISR")
        out = nsqx("cluster", "restart", "nsqd9", f"--data-path={root}")
        assert out.returncode == 1 and "no member nsqd9; members: nsqlookupd0" in out.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        text = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, text
    assert f"{name} exited with -9 (killed by SIGKILL); the others keep running" in text
    assert f"restarting {name} on request" in text
    out = nsqx("cluster", "restart", "nsqd0", f"--data-path={root}")
    assert out.returncode == 1 and "no `nsqx cluster up` is running" in out.stderr


def test_cluster_up_locks_etcd_and_gives_members_the_login(tmp_path: Path) -> None:
    """Issue 31: whoever reached etcd's client port could rewrite a partition's leader and
    ISR. `cluster up` turns etcd's auth on; its members log in with the password kept beside
    the cluster secret; started again on the same data, it finds auth on and logs in."""
    base = free_block([0, 1, 2, 3])
    lk = free_block([0, 1])
    etcd_port = free_block([0, 1])
    root = tmp_path / "c"
    cmd = [sys.executable, "-m", "nsqx.cli.nsqx_cmd", "cluster", "up", "--nodes=1",
           f"--base-port={base}", f"--lookupd-port={lk}", f"--etcd-port={etcd_port}",
           f"--data-path={root}", "--cluster-id=up"]
    lookupd = f"127.0.0.1:{lk + 1}"
    for run in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        failed = None
        try:
            wait_until(lambda: len(http("GET", f"http://{lookupd}/cluster/stats")[1]["nodes"])
                       == 1, timeout=60, what="the node registered (logged in to etcd)")
            assert (root / "etcd.password").stat().st_mode & 0o777 == 0o600
            code, body = http("POST", f"http://127.0.0.1:{etcd_port}/v3/kv/put",
                              json.dumps({"key": "L254cS91cC9mb3JnZWQ=", "value": "eA=="}).encode())
            assert code != 200 and "user name is empty" in str(body), (code, body)
            if run == 0:
                code, body = http("POST", f"http://{lookupd}/topic/create?topic=t&replicator=1"
                                  "&partition_num=1")
                assert code == 200, body
            wait_until(lambda: http("POST", f"http://127.0.0.1:{base + 1}/pub?topic=t",
                                    b"m")[0] == 200, timeout=30, what="a publish")
        except AssertionError as e:
            failed = e
        finally:
            proc.send_signal(signal.SIGTERM)
            text = proc.communicate(timeout=60)[0]
        assert failed is None, f"run {run}: {failed}\n{text}\n" + "".join(
            f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(root.glob("*.log")))
        assert proc.returncode == 0, text
        assert f"(auth on: user root, password in {root / 'etcd.password'})" in text, text


def test_cluster_up_restart_after(tmp_path: Path) -> None:
    proc, lk_http, root = _up(tmp_path, 1, "--restart-after=500ms")
    try:
        wait_until(lambda: _member_pid(root, "nsqd0"), what="nsqd0 started")
        old = _member_pid(root, "nsqd0")
        assert old is not None
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: _member_pid(root, "nsqd0") not in (None, old), timeout=30,
                   what="nsqd0 started again by itself")
    finally:
        proc.send_signal(signal.SIGTERM)
        text = proc.communicate(timeout=60)[0]
    assert "restarting nsqd0 (0.5 s after it died)" in text, text
    bad = nsqx("cluster", "up", "--restart-after=soon", f"--data-path={tmp_path / 'x'}")
    assert bad.returncode == 2 and "--restart-after" in bad.stderr


def test_cli_errors_are_clear() -> None:
    out = nsqx("node", "drain", "x", "--lookupd-http-address=127.0.0.1:1")
    assert out.returncode == 1 and "cannot reach nsqlookupd at 127.0.0.1:1" in out.stderr
    out = nsqx("cluster", "status", "--lookupd-http-address=127.0.0.1:1")
    assert out.returncode == 1 and "cannot reach nsqlookupd" in out.stderr


def test_drain_under_load_loses_nothing(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                        lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=4)
    cluster.create_topic("moving", partitions=1, replicas=3)
    victim = cluster.partitions("moving")[0]["leader"]
    out = nsqx("node", "drain", "nobody", f"--lookupd-http-address={cluster.lookupd.http_address}")
    assert out.returncode == 1 and "NODE_NOT_FOUND" in out.stderr
    publisher = Publisher(cluster, "moving")
    publisher.start()
    try:
        wait_until(lambda: len(publisher.acked) > 50, what="traffic")
        out = nsqx("node", "drain", victim,
                   f"--lookupd-http-address={cluster.lookupd.http_address}")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: victim not in (p := cluster.partitions("moving")[0])["replicas"]
                   and len(p["isr"]) == 3, timeout=60, what="the drained node's replica moved")
        n = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) > n + 50, what="traffic after the move")
    finally:
        publisher.stop.set()
        publisher.join(10)
    p = cluster.partitions("moving")[0]
    assert p["leader"] != victim and victim not in p["isr"]
    leader = cluster.node_by_id(p["leader"])
    bodies = fetch_bodies(leader, "moving")
    assert set(publisher.acked) <= set(bodies)  # 0 lost
    for r in p["replicas"]:  # every replica holds the same log
        wait_until(lambda r=r: fetch_bodies(cluster.node_by_id(r), "moving")[:len(bodies)]
                   == bodies, what=f"{r} in sync")


def test_coordinator_failover_and_etcd_restart(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                               lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3, lookupds=2)
    cluster.create_topic("steady", partitions=1, replicas=3)
    stats = cluster.stats()
    coord = stats["coordinator"]
    coord_proc = next(lk for lk in cluster.lookupds if coord.endswith(f":{lk.http_port}"))
    coord_proc.kill()  # no resignation: its lease runs out
    other = next(lk for lk in cluster.lookupds if lk is not coord_proc)
    wait_until(lambda: http("GET", f"http://{other.http_address}/cluster/stats")[1]
               .get("is_coordinator"), timeout=30, what="the other nsqlookupd coordinates")
    # the new coordinator handles a node loss
    leader = cluster.leader("steady")
    lid = cluster.node_id(leader)
    assert pub(leader, "steady", b"before")[0] == 200
    leader.kill()
    new = wait_until(lambda: (p := cluster.partitions("steady")[0])["leader"] not in (None, lid)
                     and cluster.node_by_id(p["leader"]), what="failover under the new coordinator")
    wait_until(lambda: pub(new, "steady", b"after")[0] == 200, what="publishes resume")
    # etcd restarts: nothing is lost, publishing goes on, and failover still works after
    etcd_server.restart()
    wait_until(lambda: pub(new, "steady", b"after-etcd")[0] == 200, timeout=30,
               what="publishes after the etcd restart")
    bodies = fetch_bodies(new, "steady")
    assert [b for b in bodies if b in (b"before", b"after", b"after-etcd")] == [
        b"before", b"after", b"after-etcd"]
    epoch = cluster.partitions("steady")[0]["epoch"]
    new.kill()
    third = wait_until(lambda: (p := cluster.partitions("steady")[0])["epoch"] > epoch
                       and p["leader"] is not None, timeout=30,
                       what="failover after the etcd restart")
    assert third


def test_replica_with_a_corrupt_tail_rejoins(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                             lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("torn", partitions=1, replicas=3)
    leader = cluster.leader("torn")
    for i in range(100):
        assert pub(leader, "torn", b"t%03d" % i)[0] == 200
    follower = next(n for n in cluster.nodes if n is not leader)
    fid = cluster.node_id(follower)
    follower.kill()
    seg = sorted((follower.data_path / "topics" / "t-torn" / "p0").glob("*.log"))[-1]
    with open(seg, "ab") as f:
        f.write(os.urandom(777))  # a torn, garbage tail
    for i in range(100, 120):
        assert pub(leader, "torn", b"t%03d" % i)[0] == 200  # ISR shrinks after the lag timeout
    follower.restart(graceful=False)
    wait_until(lambda: fid in cluster.partitions("torn")[0]["isr"], timeout=40,
               what="the repaired replica rejoined")
    assert fetch_bodies(follower, "torn") == [b"t%03d" % i for i in range(120)]
    assert "truncat" in follower.all_logs().lower()


def test_node_restarts_as_the_same_member_on_new_ports(etcd_server: EtcdServer,  # type: ignore[no-untyped-def]
                                                       nsqd_factory, lookupd_factory) -> None:
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    n = cluster.nodes[0]
    ident = cluster.node_id(n)
    n.stop()
    # same data path, other ports: the id stays, the address is updated
    n.args = [a for a in n.args if not a.startswith(("--tcp-address", "--http-address"))]
    n.start()
    wait_until(lambda: any(x["id"] == ident and x["http_address"].endswith(f":{n.http_port}")
                           for x in cluster.stats()["nodes"]), what="re-registered")
    assert urllib.parse.quote(ident)


def test_etcd_unreachable_mid_run(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                  lookupd_factory) -> None:
    """With etcd down, a leader whose followers still fetch keeps acking; when a follower
    dies too, its publishes are refused with E_PUB_FAILED (not hung, not acked unsafely);
    once etcd is back the ISR shrinks and publishing resumes."""
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=3)
    cluster.create_topic("cut", partitions=1, replicas=3)
    leader = cluster.leader("cut")
    lookupd = cluster.lookupd
    etcd_server.stop()
    assert pub(leader, "cut", b"while-etcd-down")[0] == 200  # the ISR still acks
    follower = next(n for n in cluster.nodes if n is not leader)
    follower.kill()
    t0 = time.monotonic()
    code, body = pub(leader, "cut", b"refused")
    assert (code, body) == (503, {"message": "E_PUB_FAILED"})
    assert time.monotonic() - t0 < 30  # answered, not hung
    assert "etcd is unreachable" in leader.all_logs()
    etcd_server.start()
    wait_until(lambda: pub(leader, "cut", b"after")[0] == 200, timeout=60,
               what="publishing resumes with etcd back")
    assert lookupd.is_running()
    assert fetch_bodies(leader, "cut")[0] == b"while-etcd-down"


def test_etcd_unreachable_at_start(etcd_server: EtcdServer, nsqd_factory,  # type: ignore[no-untyped-def]
                                   lookupd_factory) -> None:
    """An nsqd started while etcd is down serves (it is up, /ping answers), refuses writes
    it cannot make safe with a clear error, and joins the cluster once etcd is there."""
    etcd_server.stop()
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory)
    cluster.lookupds.append(lookupd_factory.start(
        ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
         "--broadcast-address=127.0.0.1", *cluster.flags]))
    node = cluster.add_node()
    assert http("GET", f"http://{node.http_address}/ping")[0] == 200
    assert pub(node, "early", b"x") == (503, {"message": "E_PUB_FAILED"})
    wait_until(lambda: "etcd unreachable" in node.all_logs(), what="the node says why")
    etcd_server.start()
    wait_until(lambda: len(cluster.stats()["nodes"]) == 1, timeout=30, what="the node joined")
    code, body = http("POST", f"http://{cluster.lookupd.http_address}/topic/create?topic=early"
                      "&partition_num=1&replicator=1&min_isr=1")
    assert code == 200, body
    wait_until(lambda: pub(node, "early", b"ok")[0] == 200, what="writes once led")
