"""``GET /trace/search`` on nsqlookupd: one search over every nsqd it knows (real processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.rawclient import RawClient, consumer

pytestmark = pytest.mark.slow


def search(lookupd_http: str, **q: str) -> tuple[int, dict]:
    url = f"http://{lookupd_http}/trace/search?{urlencode(q)}"
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_trace_search_through_lookupd(lookupd_factory, nsqd_factory) -> None:  # type: ignore[no-untyped-def]
    ld = lookupd_factory.start()
    nodes = [nsqd_factory.start([f"--lookupd-tcp-address={ld.tcp_address}",
                                 "--broadcast-address=127.0.0.1"]) for _ in range(2)]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{ld.http_address}/nodes", timeout=5) as r:
            if len(json.loads(r.read())["producers"]) == 2:
                break
        time.sleep(0.05)
    traced = nodes[1]  # only this node handles the traced message
    http_api.post(traced.http_address, "/topic/create", topic="o")
    http_api.post(traced.http_address, "/channel/create", topic="o", channel="billing")
    assert http_api.post(traced.http_address, "/topic/trace", topic="o",
                         enable="true").status == 200
    with RawClient(traced.tcp_address) as p:
        p.send(v2.pub_ext("o", b"body", {"order_id": "A-17", "##trace_id": "4242"}))
        p.expect_response()
    with consumer(traced.tcp_address, "o", "billing", rdy=1) as c:
        m = c.read_message()
        c.send(v2.fin(m.id))
        c.expect_nothing(0.2)
    mine = f"127.0.0.1:{traced.http_address.rsplit(':', 1)[1]}"

    def events(**q: str) -> list[str]:
        code, body = search(ld.http_address, topic="o", **q)
        assert code == 200, body
        assert {n["node"] for n in body["nodes"]} == {
            f"127.0.0.1:{n.http_address.rsplit(':', 1)[1]}" for n in nodes}
        hits = [n for n in body["nodes"] if any(x.get("events") for x in n["messages"])]
        assert [n["node"] for n in hits] == [mine]
        return [e["event"] for e in hits[0]["messages"][0]["events"]]

    deadline = time.monotonic() + 10
    while events(id=m.id.decode()) != ["pub", "deliver", "fin"]:
        assert time.monotonic() < deadline, events(id=m.id.decode())
        time.sleep(0.05)
    assert events(trace_id="4242") == ["pub", "deliver", "fin"]
    assert events(header="order_id:A-17") == ["pub", "deliver", "fin"]

    # the CLI through lookupd: the node that has the events, nothing from the other
    out = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", "trace", "get", "o",
                          "--trace-id", "4242", "--lookupd-http-address", ld.http_address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"node {mine}:\nmessage {m.id.decode()}")
    assert out.stdout.count("node ") == 1 and "header order_id: A-17" in out.stdout
    out = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqx_cmd", "trace", "get", "o",
                          "--trace-id", "1", "--lookupd-http-address", ld.http_address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "no traced message of o found on 2 node(s)" in out.stdout

    # hostile input: refused by lookupd or, when every node refuses it, with their code
    for q, code, msg in [
        ({}, 400, "MISSING_ARG_TOPIC"),
        ({"topic": "o"}, 400, "MISSING_ARG_ID"),
        ({"topic": "bad topic!", "id": "1"}, 400, "INVALID_TOPIC"),
        ({"topic": "o", "id": "1", "trace_id": "2"}, 400, "MISSING_ARG_ID"),
        ({"topic": "o", "trace_id": "9" * 2000}, 400, "INVALID_TRACE_ID"),
        ({"topic": "o", "id": "zz"}, 400, "INVALID_ID"),
        ({"topic": "o", "trace_id": "x"}, 400, "INVALID_TRACE_ID"),
        ({"topic": "o", "id": "1", "limit": "-3"}, 400, "INVALID_LIMIT"),
        ({"topic": "o", "header": "nocolon"}, 400, "INVALID_HEADER"),
    ]:
        assert search(ld.http_address, **q) == (code, {"message": msg}), q

    # a node that does not answer (frozen: still registered) is named in errors after the
    # timeout; the other's answer still comes back
    nodes[0].signal(signal.SIGSTOP)
    try:
        code, body = search(ld.http_address, topic="o", trace_id="4242")
    finally:
        nodes[0].signal(signal.SIGCONT)
    assert code == 200 and [n["node"] for n in body["nodes"]] == [mine]
    assert len(body["errors"]) == 1 and body["errors"][0].startswith(
        f"127.0.0.1:{nodes[0].http_address.rsplit(':', 1)[1]}")
