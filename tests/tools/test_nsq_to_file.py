"""nsq_to_file: every message exactly once across rotations, gzip, work dir -> output dir
without partial files, topic discovery through lookupd."""

from __future__ import annotations

import gzip
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.tools.helpers import channel_stats, create_topic, pub, wait_for


class DirWatcher:
    """Polls a directory; remembers each file's content when first seen, so the test can check
    that no file ever changed (or was partial) after it appeared there."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[str, bytes] = {}
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DirWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(0.005)

    def poll(self) -> None:
        if not self.path.exists():
            return
        for p in self.path.rglob("*"):
            if not p.is_file():
                continue
            key = str(p.relative_to(self.path))
            try:
                data = p.read_bytes()
            except FileNotFoundError:
                self.problems.append(f"{key} vanished from the output dir")
                continue
            if key not in self.seen:
                self.seen[key] = data
                if key.endswith(".gz"):
                    try:
                        gzip.decompress(data)
                    except Exception as e:  # noqa: BLE001
                        self.problems.append(f"{key} incomplete gzip when first seen: {e}")
                elif data and not data.endswith(b"\n"):
                    self.problems.append(f"{key} ends mid-line when first seen")
            elif self.seen[key] != data:
                self.problems.append(f"{key} changed after it appeared in the output dir")


def read_lines(directory: Path) -> list[bytes]:
    lines: list[bytes] = []
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name.endswith(".gz"):
                data = gzip.decompress(data)
            lines.extend(data.splitlines())
    return lines


def _bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i:05d}-{'x' * (i % 37)}".encode() for i in range(n)]


def test_rotate_size_work_dir_exactly_once(nsqd, tools, tmp_path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    create_topic(nsqd.http_address, "ntf_size")
    bodies = _bodies("s", 3000)
    with DirWatcher(out) as watcher:
        t = tools.start("nsq_to_file", [
            "--topic=ntf_size", f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--output-dir={out}", f"--work-dir={work}", "--rotate-size=20000",
            "--sync-interval=200ms", "--max-in-flight=50", "--stats-interval=200ms",
            "--filename-format=<TOPIC>.<HOST><REV>.<DATETIME>.log",
            "--host-identifier=h-<SHORT_HOST>"])
        for i in range(0, len(bodies), 300):  # publish while it runs
            pub(nsqd.http_address, "ntf_size", bodies[i:i + 300])
            time.sleep(0.05)
        wait_for(lambda: (channel_stats(nsqd.http_address, "ntf_size", "nsq_to_file") or {})
                 .get("depth", 1) == 0 and channel_stats(
                     nsqd.http_address, "ntf_size", "nsq_to_file")["in_flight_count"] == 0,
                 30, "all messages FINished")
        assert t.terminate() == 0, t.stderr
        watcher.poll()
    assert not watcher.problems, watcher.problems
    assert not list(work.rglob("*.log")), "a file stayed in the work dir"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) >= 3, files  # rotated by size
    assert all(f.startswith("ntf_size.h-") and "-0000" in f for f in files), files
    lines = read_lines(out)
    assert sorted(lines) == sorted(bodies)  # every message exactly once
    assert "msgs/s" in t.stderr


def test_gzip_rotate_interval(nsqd, tools, tmp_path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    create_topic(nsqd.http_address, "ntf_gz")
    bodies = _bodies("g", 600)
    with DirWatcher(out) as watcher:
        t = tools.start("nsq_to_file", [
            "-topic", "ntf_gz", "-nsqd-tcp-address", nsqd.tcp_address, "-output-dir", str(out),
            "-work-dir", str(work), "-gzip", "-gzip-level=9", "-rotate-interval=300ms",
            "-sync-interval=100ms", "-skip-empty-files"])
        for i in range(0, len(bodies), 100):
            pub(nsqd.http_address, "ntf_gz", bodies[i:i + 100])
            time.sleep(0.25)
        wait_for(lambda: (channel_stats(nsqd.http_address, "ntf_gz", "nsq_to_file") or {})
                 .get("depth", 1) == 0, 20, "all consumed")
        time.sleep(0.8)  # let a rotation close the last file
        assert t.terminate() == 0, t.stderr
        watcher.poll()
    assert not watcher.problems, watcher.problems
    files = [p for p in out.iterdir()]
    assert len(files) >= 2 and all(p.name.endswith(".log.gz") for p in files), files
    for p in files:
        assert gzip.decompress(p.read_bytes())  # a valid gzip stream, never empty
    assert sorted(read_lines(out)) == sorted(bodies)


def test_sigterm_finishes_written_and_requeues_rest(nsqd, tools, tmp_path) -> None:
    out = tmp_path / "out"
    create_topic(nsqd.http_address, "ntf_term", "nsq_to_file")
    bodies = _bodies("t", 5000)
    pub(nsqd.http_address, "ntf_term", bodies)
    t = tools.start("nsq_to_file", [
        "--topic=ntf_term", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={out}",
        "--sync-interval=10s", "--max-in-flight=100"])
    wait_for(lambda: out.exists() and any(p.stat().st_size for p in out.iterdir()), 15,
             "some output")
    assert t.terminate() == 0, t.stderr
    written = read_lines(out)
    assert len(set(written)) == len(written)
    c = channel_stats(nsqd.http_address, "ntf_term", "nsq_to_file")
    assert c is not None and c["in_flight_count"] == 0
    # what was written is FINished, everything else is still queued: nothing lost or doubled
    assert len(written) + c["depth"] + c["deferred_count"] == len(bodies)
    # a second run picks up the rest (append to the same file: no <REV> needed)
    t2 = tools.start("nsq_to_file", [
        "--topic=ntf_term", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={out}",
        "--sync-interval=200ms"])
    # subscribed first (the first run may have written everything already, and a SIGTERM
    # before the tool's handler is set ends it with -15), then nothing left to write
    wait_for(lambda: channel_stats(nsqd.http_address, "ntf_term", "nsq_to_file")["clients"],
             30, "the second run subscribed")
    wait_for(lambda: channel_stats(nsqd.http_address, "ntf_term", "nsq_to_file")["depth"] == 0
             and channel_stats(nsqd.http_address, "ntf_term", "nsq_to_file")[
                 "in_flight_count"] == 0, 30, "the rest written")
    assert t2.terminate() == 0, t2.stderr
    assert sorted(read_lines(out)) == sorted(bodies)


def test_topic_pattern_discovery(nsqd_factory, lookupd_factory, tools, tmp_path) -> None:
    ld = lookupd_factory.start()
    nsqd = nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1"])
    out = tmp_path / "out"
    create_topic(nsqd.http_address, "a_logs")
    create_topic(nsqd.http_address, "other")
    pub(nsqd.http_address, "a_logs", [b"a1", b"a2"])
    pub(nsqd.http_address, "other", [b"o1"])
    wait_for(lambda: ld.get_json("/lookup?topic=other")[0] == 200, 10, "registration")
    t = tools.start("nsq_to_file", [
        "--topic-pattern=_logs$", f"--lookupd-http-address={ld.http_address}",
        f"--output-dir={out}", "--topic-refresh=300ms", "--sync-interval=200ms",
        "--consumer-opt=lookupd_poll_interval,300ms"])
    wait_for(lambda: sorted(read_lines(out)) == [b"a1", b"a2"] if out.exists() else False,
             20, "a_logs written")
    # a topic created later is discovered at the next refresh
    create_topic(nsqd.http_address, "b_logs")
    pub(nsqd.http_address, "b_logs", [b"b1"])
    wait_for(lambda: b"b1" in read_lines(out), 20, "b_logs discovered")
    assert t.terminate() == 0, t.stderr
    names = [p.name for p in out.iterdir()]
    assert any(n.startswith("a_logs.") for n in names)
    assert any(n.startswith("b_logs.") for n in names)
    assert not any(n.startswith("other.") for n in names)
    assert channel_stats(nsqd.http_address, "other", "nsq_to_file") is None


def test_rev_bumped_when_output_file_exists(nsqd, tools, tmp_path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    create_topic(nsqd.http_address, "ntf_rev")
    fmt = "<TOPIC><REV>.log"
    (out / "ntf_rev-000000.log").write_bytes(b"old\n")
    pub(nsqd.http_address, "ntf_rev", [b"new1", b"new2"])
    t = tools.start("nsq_to_file", [
        "--topic=ntf_rev", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={out}",
        f"--work-dir={work}", f"--filename-format={fmt}", "--sync-interval=100ms"])
    wait_for(lambda: channel_stats(nsqd.http_address, "ntf_rev", "nsq_to_file") is not None
             and channel_stats(nsqd.http_address, "ntf_rev", "nsq_to_file")["depth"] == 0
             and channel_stats(nsqd.http_address, "ntf_rev", "nsq_to_file")[
                 "in_flight_count"] == 0, 15, "consumed")
    assert t.terminate() == 0, t.stderr
    assert (out / "ntf_rev-000000.log").read_bytes() == b"old\n"
    assert (out / "ntf_rev-000001.log").read_bytes() == b"new1\nnew2\n"
    assert os.listdir(work) == []


def test_sighup_rotates_and_skip_empty_files(nsqd, tools, tmp_path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    create_topic(nsqd.http_address, "ntf_hup")
    t = tools.start("nsq_to_file", [
        "--topic=ntf_hup", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={out}",
        f"--work-dir={work}", "--sync-interval=100ms", "--rotate-interval=200ms",
        "--skip-empty-files"])
    wait_for(lambda: channel_stats(nsqd.http_address, "ntf_hup", "nsq_to_file"), 15, "SUB")
    time.sleep(0.6)  # several rotation ticks with no message: no (empty) file anywhere
    assert not out.exists() or not list(out.iterdir())
    assert not work.exists() or not list(work.iterdir())
    pub(nsqd.http_address, "ntf_hup", [b"h1"])
    wait_for(lambda: out.exists() and read_lines(out) == [b"h1"], 10, "h1 moved to output")
    t.proc.send_signal(signal.SIGHUP)
    pub(nsqd.http_address, "ntf_hup", [b"h2"])
    wait_for(lambda: sorted(read_lines(out)) == [b"h1", b"h2"], 10, "h2 moved to output")
    assert t.terminate() == 0, t.stderr
    files = list(out.iterdir())
    assert len(files) == 2 and all(p.stat().st_size == 3 for p in files)


@pytest.mark.slow
def test_repeated_sigterm_mid_stream_exactly_once(nsqd, tools, tmp_path) -> None:
    """Stopped several times while busy: across runs every message is in exactly one
    complete file (written+synced ones FINished, the rest requeued)."""
    out, work = tmp_path / "out", tmp_path / "work"
    create_topic(nsqd.http_address, "ntf_busy", "nsq_to_file")
    bodies = [f"b{i:06d}".encode() for i in range(100_000)]
    pub(nsqd.http_address, "ntf_busy", bodies)
    args = ["--topic=ntf_busy", f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--output-dir={out}", f"--work-dir={work}", "--gzip", "--rotate-size=200000",
            "--sync-interval=1s", "--max-in-flight=500"]

    def chan() -> dict:
        return channel_stats(nsqd.http_address, "ntf_busy", "nsq_to_file") or {}

    with DirWatcher(out) as watcher:
        for _ in range(3):
            t = tools.start("nsq_to_file", args)
            wait_for(lambda: chan().get("client_count") == 1, 15, "subscribed")
            time.sleep(0.3)
            assert t.terminate() == 0, t.stderr
            assert chan()["in_flight_count"] == 0
        t = tools.start("nsq_to_file", args)
        wait_for(lambda: chan().get("depth") == 0 and chan().get("in_flight_count") == 0
                 and chan().get("client_count") == 1, 60, "all written")
        assert t.terminate() == 0, t.stderr
        watcher.poll()
    assert not watcher.problems, watcher.problems[:5]
    lines = read_lines(out)
    assert len(lines) == len(bodies) and sorted(lines) == bodies
