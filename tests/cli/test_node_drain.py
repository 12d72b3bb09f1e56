"""``nsqx node drain`` says when a drained node's partitions have nowhere to go (issue 30,
item 8). The lookupd is a stand-in answering the two calls the command makes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from nsqx.cli.nsqx_cmd import main

A, B, C, D = (f"127.0.0.1:{p}:{p + 1}" for p in (4250, 4350, 4450, 4550))


def stats(nodes: list[str], replicas: list[str]) -> dict[str, Any]:
    """/cluster/stats of a cluster with topic orders, one partition on ``replicas``."""
    return {"cluster_id": "nsqx", "coordinator": nodes[0], "draining": [A],
            "nodes": [{"id": n, "tcp_address": "", "http_address": ""} for n in nodes],
            "moves": [], "topics": {"orders": {"partition_num": 1, "replica": len(replicas),
                                               "ordered": False, "min_isr": 1, "partitions": [
                {"partition": 0, "leader": replicas[0], "epoch": 1, "replicas": replicas,
                 "isr": replicas, "catchup": []}]}}}


@pytest.fixture
def lookupd() -> Iterator[tuple[str, dict[str, Any]]]:
    answer: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, doc: Any) -> None:
            raw = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:  # /cluster/node/remove
            self._send({"node": A, "draining": True})

        def do_GET(self) -> None:  # /cluster/stats
            self._send(answer["stats"])

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", answer
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_drain_with_nowhere_to_move_says_so(lookupd: tuple[str, dict[str, Any]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    address, answer = lookupd
    answer["stats"] = stats([A, B, C], [A, B, C])  # 3 nodes, 3 replicas: no spare node
    assert main(["node", "drain", A, "--lookupd-http-address", address]) == 0
    out = capsys.readouterr().out
    assert "nowhere to move orders/0" in out and "its partitions move to" not in out
    assert f"nsqx node drain {A} --undo" in out


def test_drain_with_a_spare_node_says_they_move(lookupd: tuple[str, dict[str, Any]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    address, answer = lookupd
    answer["stats"] = stats([A, B, C, D], [A, B, C])  # D can take A's replica
    assert main(["node", "drain", A, "--lookupd-http-address", address]) == 0
    assert capsys.readouterr().out == f"{A}: draining: its partitions move to other nodes\n"
