"""A raw-socket nsqd-side peer for nsqlookupd: every byte under the test's control."""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from nsqx.protocol import lookup_v1 as lk


def ident(port: int = 4150, **over: Any) -> dict[str, Any]:
    info = {"version": "1.3.0", "tcp_port": port, "http_port": port + 1, "hostname": "h1",
            "broadcast_address": "127.0.0.1", "topology_zone": "", "topology_region": ""}
    info.update(over)
    return info


class Closed(AssertionError):
    pass


class RawPeer:
    def __init__(self, address: str, *, magic: bytes | None = lk.MAGIC_V1,
                 timeout: float = 5.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.timeout = timeout
        self.reader = lk.ResponseReader()
        self.pending: list[bytes] = []
        if magic:
            self.sock.sendall(magic)

    @property
    def local_address(self) -> str:
        h, p = self.sock.getsockname()[:2]
        return f"{h}:{p}"

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout: float | None = None) -> bytes:
        """The next response payload; Closed if the server closed first."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.pending:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise AssertionError("no response in time") from None
            if not data:
                raise Closed("connection closed by nsqlookupd")
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def call(self, data: bytes) -> bytes:
        self.send(data)
        return self.read()

    def identify(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = self.call(lk.identify(info or ident()))
        return json.loads(resp)

    def expect_closed(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return
            except TimeoutError:
                raise AssertionError("connection still open") from None
            if not data:
                return
            self.pending += self.reader.feed(data)

    def expect_error(self, payload: bytes) -> None:
        """An error response with exactly ``payload``, then the connection closes."""
        got = self.read()
        assert got == payload, got
        self.expect_closed()


def body_size(n: int) -> bytes:
    return struct.pack(">i", n)
