"""The floor: a uvloop server that speaks just enough NSQ to answer PUB and HTTP /pub.

    .venv/bin/python bench/floor_server.py --tcp-address=127.0.0.1:P --http-address=127.0.0.1:Q

It stores nothing and checks nothing: each TCP PUB/MPUB gets an OK frame (IDENTIFY gets
OK too), each HTTP request gets ``200 OK``. Measured side by side with nsqd
(`nsqd_compare.py --floor`), it shows what one Python event loop costs per request
before any broker work, i.e. how close to Go nsqd any single-loop Python server can get
on the latency-bound scenarios (one PUB at a time, HTTP /pub keep-alive).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct

_OK = struct.pack(">ii", 6, 0) + b"OK"
_HTTP_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nOK"
_U32 = struct.Struct(">I")


class TcpFloor(asyncio.Protocol):
    """V2 framing only: skip the magic, answer every command that carries a body."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""
        self.magic = False

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, out = 0, 0
        if not self.magic:
            if len(buf) < 4:
                self.buf = buf
                return
            pos, self.magic = 4, True
        n = len(buf)
        while pos < n:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            verb = buf[pos:pos + 4]
            if verb in (b"PUB ", b"MPUB", b"IDEN", b"DPUB"):
                if nl + 5 > n:
                    break
                end = nl + 5 + _U32.unpack_from(buf, nl + 1)[0]
                if end > n:
                    break
                pos = end
                out += 1
            else:  # NOP, RDY, ... answer nothing
                pos = nl + 1
        self.buf = buf[pos:]
        if out:
            self.t.write(_OK * out)


class HttpFloor(asyncio.Protocol):
    """HTTP/1.1 keep-alive: every request (head + Content-Length body) gets 200 OK."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, out = 0, 0
        while True:
            h = buf.find(b"\r\n\r\n", pos)
            if h < 0:
                break
            i = buf.lower().find(b"\ncontent-length:", pos, h)
            length = int(buf[i + 16:buf.index(b"\r", i + 16)]) if i >= 0 else 0
            if h + 4 + length > len(buf):
                break
            pos = h + 4 + length
            out += 1
        self.buf = buf[pos:]
        if out:
            self.t.write(_HTTP_OK * out)


async def serve(tcp: str, http: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    th, _, tp = tcp.rpartition(":")
    hh, _, hp = http.rpartition(":")
    s1 = await loop.create_server(TcpFloor, th, int(tp))
    s2 = await loop.create_server(HttpFloor, hh, int(hp))
    await stop.wait()
    s1.close()
    s2.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tcp-address", required=True)
    ap.add_argument("--http-address", required=True)
    ap.add_argument("--data-path", help="ignored (nsqd_compare passes it)")
    args, _ = ap.parse_known_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.tcp_address, args.http_address))


if __name__ == "__main__":
    main()
