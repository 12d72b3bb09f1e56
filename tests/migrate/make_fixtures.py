"""Make the Go nsqd data directory that tests/migrate/test_import.py imports (not run by CI).

    python tests/migrate/make_fixtures.py --go-nsqd /path/to/nsqd   # Go nsqd v1.3.0

Build Go nsqd as bench/README.md says (Debian's golang-go, nsqio/nsq v1.3.0 and its modules
checked out next to it, ``GOPROXY=off GOFLAGS=-mod=mod GOSUMDB=off go build ./apps/nsqd``).

What it does, with ``--mem-queue-size=0`` (every message goes through go-diskqueue) and
``--max-bytes-per-file=1024`` (a queue spans several files, half-read ones included):

* topic ``orders``: channels ``billing``, ``shipping`` and ``audit`` (paused); 12 messages by
  /mpub and /pub, one /pub?defer=60000; a raw consumer on ``billing`` receives 6, FINs 4
  and leaves 2 in flight (Go writes them back to the channel's queue at shutdown, with
  their attempts);
* topic ``events``, paused, channels ``a`` and ``b``: 4 messages stay in the topic's own
  queue (a paused topic does not pump), the backlog every channel gets;
* topic ``lonely``, no channel: 3 messages in the topic's queue;
* SIGTERM (Go flushes memory, in-flight and deferred messages to disk).

The truth the test compares with is what Go itself delivers from that directory: a copy is
started again, every channel and topic unpaused and drained by a raw client, and each
channel's messages (id, timestamp, attempts, body) are written to ``expected.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from nsqx.protocol import v2  # noqa: E402
from tests.support.rawclient import RawClient, consumer  # noqa: E402

OUT = Path(__file__).resolve().parent / "fixtures" / "go-1.3.0"
CHANNELS = {"orders": ["billing", "shipping", "audit"], "events": ["a", "b"], "lonely": []}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GoNsqd:
    def __init__(self, binary: str, data: Path) -> None:
        self.tcp, self.http = free_port(), free_port()
        self.proc = subprocess.Popen(
            [binary, f"--data-path={data}", f"--tcp-address=127.0.0.1:{self.tcp}",
             f"--http-address=127.0.0.1:{self.http}", "--mem-queue-size=0",
             "--max-bytes-per-file=1024", "--sync-every=1"],
            stdout=subprocess.DEVNULL, stderr=open(data / "go-nsqd.log", "ab"))  # noqa: SIM115
        for _ in range(100):
            try:
                self.post("/ping")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("Go nsqd did not start")

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp}"

    def post(self, path: str, body: bytes = b"") -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", data=body,
                                     method="POST" if body or path != "/ping" else "GET")
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(10) != 0:
            raise RuntimeError(f"Go nsqd exited with {self.proc.returncode}")


def produce(binary: str, data: Path) -> None:
    go = GoNsqd(binary, data)
    try:
        for topic, chans in CHANNELS.items():
            go.post(f"/topic/create?topic={topic}")
            for ch in chans:
                go.post(f"/channel/create?topic={topic}&channel={ch}")
        go.post("/channel/pause?topic=orders&channel=audit")
        go.post("/topic/pause?topic=events")
        go.post("/mpub?topic=orders", b"\n".join(b"order-%02d " % i + b"x" * 40 for i in range(10)))
        go.post("/pub?topic=orders", b"order-10 binary \x00\xff\n body")
        go.post("/pub?topic=orders", b"order-11")
        go.post("/pub?topic=orders&defer=60000", b"order-deferred")
        for i in range(4):
            go.post("/pub?topic=events", b"event-%d" % i)
        go.post("/mpub?topic=lonely", b"lonely-0\nlonely-1\nlonely-2")
        time.sleep(0.5)  # let the topic pumps copy into the channels' queues
        c = consumer(go.tcp_address, "orders", "billing", rdy=6)
        got = c.read_messages(6)
        for m in got[:4]:
            c.send(v2.fin(m.id))
        time.sleep(0.3)  # the FINs are processed; two stay in flight until shutdown
        go.stop()
        c.close()
    finally:
        if go.proc.poll() is None:
            go.proc.kill()


def drain(binary: str, data: Path) -> dict:
    """What Go itself delivers from ``data``, per topic and channel."""
    go = GoNsqd(binary, data)
    out: dict[str, dict[str, list]] = {}
    try:
        for topic, chans in CHANNELS.items():
            go.post(f"/topic/unpause?topic={topic}")
            for ch in chans:
                go.post(f"/channel/unpause?topic={topic}&channel={ch}")
            for ch in chans or ["first"]:
                with RawClient(go.tcp_address) as c:
                    c.subscribe(topic, ch, rdy=100)
                    msgs = c.drain_messages(quiet=1.0)
                out.setdefault(topic, {})[ch] = [
                    {"id": m.id.decode(), "timestamp": m.timestamp_ns, "attempts": m.attempts,
                     "body": m.body.hex()} for m in msgs]
        go.stop()
    finally:
        if go.proc.poll() is None:
            go.proc.kill()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--go-nsqd", required=True, help="path of a Go nsqd v1.3.0 binary")
    args = ap.parse_args()
    version = subprocess.run([args.go_nsqd, "--version"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        produce(args.go_nsqd, data)
        (data / "go-nsqd.log").unlink()
        copy = Path(tmp) / "copy"
        shutil.copytree(data, copy)
        expected = drain(args.go_nsqd, copy)
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        shutil.copytree(data, OUT / "data")
    (OUT / "expected.json").write_text(json.dumps(
        {"go_nsqd": version.strip(), "channels": expected}, indent=1) + "\n")
    for f in sorted((OUT / "data").iterdir()):
        print(f"{f.stat().st_size:6d}  {f.name}")
    print(json.dumps({t: {c: len(m) for c, m in cs.items()} for t, cs in expected.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
