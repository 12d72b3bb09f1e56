"""``nsqx import`` on a data directory written by a real Go nsqd 1.3.0.

The fixture (``fixtures/go-1.3.0/data``) and ``expected.json`` were made by
``python tests/migrate/make_fixtures.py --go-nsqd PATH`` with a Go nsqd v1.3.0 built from
source as bench/README.md describes (not run by CI): topic ``orders`` with channels
``billing`` (6 delivered, 4 FINed, 2+4 in flight at shutdown), ``shipping`` and ``audit``
(paused), a deferred message; topic ``events`` paused with its 4 messages still in the
topic's own queue; topic ``lonely`` with no channel. Go nsqd was stopped with SIGTERM, so its
memory, in-flight and deferred messages are in the files. ``expected.json`` is what Go itself
delivered from a copy of that directory, per channel: id, timestamp, attempts, body.

Here the directory is imported, nsqx's nsqd is started on the result and pynsq (a stock
client) consumes every channel: the ids, bodies, timestamps and attempts must be Go's, in
Go's order, and FIN, REQ and TOUCH by Go's ids must work, also after nsqd was killed
(-9) and started again in the middle (the FINed ones are not delivered again).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nsqx.migrate.diskqueue import read_meta, read_queue
from nsqx.protocol.frames import decode_message
from nsqx.storage.cursor import ChannelCursor
from nsqx.storage.log import PartitionLog
from tests.support.clients import pynsq_runner

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "go-1.3.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())["channels"]


def nsqx_import(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", "import", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def go_data(tmp_path: Path) -> Path:
    """A writable copy of the Go data directory."""
    dst = tmp_path / "go-data"
    shutil.copytree(FIXTURE / "data", dst)
    return dst


def http(nsqd, method: str, path: str) -> bytes:
    req = urllib.request.Request(f"http://{nsqd.http_address}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def stats(nsqd) -> dict[str, dict]:
    doc = json.loads(http(nsqd, "GET", "/stats?format=json"))
    return {t["topic_name"]: t for t in doc["topics"]}


def test_dry_run_prints_counts_and_writes_nothing(go_data: Path, tmp_path: Path) -> None:
    target = tmp_path / "nsqx"
    res = nsqx_import("--from-nsqd-data", go_data, "--data-path", target, "--dry-run")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "channel billing: 9 pending (9 own + 0 from the topic)" in out
    assert "channel shipping: 13 pending" in out
    assert "channel audit (paused): 13 pending" in out
    assert "topic events (paused): 4 in the topic's queue" in out
    assert "channel a: 4 pending (0 own + 4 from the topic)" in out
    assert "topic lonely: 3 in the topic's queue (no channel" in out
    assert "would import 3 topics, 5 channels, 42 messages stored" in out
    assert not target.exists()


@pytest.mark.slow
def test_import_then_a_stock_client_gets_each_channels_pending_messages(
        go_data: Path, tmp_path: Path, nsqd_factory) -> None:
    target = tmp_path / "nsqx"
    res = nsqx_import("--from-nsqd-data", go_data, "--data-path", target)
    assert res.returncode == 0, res.stderr
    assert "imported 3 topics, 5 channels, 42 messages stored" in res.stdout

    # the frames carry Go's ids (no go_id header: only a message that cannot keep its id
    # has one), each channel's block in Go's order
    stored: dict[str, list[str]] = {}
    for topic in ("orders", "events", "lonely"):
        with PartitionLog(target / "topics" / f"t-{topic}" / "p0") as log_:
            stored[topic] = [bytes(log_.read_frame(off)[18:34]).decode()
                             for off in range(log_.start_offset, log_.next_offset)]
            assert all(log_.headers(off) is None
                       for off in range(log_.start_offset, log_.next_offset))
    assert stored["orders"] == [m["id"] for c in ("billing", "shipping", "audit")
                                for m in EXPECTED["orders"][c]]
    assert stored["events"] == [m["id"] for m in EXPECTED["events"]["a"]]

    nsqd = nsqd_factory.start(data_path=target)
    st = stats(nsqd)
    assert set(st) == {"orders", "events", "lonely"}
    assert st["events"]["paused"] is True
    # the paused topic's backlog is counted, as Go's depth counts it (issue 30)
    assert {c["channel_name"]: c["depth"] for c in st["events"]["channels"]} == {"a": 4, "b": 4}
    chans = {c["channel_name"]: c for c in st["orders"]["channels"]}
    assert chans["audit"]["paused"] is True and chans["billing"]["paused"] is False
    assert {n: c["depth"] for n, c in chans.items()} == {"billing": 9, "shipping": 13,
                                                          "audit": 13}
    assert st["lonely"]["channels"] == []
    assert_message_get_by_go_id(nsqd)

    http(nsqd, "POST", "/channel/unpause?topic=orders&channel=audit")
    http(nsqd, "POST", "/topic/unpause?topic=events")
    http(nsqd, "POST", "/channel/create?topic=lonely&channel=first")
    runner = pynsq_runner()

    def consume(topic: str, channel: str, expect: int, **kw):
        got = runner.run("consume", {"nsqd": nsqd.tcp_address, "topic": topic,
                                     "channel": channel, "expect": expect,
                                     "max_in_flight": 1, "idle_s": 0.5, **kw})
        assert not got.timed_out and not got.errors, got.describe()
        return got

    # audit: 5 FINed by Go's ids, then nsqd is killed (-9) and started again
    audit = EXPECTED["orders"]["audit"]
    got = consume("orders", "audit", 5, fin_limit=5)
    assert [d.id for d in got.deliveries if d.action == "fin"] == [m["id"] for m in audit[:5]]
    wait_persisted(target / "topics" / "t-orders" / "channels" / "c-audit.cursor",
                   range(22, 27))  # audit's block follows billing's 9 and shipping's 13
    nsqd.restart(graceful=False)
    assert {c["channel_name"]: c["depth"] for c in stats(nsqd)["orders"]["channels"]} == {
        "billing": 9, "shipping": 13, "audit": 8}
    # the other 8, none of the FINed ones: each REQ'd by its Go id on its first delivery
    # and FINed when it comes back, same id, attempts + 1
    got = consume("orders", "audit", 8, mode="req")
    want = [(m["id"], m["attempts"]) for m in audit[5:]]
    assert [(d.id, d.attempts) for d in got.deliveries if d.action == "req"] == want
    assert sorted((d.id, d.attempts) for d in got.deliveries if d.action == "fin") == sorted(
        (i, a + 1) for i, a in want)
    assert len(got.deliveries) == 16

    # shipping: each TOUCHed twice by its Go id, FINed after longer than the message
    # timeout (a TOUCH that missed would let it time out: delivered again, FIN failed)
    ship = EXPECTED["orders"]["shipping"]
    got = consume("orders", "shipping", len(ship), mode="touch", touches=2,
                  touch_interval_ms=1000, max_in_flight=len(ship),
                  conn={"msg_timeout_ms": 2000})
    assert sorted((d.id, d.attempts, d.action) for d in got.deliveries) == sorted(
        (m["id"], m["attempts"], "touch+fin") for m in ship)

    for topic, channel in (("orders", "billing"), ("events", "a"), ("events", "b"),
                           ("lonely", "first")):
        want_ = EXPECTED[topic][channel]
        got = consume(topic, channel, len(want_))
        assert [(d.id, d.body, d.timestamp_ns, d.attempts) for d in got.deliveries] == [
            (m["id"], bytes.fromhex(m["body"]), m["timestamp"], m["attempts"]) for m in want_
        ], f"{topic}/{channel}"
    # every FIN was taken: nothing is left anywhere
    for t in stats(nsqd).values():
        assert all(c["depth"] == 0 and c["in_flight_count"] == 0 for c in t["channels"]), t
    assert_message_get_by_go_id(nsqd)


def assert_message_get_by_go_id(nsqd) -> None:
    """/message/get finds an imported message by its Go id (the first copy of it)."""
    m = EXPECTED["orders"]["billing"][2]
    doc = json.loads(http(nsqd, "GET", f"/message/get?topic=orders&search_pos={m['id']}"))
    assert (doc["id"], doc["offset"], doc["timestamp"]) == (m["id"], 2, m["timestamp"])
    assert doc["body"] == bytes.fromhex(m["body"]).decode()
    req = urllib.request.Request(f"http://{nsqd.http_address}/message/get?topic=orders"
                                 f"&search_pos={m['id']}&raw=1")
    with urllib.request.urlopen(req, timeout=10) as r:  # the raw answer names Go's id too
        assert r.headers["X-Nsqx-Message-Id"] == m["id"]
        assert r.read() == bytes.fromhex(m["body"])


def wait_persisted(cursor_file: Path, offsets: range, timeout: float = 15.0) -> None:
    """Until nsqd's periodic pass has written the FINs of ``offsets`` to the cursor file
    (read from a copy: loading a cursor may write beside it)."""
    deadline = time.monotonic() + timeout
    copy = cursor_file.parent.parent / "cursor-copy"
    while True:
        shutil.copyfile(cursor_file, copy)
        cur = ChannelCursor(0, state_path=copy)
        done = set(range(cur.confirmed)).union(
            *(range(a, b) for a, b in cur.finished_ranges()))
        cur.close()
        if set(offsets) <= done:
            return
        assert time.monotonic() < deadline, f"FINs of {offsets} not persisted: {done}"
        time.sleep(0.1)


def test_a_corrupt_and_a_truncated_file_are_reported_and_the_rest_imported(
        go_data: Path, tmp_path: Path) -> None:
    billing = go_data / "orders:billing.diskqueue.000000.dat"
    meta = read_meta(go_data, "orders:billing")
    assert meta is not None and meta.read_pos > 0
    data = bytearray(billing.read_bytes())
    data[meta.read_pos:meta.read_pos + 4] = (1 << 30).to_bytes(4, "big")  # a bad size field
    billing.write_bytes(bytes(data))
    shipping = go_data / "orders:shipping.diskqueue.000000.dat"
    cut = shipping.stat().st_size - 10  # mid-way through the last message
    os.truncate(shipping, cut)

    target = tmp_path / "nsqx"
    res = nsqx_import("--from-nsqd-data", go_data, "--data-path", target)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (f"orders:billing.diskqueue.000000.dat: offset {meta.read_pos}: invalid message "
            "size 1073741824") in res.stderr
    last = _last_record_start(FIXTURE / "data" / shipping.name)
    assert (f"orders:shipping.diskqueue.000000.dat: offset {last}: truncated message"
            in res.stderr), res.stderr
    # billing lost the 3 messages left in its bad file (after readPos), not the 6 of its next
    assert "channel billing: 6 pending" in res.stdout
    assert "channel shipping: 12 pending" in res.stdout
    assert "channel audit (paused): 13 pending" in res.stdout
    assert "imported 3 topics" in res.stdout
    assert (target / "nsqd.dat").exists()


def _last_record_start(path: Path) -> int:
    data, pos, last = path.read_bytes(), 0, 0
    while pos < len(data):
        last = pos
        pos += 4 + int.from_bytes(data[pos:pos + 4], "big")
    return last


@pytest.mark.slow
def test_refuses_a_data_path_nsqd_is_using(go_data: Path, nsqd_factory) -> None:
    nsqd = nsqd_factory.start()
    for extra in ((), ("--dry-run",)):
        res = nsqx_import("--from-nsqd-data", go_data, "--data-path", nsqd.data_path, *extra)
        assert res.returncode == 2
        assert "in use (is nsqd running on it?" in res.stderr, res.stderr
    assert "orders" not in stats(nsqd)


def test_refuses_a_go_data_path_go_nsqd_still_holds(go_data: Path, tmp_path: Path) -> None:
    fd = os.open(go_data, os.O_RDONLY)  # what Go nsqd's dirlock does while it runs
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = nsqx_import("--from-nsqd-data", go_data, "--data-path", tmp_path / "nsqx")
    finally:
        os.close(fd)
    assert res.returncode == 2
    assert "in use: stop Go nsqd first" in res.stderr
    assert not (tmp_path / "nsqx").exists()


def test_refuses_topics_already_in_the_data_path(go_data: Path, tmp_path: Path) -> None:
    target = tmp_path / "nsqx"
    assert nsqx_import("--from-nsqd-data", go_data, "--data-path", target).returncode == 0
    res = nsqx_import("--from-nsqd-data", go_data, "--data-path", target)
    assert res.returncode == 2
    assert "already has topic(s) orders, events, lonely" in res.stderr


def test_reader_reports_a_missing_file_and_a_bad_meta_file(go_data: Path) -> None:
    problems: list[str] = []
    (go_data / "orders:billing.diskqueue.000000.dat").unlink()
    msgs = list(read_queue(go_data, "orders:billing", problems.append))
    assert [m.body for m in msgs] == [bytes.fromhex(m["body"])
                                       for m in EXPECTED["orders"]["billing"][3:]]
    assert problems == ["orders:billing.diskqueue.000000.dat: missing (meta says messages "
                        "are pending in it)"]
    (go_data / "orders:audit.diskqueue.meta.dat").write_text("garbage\n")
    problems.clear()
    assert list(read_queue(go_data, "orders:audit", problems.append)) == []
    assert problems and "not a go-diskqueue meta file" in problems[0]


def test_go_messages_keep_timestamp_and_attempts(go_data: Path) -> None:
    """The reader alone against what Go delivered (attempts: Go sends stored + 1)."""
    got = list(read_queue(go_data, "orders:billing", lambda line: pytest.fail(line)))
    want = EXPECTED["orders"]["billing"]
    assert [(m.id.decode(), m.timestamp, m.attempts + 1, m.body.hex()) for m in got] == [
        (m["id"], m["timestamp"], m["attempts"], m["body"]) for m in want]


def test_progress_lines_go_to_stderr(go_data: Path, tmp_path: Path) -> None:
    res = nsqx_import("--from-nsqd-data", go_data, "--data-path", tmp_path / "nsqx",
                      "--progress-interval", "0")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("nsqx import: imported ")]
    assert lines and lines[-1].startswith("nsqx import: imported 42 messages (")
    assert all(ln.endswith(" msg/s)") for ln in lines)
    assert "msg/s" not in res.stdout


GO_ID = 0x18aa034205269000  # a Go id of 2026 (top 16 bits 6314)


def _write_go_queue(root: Path, name: str, bodies: list[bytes], attempts: int = 0,
                    ids: list[bytes] | None = None) -> None:
    """A one-file go-diskqueue holding ``bodies`` (timestamps 1000+i)."""
    ids = ids or [b"%016x" % (GO_ID + i) for i in range(len(bodies))]
    recs = [struct.pack(">qH16s", 1000 + i, attempts, ids[i]) + b
            for i, b in enumerate(bodies)]
    data = b"".join(struct.pack(">i", len(r)) + r for r in recs)
    (root / f"{name}.diskqueue.000000.dat").write_bytes(data)
    (root / f"{name}.diskqueue.meta.dat").write_text(f"{len(bodies)}\n0,0\n0,{len(data)}\n")


def test_channel_blocks_and_the_topic_backlog_reach_the_right_channels(tmp_path: Path) -> None:
    """Own queues on two channels plus a topic backlog: each channel's cursor over the one
    log yields its own block and the topic's, nothing of the other channel's."""
    go = tmp_path / "go"
    go.mkdir()
    (go / "nsqd.dat").write_text(json.dumps({"topics": [{"name": "t", "paused": False, "channels": [
        {"name": "c1", "paused": False}, {"name": "c2", "paused": True}]}], "version": "1.3.0"}))
    _write_go_queue(go, "t:c1", [b"c1-a", b"c1-b"], attempts=3)
    _write_go_queue(go, "t:c2", [b"c2-a"])
    _write_go_queue(go, "t", [b"t-a", b"t-b"])
    target = tmp_path / "nsqx"
    res = nsqx_import("--from-nsqd-data", go, "--data-path", target)
    assert res.returncode == 0, res.stderr
    tdir = target / "topics" / "t-t"
    with PartitionLog(tdir / "p0") as log_:
        got = {}
        for ch in ("c1", "c2"):
            cur = ChannelCursor(0, state_path=tdir / "channels" / f"c-{ch}.cursor")
            assert cur.paused is (ch == "c2")
            cur.paused = False
            offs = [o for d in cur.take(1, 100, log_.next_offset, 0, 1000)
                    for o in range(d.offset, d.offset + d.count)]
            frames = [decode_message(bytes(log_.read_frame(o))[8:]) for o in offs]
            got[ch] = [(body, ts, att) for ts, att, _, body in frames]
            cur.close()
    assert got["c1"] == [(b"c1-a", 1000, 4), (b"c1-b", 1001, 4), (b"t-a", 1000, 1),
                         (b"t-b", 1001, 1)]
    assert got["c2"] == [(b"c2-a", 1000, 1), (b"t-a", 1000, 1), (b"t-b", 1001, 1)]


def test_a_go_id_that_reads_as_an_nsqx_id_is_replaced_and_kept_in_a_header(
        tmp_path: Path) -> None:
    """Ids of messages from before February 2015 (top 16 bits below 1024) or not lowercase hex could
    be taken for nsqx ids: those messages get nsqx's id, Go's goes to the go_id header, and
    the import says so."""
    go = tmp_path / "go"
    go.mkdir()
    (go / "nsqd.dat").write_text(json.dumps({"topics": [{"name": "t", "paused": False,
                                                         "channels": []}]}))
    old, upper, new = b"%016x" % (0x3ff << 48 | 7), b"18AA034205269001", b"%016x" % GO_ID
    _write_go_queue(go, "t", [b"a", b"b", b"c"], ids=[old, upper, new])
    target = tmp_path / "nsqx"
    res = nsqx_import("--from-nsqd-data", go, "--data-path", target)
    assert res.returncode == 1
    assert "topic t: 2 message(s) got nsqx ids" in res.stderr, res.stderr
    with PartitionLog(target / "topics" / "t-t" / "p0") as log_:
        assert [bytes(log_.read_frame(o)[18:34]) for o in range(3)] == [
            b"%016x" % 0, b"%016x" % 1, new]
        assert [log_.headers(o) for o in range(3)] == [{"go_id": old}, {"go_id": upper}, None]
        assert log_.imported is not None and log_.imported.offsets_of(GO_ID) == [2]
