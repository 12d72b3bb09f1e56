"""``nsqx trace enable|disable|get`` against a real nsqd."""

from __future__ import annotations

import json
import time

import pytest

from nsqx.cli.nsqx_cmd import main
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient, consumer


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_enable_get_disable(nsqd: NsqdProcess, capsys) -> None:
    addr = ["--nsqd-http-address", nsqd.http_address]
    http_api.post(nsqd.http_address, "/topic/create", topic="o")
    http_api.post(nsqd.http_address, "/channel/create", topic="o", channel="billing")
    assert run(capsys, "trace", "enable", "o", *addr)[:2] == (0, "o: tracing on\n")
    with RawClient(nsqd.tcp_address) as p:
        p.send(v2.pub_ext("o", b"body", {"order_id": "A-17", "##trace_id": "12345"}))
        p.expect_response()
    with consumer(nsqd.tcp_address, "o", "billing", rdy=1) as c:
        m = c.read_message()
        c.send(v2.req(m.id, 0))
        m = c.read_message()
        c.send(v2.fin(m.id))
        c.expect_nothing(0.2)
    deadline = time.monotonic() + 10
    while True:
        code, out, _ = run(capsys, "trace", "get", "o", "--id", m.id.decode(), "--json", *addr)
        doc = json.loads(out)
        if len(doc["messages"][0]["events"]) == 5 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [e["event"] for e in doc["messages"][0]["events"]] == ["pub", "deliver", "req",
                                                                 "deliver", "fin"]
    code, out, _ = run(capsys, "trace", "get", "o", "--trace-id", "12345", *addr)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"message {m.id.decode()}  partition 0  offset 0")
    assert "trace_id 12345" in lines[0] and "  header order_id: A-17" in lines
    assert [ln.split()[2] for ln in lines if ln.startswith("  ") and "node=" in ln] == [
        "pub", "deliver", "req", "deliver", "fin"]
    assert "channel=billing" in out and "attempts=2" in out
    code, out, _ = run(capsys, "trace", "get", "o", "--header", "order_id:A-17", *addr)
    assert code == 0 and "trace_id 12345" in out
    code, out, _ = run(capsys, "trace", "get", "o", "--header", "order_id:none", *addr)
    assert code == 3 and "no message of o found" in out
    assert run(capsys, "trace", "disable", "o", *addr)[:2] == (0, "o: tracing off\n")
    code, out, _ = run(capsys, "trace", "get", "o", "--id", m.id.decode(), *addr)
    assert code == 0 and out.startswith("note: topic o is not traced now")


def test_trace_errors(nsqd: NsqdProcess, capsys) -> None:
    addr = ["--nsqd-http-address", nsqd.http_address]
    code, _, err = run(capsys, "trace", "enable", "missing", *addr)
    assert code == 1 and "nsqd answered 404 TOPIC_NOT_FOUND" in err
    code, _, err = run(capsys, "trace", "get", "t", "--id", "zz", *addr)
    assert code == 1 and "400 INVALID_ID" in err
    code, _, err = run(capsys, "trace", "get", "t", "--id", "0" * 16,
                       "--nsqd-http-address", "127.0.0.1:1")
    assert code == 1 and "cannot reach nsqd" in err
    for argv in (["trace", "get", "t", *addr], ["trace", "get", "t", "--header", "nocolon", *addr],
                 ["trace", "get", "t", "--trace-id", "-3", *addr]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
