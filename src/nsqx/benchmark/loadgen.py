"""Raw-socket NSQ load generators that are cheap enough not to be the bottleneck.

Writers send one pre-encoded command over and over (per-batch work only);
readers cut frames with a small loop and answer a whole read's worth of FINs
with one join. Each runs in its own process so several can load one server.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
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


def _connect(addr: str, identify: dict | None = None, tls: bool = False) -> socket.socket:
    """Connect and IDENTIFY; with `tls`, upgrade the socket as NSQ's tls_v1 does.

    The TLS upgrade: IDENTIFY {"tls_v1": true, "feature_negotiation": true}, read
    the JSON response in clear, then handshake (client side, no verification:
    the bench servers use throwaway self-signed certs) and read the OK frame
    over TLS.
    """
    host, _, port = addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ident = dict(identify or {"feature_negotiation": False, "user_agent": "nsqx-bench"})
    if tls:
        ident.update(tls_v1=True, feature_negotiation=True)
    s.sendall(v2.MAGIC_V2 + v2.identify(ident))
    buf = bytearray()
    _read_frames_until(s, 1, buf)
    if tls:
        if buf:
            raise RuntimeError("unexpected data before the TLS handshake")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s, server_hostname=host)
        _read_frames_until(s, 1, buf)
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
               mixed: tuple[int, int] | None = None, window: int = 8, tls: bool = False,
               topics: list[str] | None = None, per_send: int = 1) -> Result:
    """MPUB the same pre-encoded batch for `seconds`, `window` sends in flight.

    With `topics`, round-robin over them: the commands for `per_send`
    consecutive topics are pre-joined into one send, so the loop's work stays
    per send (one sendall, one OK count), not per topic or per message.
    """
    if mixed:
        lo, hi = mixed
        step = max(1, (hi - lo) // max(batch - 1, 1))
        bodies = [body_of(lo + (i * step) % (hi - lo + 1), i) for i in range(batch)]
    else:
        bodies = [body_of(size, i) for i in range(batch)]
    nbytes = sum(map(len, bodies))
    if topics:
        mpub_body = v2.mpub_body(bodies)
        cmds = [b"MPUB " + t.encode() + b"\n" + struct.pack(">I", len(mpub_body)) + mpub_body
                for t in topics]
        per_send = max(1, min(per_send, len(cmds)))
        payloads = [b"".join(cmds[i : i + per_send]) for i in range(0, len(cmds), per_send)]
        # a short tail payload would break the fixed "OKs per send" count: pad it
        # by wrapping around the topic list
        if len(cmds) % per_send:
            tail = cmds[-(len(cmds) % per_send):] + cmds[: per_send - len(cmds) % per_send]
            payloads[-1] = b"".join(tail)
    else:
        per_send = 1
        payloads = [v2.mpub(topic, bodies) if batch > 1 else v2.pub(topic, bodies[0])]
    npay = len(payloads)
    s = _connect(addr, tls=tls)
    res = Result("writer")
    buf = bytearray()
    outstanding = 0  # commands (OKs) still expected
    limit = window * per_send
    k = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    ok_frame = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    while True:
        now = time.perf_counter()
        if now < deadline:
            while outstanding < limit:
                s.sendall(payloads[k])
                k = k + 1 if k + 1 < npay else 0
                outstanding += per_send
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
               rdy: int = 2500, tls: bool = False) -> Result:
    """SUB, RDY, FIN every message; stops after `expect` messages or `seconds` idle-capped."""
    s = _connect(addr, {"feature_negotiation": False, "user_agent": "nsqx-bench",
                        "output_buffer_timeout": 25}, tls=tls)
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
    # Over TLS one recv returns at most one record (16 KiB): gather every record
    # already readable into one chunk so parsing and the FIN reply stay per
    # big read, as on a plain socket.
    poll = None
    if tls:
        poll = select.poll()
        poll.register(s.fileno(), select.POLLIN)
    while total < expect and time.perf_counter() < deadline:
        try:
            chunk = s.recv(1 << 20)
            if poll is not None and chunk:
                parts = [chunk]
                got = len(chunk)
                while got < (1 << 18) and (s.pending() or poll.poll(0)):
                    try:
                        more = s.recv(1 << 20)
                    except TimeoutError:
                        break
                    if not more:
                        break
                    parts.append(more)
                    got += len(more)
                chunk = b"".join(parts)
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


def run_http_pub(http_addr: str, topic: str, size: int, seconds: float) -> Result:
    """POST /pub one message per request over one keep-alive connection."""
    host, _, port = http_addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = body_of(size)
    path = f"/pub?topic={topic}"
    headers = {"Content-Type": "application/octet-stream"}
    res = Result("http_pub")
    lat = res.latencies_us
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    a = t0
    while a < deadline:
        # bytes body: http.client sends headers and body in one send()
        conn.request("POST", path, body, headers)
        r = conn.getresponse()
        data = r.read()
        b = time.perf_counter()
        if r.status == 200:
            n += 1
            lat.append((b - a) * 1e6)
        else:
            res.errors.append(f"{r.status} {data[:100]!r}")
            if len(res.errors) > 100:
                break
        a = b
    res.seconds = time.perf_counter() - t0
    res.messages = n
    res.bytes = n * size
    conn.close()
    return res


def run_http_pub_raw(http_addr: str, topic: str, size: int, seconds: float) -> Result:
    """Like run_http_pub, but one pre-encoded HTTP/1.1 request on a raw keep-alive socket.

    http.client costs about 170 us of client CPU per request here, which on a
    2-core machine caps the load; this sender costs a few us, so the rate it
    reaches is the server's. Still one request in flight per connection.
    """
    host, _, port = http_addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = body_of(size)
    req = (f"POST /pub?topic={topic} HTTP/1.1\r\nHost: {http_addr}\r\n"
           f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
           ).encode() + body
    res = Result("http_pub_raw")
    lat = res.latencies_us
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    a = t0
    buf = b""
    while a < deadline:
        s.sendall(req)
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                res.errors.append("server closed the connection")
                break
            buf += chunk
            h = buf.find(b"\r\n\r\n")
            if h < 0:
                continue
            i = buf.lower().find(b"\ncontent-length:", 0, h)
            if i < 0:
                res.errors.append("response without Content-Length")
                break
            need = h + 4 + int(buf[i + 16 : buf.index(b"\r", i + 16)])
            if len(buf) >= need:
                break
        if res.errors:
            break
        b = time.perf_counter()
        if buf[9:12] == b"200":
            n += 1
            lat.append((b - a) * 1e6)
        else:
            res.errors.append(buf[:200].decode("latin-1"))
            break
        buf = buf[need:]
        a = b
    res.seconds = time.perf_counter() - t0
    res.messages = n
    res.bytes = n * size
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
