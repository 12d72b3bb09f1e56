"""Replicated ingest vs a standalone node, side by side in one run; and failover time.

    .venv/bin/python bench/cluster_ingest.py [--seconds 10] [--replicas 3] [--sync-every N] [--secret] [--tls]
        [--replication stream|http]
    .venv/bin/python bench/cluster_ingest.py --compare plain,secret+tls [--rounds 3] [--seconds 6]

1. standalone: one nsqd (default durable settings), MPUB 200 B x 200 from two writer
   processes (the same load generator as bench/nsqd_compare.py);
2. cluster: etcd + nsqlookupd + 3 nsqd in cluster mode, a topic of 1 partition x R replicas,
   the same load against its leader: each MPUB is acknowledged once every ISR member has it;
3. failover: kill -9 that leader and time until a PUB to the new leader succeeds.

Prints msgs/s of both, the ratio (issue target: >= 0.5x), server CPU per message of the
leader and the failover time (target: < 5 s). Everything binds to 127.0.0.1 and is stopped
at the end. All processes share this machine's 2 cores: the followers' CPU comes out of
the leader's budget, as it would not on three machines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nsqx.benchmark import scenarios  # noqa: E402
from nsqx.cluster.etcd_server import EtcdServer  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait(pred, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit("timed out")


class Proc:
    def __init__(self, args: list[str], log: Path) -> None:
        self.proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def nsqd(tmp: Path, name: str, extra: list[str]) -> tuple[Proc, str, str]:
    tcp, http_ = free_port(), free_port()
    data = tmp / name
    data.mkdir()
    p = Proc([sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address=127.0.0.1:{tcp}",
              f"--http-address=127.0.0.1:{http_}", f"--data-path={data}",
              "--broadcast-address=127.0.0.1", "--log-level=warn", *extra], tmp / f"{name}.log")
    wait(lambda: http("GET", f"http://127.0.0.1:{http_}/ping")[0] == 200)
    return p, f"127.0.0.1:{tcp}", f"127.0.0.1:{http_}"


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process: replication's cost is mostly the kernel's."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _spy(pid: int, seconds: float, out: str) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)),
                             "-f", "speedscope", "-o", out, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def member_tls(d: Path) -> list[str]:
    """A CA and one member certificate (server and client use, 127.0.0.1): the flags."""
    d.mkdir()

    def ssl_(*a: str) -> None:
        subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)

    ssl_("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench CA")
    ssl_("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", "m.key", "-out", "m.csr", "-subj", "/O=bench member")
    (d / "m.ext").write_text("extendedKeyUsage=serverAuth,clientAuth\n"
                             "subjectAltName=IP:127.0.0.1\n")
    ssl_("x509", "-req", "-in", "m.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
         "2", "-days", "2", "-extfile", "m.ext", "-out", "m.pem")
    return [f"--cluster-tls-cert={d / 'm.pem'}", f"--cluster-tls-key={d / 'm.key'}",
            f"--cluster-tls-ca={d / 'ca.pem'}"]


class Cluster:
    """etcd (shared) + nsqlookupd + 3 nsqd of one trust configuration, a topic ``bench`` of
    1 partition x ``replicas`` on it; ``leader`` and ``followers`` are (Proc, tcp, http)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, name: str, args: argparse.Namespace,
                 extra: list[str], *, secret: bool, tls: bool) -> None:
        self.tmp = tmp / name
        self.procs: list[Proc] = []
        self.tmp.mkdir()
        try:
            self._start(etcd, name, args, extra, secret=secret, tls=tls)
        except BaseException:  # what started so far is not in the caller's list yet
            self.stop()
            raise

    def _start(self, etcd: EtcdServer, name: str, args: argparse.Namespace, extra: list[str],
               *, secret: bool, tls: bool) -> None:
        flags = [f"--cluster-leadership-addresses={etcd.endpoint}", f"--cluster-id={name}"]
        node_flags = [f"--cluster-replication={args.replication}"]
        if secret:
            from nsqx.cluster.trust import generate_secret_file

            flags.append(f"--cluster-secret-file={generate_secret_file(self.tmp / 'secret')}")
        if tls:
            flags += member_tls(self.tmp / "tls")
        lk_tcp, lk_http = free_port(), free_port()
        self.lk_http = lk_http
        self.procs.append(Proc([sys.executable, "-m", "nsqx.cli.nsqlookupd",
                                f"--tcp-address=127.0.0.1:{lk_tcp}",
                                f"--http-address=127.0.0.1:{lk_http}",
                                "--broadcast-address=127.0.0.1", "--log-level=warn", *flags],
                               self.tmp / "lookupd.log"))
        self.nodes = []
        for i in range(3):
            np_, ntcp, nhttp = nsqd(self.tmp, f"node{i}", [
                *extra, *flags, *node_flags, f"--lookupd-tcp-address=127.0.0.1:{lk_tcp}"])
            self.procs.append(np_)
            self.nodes.append((np_, ntcp, nhttp))
        wait(lambda: len(self.stats().get("nodes", [])) == 3)
        code, body = http("POST", f"http://127.0.0.1:{lk_http}/topic/create?topic=bench"
                          f"&partition_num=1&replicator={args.replicas}")
        assert code == 200, body
        self.leader_id = json.loads(body)["partitions"][0]["leader"]
        self.leader = self.node(self.leader_id)
        self.followers = [n for n in self.nodes if n is not self.leader]
        wait(lambda: http("POST", f"http://{self.leader[2]}/pub?topic=bench", b"warm")[0] == 200)

    def node(self, node_id: str) -> tuple[Proc, str, str]:
        return next(n for i, n in enumerate(self.nodes)
                    if (self.tmp / f"node{i}" / "cluster-node-id").read_text().strip() == node_id)

    def stats(self) -> dict:
        code, body = http("GET", f"http://127.0.0.1:{self.lk_http}/cluster/stats")
        return json.loads(body) if code == 200 else {}

    def ingest(self, seconds: float, window: int) -> tuple[dict, list[tuple[float, float]]]:
        """The leader's ingest result and (user, system) CPU seconds of leader, followers."""
        members = (self.leader, *self.followers)
        before = [cpu_split(n[0].proc.pid) for n in members]
        r = scenarios.ingest(self.leader[1], "bench", seconds=seconds,
                             pid=self.leader[0].proc.pid, window=window)
        split = [(u1 - u0, s1 - s0) for n, (u0, s0) in zip(members, before, strict=True)
                 for u1, s1 in [cpu_split(n[0].proc.pid)]]
        return r, split

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def compare(tmp: Path, args: argparse.Namespace, extra: list[str]) -> None:
    """``--compare``: one cluster per configuration, all up at once; ingest runs against them
    interleaved (a, b, a, b, ...) ``--rounds`` times, so a busy machine weighs on each alike.
    Prints each run, then median and range of leader CPU/msg and msgs/s, and the ratio of
    the medians to the first configuration's."""
    names = args.compare.split(",")
    for n in names:
        if set(n.split("+")) - {"plain", "secret", "tls"}:
            raise SystemExit(f"--compare: unknown configuration {n!r} (plain, secret, tls, "
                             f"secret+tls)")
    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    clusters: dict[str, Cluster] = {}
    try:
        for n in names:
            parts = set(n.split("+"))
            clusters[n] = Cluster(tmp, etcd, n.replace("+", "-"), args, extra,
                                  secret="secret" in parts, tls="tls" in parts)
        runs: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]  # neither always goes first
            for n in order:
                r, split = clusters[n].ingest(args.seconds, args.window)
                m = r["messages"] / 1e6
                lu, ls = split[0]
                fol = sum(u + s for u, s in split[1:]) / max(len(split) - 1, 1) / m
                runs[n].append((r.get("server_us_per_msg", 0), r["msgs_per_s"], fol, lu / m))
                print(f"round {rnd + 1} {n:<11} {r['msgs_per_s']:>10,.0f} msgs/s  leader "
                      f"{r.get('server_us_per_msg', 0):.3f} us/msg (user {lu / m:.3f} + "
                      f"system {ls / m:.3f})  follower {fol:.3f} us/msg", flush=True)
                if r.get("errors"):
                    print("  errors:", r["errors"])
        med = {n: [statistics.median(x[i] for x in runs[n]) for i in range(4)] for n in names}
        print(f"\nmedians of {args.rounds} interleaved rounds of {args.seconds:g} s "
              f"({args.replication} replication), ratio to {names[0]}:")
        for n in names:
            us, rate, fol, user = (sorted(x[i] for x in runs[n]) for i in range(4))
            m, b = med[n], med[names[0]]
            print(f"  {n:<11} leader {m[0]:.3f} us/msg ({us[0]:.3f}-{us[-1]:.3f}, x{m[0] / b[0]:.3f})"
                  f" user {m[3]:.3f} ({user[0]:.3f}-{user[-1]:.3f})  {m[1]:>9,.0f} msgs/s "
                  f"({rate[0]:,.0f}-{rate[-1]:,.0f}, x{m[1] / b[1]:.3f})  follower {m[2]:.3f} "
                  f"us/msg (x{m[2] / b[2]:.3f})")
    finally:
        for c in clusters.values():
            c.stop()
        etcd.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--window", type=int, default=8,
                    help="MPUBs in flight per writer, the same for both runs (default 8)")
    ap.add_argument("--sync-every", type=int, default=0, help="nsqd --sync-every (0: default)")
    ap.add_argument("--secret", action="store_true", help="give the cluster a "
                    "--cluster-secret-file (signed replication requests)")
    ap.add_argument("--tls", action="store_true", help="mutual TLS between the members "
                    "(--cluster-tls-*, certificates made with the openssl CLI)")
    ap.add_argument("--replication", choices=("stream", "http"), default="stream",
                    help="the followers' fetches: one stream per leader or HTTP requests "
                    "(nsqd --cluster-replication)")
    ap.add_argument("--compare", metavar="A,B,...", help="no standalone run nor failover: "
                    "clusters of these configurations (plain, secret, tls, secret+tls) "
                    "measured interleaved, --rounds times each; medians, ranges, ratios")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --compare (default 3)")
    ap.add_argument("--profile", metavar="DIR", help="py-spy record the standalone node, the leader "
                    "and a follower into DIR (needs py-spy)")
    ap.add_argument("--perf", metavar="FILE", help="perf record -g the three cluster nodes "
                    "during the replicated run into FILE (CPU samples, kernel included)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    extra = [f"--sync-every={args.sync_every}"] if args.sync_every else []
    if args.compare:
        try:
            compare(tmp, args, extra)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    procs: list[Proc] = []
    out: dict[str, object] = {}
    cluster: Cluster | None = None
    etcd: EtcdServer | None = None
    try:
        p, tcp, http_addr = nsqd(tmp, "standalone", extra)
        procs.append(p)
        scenarios.http_post(http_addr, "/topic/create?topic=bench")
        s0 = cpu_split(p.proc.pid)
        spy = None
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            spy = _spy(p.proc.pid, args.seconds, f"{args.profile}/standalone.json")
        r = scenarios.ingest(tcp, "bench", seconds=args.seconds, pid=p.proc.pid,
                             window=args.window)
        if spy is not None:
            spy.wait(30)
        su, ss = (a - b for a, b in zip(cpu_split(p.proc.pid), s0, strict=True))
        out["standalone"] = r
        p.stop()
        print(f"standalone  {r['msgs_per_s']:>12,.0f} msgs/s  "
              f"{r.get('server_us_per_msg', 0):.2f} us CPU/msg "
              f"(user {su / r['messages'] * 1e6:.2f} + system {ss / r['messages'] * 1e6:.2f})")

        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        cluster = Cluster(tmp, etcd, "bench", args, extra, secret=args.secret, tls=args.tls)
        leader, followers = cluster.leader, cluster.followers
        spies = []
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            for who, n in (("leader", leader), ("follower", followers[0])):
                spies.append(_spy(n[0].proc.pid, args.seconds, f"{args.profile}/{who}.json"))
        if args.perf:  # CPU (not wall) samples of the three nodes, kernel included
            pids = ",".join(str(n[0].proc.pid) for n in (leader, *followers))
            spies.append(subprocess.Popen(
                ["perf", "record", "-F", "997", "-g", "-p", pids, "-o", args.perf, "--",
                 "sleep", str(int(args.seconds))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            print(f"perf: leader pid {leader[0].proc.pid}, followers "
                  f"{', '.join(str(n[0].proc.pid) for n in followers)}")
        r, split = cluster.ingest(args.seconds, args.window)
        out["replicated"] = r
        for spy in spies:
            spy.wait(30)
        ratio = r["msgs_per_s"] / out["standalone"]["msgs_per_s"]  # type: ignore[index]
        print(f"replicated  {r['msgs_per_s']:>12,.0f} msgs/s  "
              f"{r.get('server_us_per_msg', 0):.2f} us CPU/msg (leader)  "
              f"ratio {ratio:.2f}x (target >= 0.5x), {args.replicas} replicas, ISR ack")
        if r["messages"]:
            m = r["messages"] / 1e6
            print("            CPU/msg user+system: " + ", ".join(
                f"{who} {u / m:.2f}+{s_ / m:.2f} us" for who, (u, s_) in
                zip(("leader", "follower", "follower"), split, strict=False)))
            base = out["standalone"]  # type: ignore[index]
            base_us = base.get("server_us_per_msg", 0)  # type: ignore[union-attr]
            if base_us:
                print(f"            vs standalone ({args.replication}): " + ", ".join(
                    f"{who} {(u + s_) / m / base_us:.2f}x" for who, (u, s_) in
                    zip(("leader", "follower", "follower"), split, strict=False))
                    + " (issue targets: leader <= 1.3x, follower <= 0.8x)")
        if r.get("errors"):
            print("  errors:", r["errors"])

        if args.replicas < 3:
            print("failover    not measured: with fewer than 3 replicas the survivors are below "
                  "the default min ISR of 2, so publishes are refused (by design)")
            return
        t0 = time.monotonic()
        os.kill(leader[0].proc.pid, signal.SIGKILL)
        while True:
            st = cluster.stats()
            parts = st.get("topics", {}).get("bench", {}).get("partitions", [{}])
            new = parts[0].get("leader")
            if new and new != cluster.leader_id:
                n = cluster.node(new)
                if http("POST", f"http://{n[2]}/pub?topic=bench", b"after")[0] == 200:
                    break
            if time.monotonic() - t0 > 60:
                raise SystemExit("no failover in 60 s")
            time.sleep(0.02)
        failover = time.monotonic() - t0
        print(f"failover    {failover:.2f} s from kill -9 of the leader to an acknowledged PUB "
              f"on the new one (target < 5 s)")
    finally:
        if cluster is not None:
            cluster.stop()
        if etcd is not None:
            etcd.stop()
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
