"""Raw-socket NSQ load generators that are cheap enough not to be the bottleneck.

Writers send one pre-encoded command over and over (per-batch work only);
readers cut frames with a small loop and answer a whole read's worth of FINs
with one join. Each runs in its own process so several can load one server.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass, field

import orjson

from nsqx.protocol import v2

_HDR = struct.Struct(">II")


@dataclass
class Result:
    role: str
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    latencies_us: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def _connect(addr: str, identify: dict | None = None) -> socket.socket:
    host, _, port = addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(v2.MAGIC_V2 + v2.identify(identify or {"feature_negotiation": False,
                                                   "user_agent": "nsqx-bench"}))
    _read_frames_until(s, 1, bytearray())
    return s


def _read_frames_until(s: socket.socket, n: int, buf: bytearray) -> list[tuple[int, bytes]]:
    """Read exactly n frames (used on control paths only)."""
    out: list[tuple[int, bytes]] = []
    while len(out) < n:
        while len(buf) >= 8:
            size, ftype = _HDR.unpack_from(buf)
            if len(buf) < 4 + size:
                break
            data = bytes(buf[8 : 4 + size])
            del buf[: 4 + size]
            if ftype == 0 and data == b"_heartbeat_":
                s.sendall(b"NOP\n")
                continue
            if ftype == 1:
                raise RuntimeError(data.decode("latin-1"))
            out.append((ftype, data))
            if len(out) == n:
                return out
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return out


def body_of(size: int, i: int = 0) -> bytes:
    seed = (b"%08d" % i) * (size // 8 + 1)
    return seed[:size]


def run_writer(addr: str, topic: str, size: int, batch: int, seconds: float,
               mixed: tuple[int, int] | None = None, window: int = 8) -> Result:
    """MPUB the same pre-encoded batch for `seconds`, `window` commands in flight."""
    if mixed:
        lo, hi = mixed
        step = max(1, (hi - lo) // max(batch - 1, 1))
        bodies = [body_of(lo + (i * step) % (hi - lo + 1), i) for i in range(batch)]
    else:
        bodies = [body_of(size, i) for i in range(batch)]
    cmd = v2.mpub(topic, bodies) if batch > 1 else v2.pub(topic, bodies[0])
    nbytes = sum(map(len, bodies))
    s = _connect(addr)
    res = Result("writer")
    buf = bytearray()
    outstanding = 0
    sent = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    ok_frame = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    while True:
        now = time.perf_counter()
        if now < deadline:
            while outstanding < window:
                s.sendall(cmd)
                outstanding += 1
                sent += 1
        elif outstanding == 0:
            break
        chunk = s.recv(1 << 16)
        if not chunk:
            res.errors.append("server closed the connection")
            break
        buf += chunk
        # Fast path: a run of OK frames; anything else goes through the frame reader.
        n_ok = buf.count(ok_frame)
        if n_ok * 10 == len(buf):
            outstanding -= n_ok
            res.messages += n_ok * batch
            buf.clear()
            continue
        while len(buf) >= 8:
            fsize, ftype = _HDR.unpack_from(buf)
            if len(buf) < 4 + fsize:
                break
            data = bytes(buf[8 : 4 + fsize])
            del buf[: 4 + fsize]
            if ftype == 0 and data == b"_heartbeat_":
                s.sendall(b"NOP\n")
            elif ftype == 0:
                outstanding -= 1
                res.messages += batch
            else:
                res.errors.append(data.decode("latin-1"))
                outstanding -= 1
    res.seconds = time.perf_counter() - t0
    res.bytes = res.messages // batch * nbytes
    s.close()
    return res


def run_pub_latency(addr: str, topic: str, size: int, seconds: float) -> Result:
    """PUB one message at a time, waiting for each OK (publish latency)."""
    cmd = v2.pub(topic, body_of(size))
    s = _connect(addr)
    res = Result("pub")
    buf = bytearray()
    lat = res.latencies_us
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        a = time.perf_counter()
        if a >= deadline:
            break
        s.sendall(cmd)
        _read_frames_until(s, 1, buf)
        lat.append((time.perf_counter() - a) * 1e6)
    res.messages = len(lat)
    res.seconds = time.perf_counter() - t0
    res.bytes = res.messages * size
    s.close()
    return res


def run_reader(addr: str, topic: str, channel: str, expect: int, seconds: float,
               rdy: int = 2500) -> Result:
    """SUB, RDY, FIN every message; stops after `expect` messages or `seconds` idle-capped."""
    s = _connect(addr, {"feature_negotiation": False, "user_agent": "nsqx-bench",
                        "output_buffer_timeout": 25})
    buf = bytearray()
    s.sendall(v2.sub(topic, channel))
    _read_frames_until(s, 1, buf)
    s.sendall(v2.rdy(rdy))
    res = Result("reader")
    unpack = _HDR.unpack_from
    t0 = time.perf_counter()
    deadline = t0 + seconds
    s.settimeout(1.0)
    total = 0
    nbytes = 0
    while total < expect and time.perf_counter() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            res.errors.append("server closed the connection")
            break
        buf += chunk
        pos = 0
        n = len(buf)
        fins = []
        mv = memoryview(buf)
        while n - pos >= 8:
            fsize, ftype = unpack(mv, pos)
            end = pos + 4 + fsize
            if end > n:
                break
            if ftype == 2:
                fins.append(mv[pos + 18 : pos + 34])
                nbytes += fsize - 30
            elif ftype == 0 and mv[pos + 8 : end] == b"_heartbeat_":
                s.sendall(b"NOP\n")
            elif ftype == 1:
                res.errors.append(bytes(mv[pos + 8 : end]).decode("latin-1"))
            pos = end
        if fins:
            total += len(fins)
            s.sendall(b"FIN " + b"\nFIN ".join(fins) + b"\n")
        del fins
        mv.release()
        del buf[:pos]
    res.seconds = time.perf_counter() - t0
    res.messages = total
    res.bytes = nbytes
    s.close()
    return res


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds and peak RSS of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    peak = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"cpu_s": cpu, "peak_rss": peak, "rss": rss}


def encode_result(res: Result) -> bytes:
    return orjson.dumps({"role": res.role, "messages": res.messages, "bytes": res.bytes,
                         "seconds": res.seconds, "latencies_us": res.latencies_us,
                         "errors": res.errors[:10]})
