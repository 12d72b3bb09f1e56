"""What message tracing costs nsqd: server CPU per message with the topic traced vs not.

    .venv/bin/python bench/tracing.py [--messages 200000] [--rounds 2] [--size 100]

Each run is a fresh nsqd process: MPUB ``--messages`` bodies of ``--size`` bytes in batches
of ``--batch`` (pipelined, ``--depth`` batches in flight), then one consumer (RDY 500) drains
them, FINning every message (FINs sent in one write per read). The nsqd's CPU time
(utime + stime from /proc/<pid>/stat) over ingest + drain, divided by the message count,
is its CPU per message. Runs alternate off / on ``--rounds`` times; the best of each is
compared (less noise from the other processes on the machine). With tracing on, every
message must be covered by a pub, a deliver and a fin event in ``__trace`` (an event covers
``count`` consecutive offsets): the script reads ``__trace`` back and checks. Issue 12's target: tracing on adds <= 20% CPU per message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

from nsqx.protocol import v2  # noqa: E402
from nsqx.protocol.frames import FRAME_MESSAGE, FrameReader  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def http(addr: str, method: str, path: str) -> bytes:
    req = urllib.request.Request(f"http://{addr}{path}", data=b"" if method == "POST" else None,
                                 method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def trace_coverage(host: str, port: int) -> dict[str, int]:
    """Read all of __trace: per event kind, how many messages its events cover, plus the
    number of events (``"events"``)."""
    out: dict[str, int] = {"events": 0}
    with socket.create_connection((host, port)) as s:
        s.sendall(v2.MAGIC_V2 + v2.sub("__trace", "bench") + v2.rdy(2000))
        s.settimeout(1.0)
        reader = FrameReader()
        while True:
            try:
                data = s.recv(1 << 18)
            except TimeoutError:
                return out
            fins = []
            for ftype, frame in reader.feed(data):
                if ftype == FRAME_MESSAGE:
                    ev = json.loads(bytes(frame[26:]))
                    out[ev["event"]] = out.get(ev["event"], 0) + ev.get("count", 1)
                    out["events"] += 1
                    fins.append(b"FIN " + bytes(frame[10:26]) + b"\n")
            if fins:
                s.sendall(b"".join(fins))


def run(messages: int, size: int, batch: int, depth: int, traced: bool
        ) -> tuple[float, float, dict[str, int]]:
    """(server CPU s, wall s, trace coverage) of one ingest + drain on a fresh nsqd."""
    data = tempfile.mkdtemp(prefix="bench-tracing-")
    tcp, web = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "nsqx.cli.nsqd", f"--tcp-address={tcp}",
                             f"--http-address={web}", f"--data-path={data}", "--log-level=warn"],
                            stdin=subprocess.DEVNULL, env=env)
    try:
        for _ in range(200):
            try:
                http(web, "GET", "/ping")
                break
            except OSError:
                time.sleep(0.1)
        http(web, "POST", "/topic/create?topic=bench")
        http(web, "POST", "/channel/create?topic=bench&channel=c")
        if traced:
            http(web, "POST", "/topic/trace?topic=bench&enable=true")
        body = b"x" * size
        cmd = v2.mpub("bench", [body] * batch)
        host, port = tcp.split(":")
        t0, c0 = time.perf_counter(), cpu_seconds(proc.pid)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(v2.MAGIC_V2)
            reader = FrameReader()
            sent = acked = 0
            total = messages // batch
            while acked < total:
                while sent < total and sent - acked < depth:
                    s.sendall(cmd)
                    sent += 1
                for _ftype, _data in reader.feed(s.recv(65536)):
                    acked += 1
            s.sendall(v2.identify({"feature_negotiation": False}) + v2.sub("bench", "c") + v2.rdy(500))
            got = 0
            want = total * batch
            reader = FrameReader()
            while got < want:
                fins = []
                for ftype, data_ in reader.feed(s.recv(1 << 18)):
                    if ftype == FRAME_MESSAGE:
                        fins.append(b"FIN " + bytes(data_[10:26]) + b"\n")
                if fins:
                    got += len(fins)
                    s.sendall(b"".join(fins))
            time.sleep(0.2)  # the last FINs (and their trace events) are processed
        cpu, wall = cpu_seconds(proc.pid) - c0, time.perf_counter() - t0
        events: dict[str, int] = {}
        if traced:
            events = trace_coverage(host, int(port))
        return cpu, wall, events
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    n = a.messages // a.batch * a.batch
    best: dict[bool, float] = {}
    for r in range(a.rounds):
        for traced in (False, True):
            cpu, wall, events = run(n, a.size, a.batch, a.depth, traced)
            per = cpu / n * 1e6
            best[traced] = min(best.get(traced, per), per)
            extra = ""
            if traced:
                extra = (f", {events['events']} trace events covering pub {events.get('pub', 0)}"
                         f" / deliver {events.get('deliver', 0)} / fin {events.get('fin', 0)}")
            print(f"round {r + 1} tracing {'on ' if traced else 'off'}: {n} msgs, "
                  f"{n / wall:,.0f} msgs/s end to end, server CPU {per:.2f} us/msg{extra}",
                  flush=True)
            if traced and any(events.get(k) != n for k in ("pub", "deliver", "fin")):
                print(f"  WARNING: some messages have no pub/deliver/fin event: {events}")
    ratio = best[True] / best[False]
    print(f"best: off {best[False]:.2f} us/msg, on {best[True]:.2f} us/msg: "
          f"ratio {ratio:.2f}x (+{(ratio - 1) * 100:.0f}% CPU per message; target <= +20%)")


if __name__ == "__main__":
    main()
