"""Every listener of a cluster answers a malformed request the same way (issue 31): an
over-long request line or header is ``431`` with one WARNING line, never aiohttp's
traceback, and no answer carries a ``Server`` header. The cluster listener was the one
that logged ``Error handling request`` with a ``LineTooLong`` traceback and named aiohttp.
A real one-node cluster (etcd, nsqlookupd, nsqd with a secret); raw sockets."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable

from nsqx.cluster.etcd_server import EtcdServer
from tests.support.cluster import Cluster


def _exchange(address: str, data: bytes) -> bytes:
    """Send ``data``; the answer until the server closes or its body is whole."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
        return out


def _wait_log(log: Callable[[], bytes], before: int) -> bytes:
    deadline = time.monotonic() + 10
    while b"bad request from" not in (new := log()[before:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return new


OVERSIZED = {
    "long-line": b"GET /nsqx/cluster/state?x=" + b"u" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "long-header": b"GET /nsqx/cluster/state HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000
                   + b"\r\n\r\n",
}


def test_every_listener_answers_431_quietly_and_names_no_server(
        etcd_server: EtcdServer, nsqd_factory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(etcd_server, nsqd_factory, lookupd_factory).start(nodes=1)
    node, lookupd = cluster.nodes[0], cluster.lookupd
    listeners = {  # name: (address, a good GET there, that process's log)
        "nsqd-http": (node.http_address, b"/ping", node.log_bytes),
        "nsqd-cluster": (cluster.state(node)["cluster_address"], b"/nsqx/cluster/state",
                         node.log_bytes),
        "lookupd-http": (lookupd.http_address, b"/ping", lookupd.log_bytes),
    }
    for name, (address, good, log) in listeners.items():
        for case, data in OVERSIZED.items():
            before = len(log())
            answer = _exchange(address, data)
            head = answer.partition(b"\r\n\r\n")[0]
            assert re.match(rb"HTTP/1\.[01] 431 ", head), (name, case, answer[:200])
            assert b"\r\nserver:" not in head.lower(), (name, case, head)
            new = _wait_log(log, before)
            assert b"Traceback" not in new and b"ERROR" not in new, (name, case, new[-3000:])
            assert len(re.findall(rb"WARNING.*bad request from 127\.0\.0\.1", new)) == 1, \
                (name, case, new[-3000:])
        answer = _exchange(address, b"GET " + good + b" HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")
        head = answer.partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 200"), (name, answer[:200])
        assert b"\r\nserver:" not in head.lower(), (name, head)

