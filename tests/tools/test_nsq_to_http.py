"""nsq_to_http against local HTTP servers (stdlib http.server in a thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.tools.helpers import channel_stats, create_topic, pub, wait_for


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.fail_first: set[bytes] = set()  # bodies answered 500 on their first attempt
        self.attempts: dict[bytes, int] = {}

    def ok_bodies(self) -> list[bytes]:
        with self.lock:
            return [r["body"] for r in self.requests if r["status"] == 200]


def _server(rec: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _answer(self, body: bytes) -> None:
            with rec.lock:
                n = rec.attempts[body] = rec.attempts.get(body, 0) + 1
                status = 500 if body in rec.fail_first and n == 1 else 200
                rec.requests.append({"method": self.command, "path": self.path, "body": body,
                                     "headers": dict(self.headers), "status": status})
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def do_GET(self) -> None:
            q = parse_qs(urlsplit(self.path).query)
            self._answer(q.get("m", [""])[0].encode())

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            self._answer(self.rfile.read(n))

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def servers() -> Iterator[list[tuple[str, Recorder]]]:
    made = []
    for _ in range(2):
        rec = Recorder()
        srv = _server(rec)
        made.append((srv, rec))
    try:
        yield [(f"127.0.0.1:{s.server_address[1]}", r) for s, r in made]
    finally:
        for s, _ in made:
            s.shutdown()
            s.server_close()


def test_get_with_substitution(nsqd, tools, servers) -> None:
    addr, rec = servers[0]
    create_topic(nsqd.http_address, "nth_get")
    bodies = [b"hello world", b"a&b=c", "caf\u00e9".encode(), b"plain"]
    pub(nsqd.http_address, "nth_get", bodies)
    t = tools.start("nsq_to_http", ["--topic=nth_get", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                    f"--get=http://{addr}/get?m=%s", "--header=X-Test: yes"])
    wait_for(lambda: len(rec.ok_bodies()) == 4, 15, "4 GETs")
    assert t.terminate() == 0, t.stderr
    assert sorted(rec.ok_bodies()) == sorted(bodies)
    r = rec.requests[0]
    assert r["method"] == "GET" and r["path"].startswith("/get?m=")
    assert r["headers"]["X-Test"] == "yes"
    assert r["headers"]["User-Agent"].startswith("nsq_to_http v")


def test_post_content_type(nsqd, tools, servers) -> None:
    addr, rec = servers[0]
    create_topic(nsqd.http_address, "nth_post")
    bodies = [b'{"a": 1}', b"\x00\x01binary"]
    pub(nsqd.http_address, "nth_post", bodies)
    t = tools.start("nsq_to_http", ["-topic=nth_post", f"-nsqd-tcp-address={nsqd.tcp_address}",
                                    f"-post=http://{addr}/post", "-content-type",
                                    "application/json", "-n", "4"])
    wait_for(lambda: len(rec.ok_bodies()) == 2, 15, "2 POSTs")
    assert t.terminate() == 0, t.stderr
    assert sorted(rec.ok_bodies()) == sorted(bodies)
    assert all(r["method"] == "POST" and r["headers"]["Content-Type"] == "application/json"
               for r in rec.requests)


def test_500_requeues_and_retries(nsqd, tools, servers) -> None:
    addr, rec = servers[0]
    rec.fail_first = {b"flaky1", b"flaky2"}
    create_topic(nsqd.http_address, "nth_500")
    bodies = [b"ok1", b"flaky1", b"ok2", b"flaky2"]
    pub(nsqd.http_address, "nth_500", bodies)
    t = tools.start("nsq_to_http", [
        "--topic=nth_500", f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--post=http://{addr}/p", "--consumer-opt=default_requeue_delay,100ms",
        "--consumer-opt=backoff_multiplier,50ms", "--consumer-opt=max_backoff_duration,200ms"])
    wait_for(lambda: len(rec.ok_bodies()) == 4, 20, "all 4 delivered with 2xx")
    wait_for(lambda: (channel_stats(nsqd.http_address, "nth_500", "nsq_to_http") or {}).get(
        "in_flight_count") == 0, 10, "all answered")
    c = channel_stats(nsqd.http_address, "nth_500", "nsq_to_http")
    assert t.terminate() == 0, t.stderr
    assert sorted(rec.ok_bodies()) == sorted(bodies)
    assert rec.attempts[b"flaky1"] == 2 and rec.attempts[b"flaky2"] == 2
    assert rec.attempts[b"ok1"] == 1
    assert c["requeue_count"] == 2 and c["depth"] == 0


def test_round_robin_two_servers(nsqd, tools, servers) -> None:
    (a, ra), (b, rb) = servers
    create_topic(nsqd.http_address, "nth_rr")
    bodies = [f"m{i}".encode() for i in range(10)]
    pub(nsqd.http_address, "nth_rr", bodies)
    t = tools.start("nsq_to_http", ["--topic=nth_rr", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                    f"--post=http://{a}/", f"--post=http://{b}/",
                                    "--mode=round-robin", "--status-every=5"])
    wait_for(lambda: len(ra.ok_bodies()) + len(rb.ok_bodies()) == 10, 15, "10 POSTs")
    assert t.terminate() == 0, t.stderr
    assert len(ra.ok_bodies()) == 5 and len(rb.ok_bodies()) == 5
    assert sorted(ra.ok_bodies() + rb.ok_bodies()) == sorted(bodies)
    assert "[aggregate]: finished 5 requests" in t.stderr


def test_hostpool_avoids_dead_server(nsqd, tools, servers) -> None:
    addr, rec = servers[0]
    create_topic(nsqd.http_address, "nth_hp")
    bodies = [f"h{i}".encode() for i in range(10)]
    pub(nsqd.http_address, "nth_hp", bodies)
    # 127.0.0.1:1 refuses connections: hostpool marks it dead and uses the live one
    t = tools.start("nsq_to_http", [
        "--topic=nth_hp", f"--nsqd-tcp-address={nsqd.tcp_address}", "--post=http://127.0.0.1:1/",
        f"--post=http://{addr}/", "--consumer-opt=default_requeue_delay,50ms",
        "--consumer-opt=backoff_multiplier,50ms"])
    wait_for(lambda: len(set(rec.ok_bodies())) == 10, 20, "all delivered to the live server")
    assert t.terminate() == 0, t.stderr
    assert sorted(set(rec.ok_bodies())) == sorted(bodies)


def test_sample_zero_finishes_without_requests(nsqd, tools, servers) -> None:
    addr, rec = servers[0]
    create_topic(nsqd.http_address, "nth_sample")
    pub(nsqd.http_address, "nth_sample", [b"s1", b"s2", b"s3"])
    t = tools.start("nsq_to_http", ["--topic=nth_sample", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                    f"--post=http://{addr}/", "--sample=0"])
    wait_for(lambda: (channel_stats(nsqd.http_address, "nth_sample", "nsq_to_http") or {}).get(
        "message_count") == 3 and channel_stats(nsqd.http_address, "nth_sample", "nsq_to_http")[
        "in_flight_count"] == 0, 15, "3 messages answered")
    assert t.terminate() == 0, t.stderr
    assert rec.requests == []
    c = channel_stats(nsqd.http_address, "nth_sample", "nsq_to_http")
    assert c["depth"] == 0 and c["requeue_count"] == 0
