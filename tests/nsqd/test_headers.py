"""Message headers against a real nsqd: Youzan's PUB_EXT / MPUB_EXT / PUB_TRACE / MPUB_TRACE,
HTTP /pub_ext and /pubtrace, ext frames for clients that IDENTIFY extend_support, plain
frames for everyone else, and every malformed input answered with its code."""

from __future__ import annotations

import json
import struct
import urllib.request
from urllib.parse import quote

import pytest

from nsqx.protocol import v2
from nsqx.protocol.frames import FRAME_MESSAGE, decode_ext_message
from tests.support import http_api
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient, consumer


def read_ext(c: RawClient) -> tuple[int, bytes, int, dict, bytes]:
    """(attempts, id, ext version, header, body) of the next ext message frame."""
    ftype, data = c.read_frame()
    assert ftype == FRAME_MESSAGE, data[:200]
    _ts, attempts, mid, ver, ext, body = decode_ext_message(data)
    return attempts, mid, ver, json.loads(ext) if ext else {}, body


def message_get(nsqd: NsqdProcess, topic: str, offset: int) -> dict:
    r = http_api.get(nsqd.http_address, "/message/get", topic=topic, search_mode="count",
                     search_pos=str(offset))
    assert r.status == 200, r.body
    return r.json()


def test_headers_reach_ext_clients_only(nsqd: NsqdProcess) -> None:
    assert http_api.post(nsqd.http_address, "/topic/create", topic="h").status == 200
    for ch in ("stock", "ext"):
        assert http_api.post(nsqd.http_address, "/channel/create", topic="h",
                             channel=ch).status == 200
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub_ext("h", b"one", {"k": "v", "##client_dispatch_tag": "blue"}))
        c.expect_ok()
        c.send(v2.pub("h", b"two"))
        c.expect_ok()
        c.send(v2.mpub_ext("h", [({"n": "3"}, b"three"), (None, b"four"), (b"", b"five")]))
        c.expect_ok()
    # a stock client: the very frames a plain PUB would give (no trace of the header)
    with consumer(nsqd.tcp_address, "h", "stock", rdy=10) as c:
        msgs = c.read_messages(5)
        assert [m.body for m in msgs] == [b"one", b"two", b"three", b"four", b"five"]
        assert [m.attempts for m in msgs] == [1] * 5
    with consumer(nsqd.tcp_address, "h", "ext", rdy=10,
                  identify={"extend_support": True}) as c:
        got = [read_ext(c) for _ in range(5)]
        assert [g[4] for g in got] == [b"one", b"two", b"three", b"four", b"five"]
        assert [g[2] for g in got] == [4, 0, 4, 0, 0]
        assert got[0][3] == {"k": "v", "##client_dispatch_tag": "blue"}
        assert got[2][3] == {"n": "3"}
        # FIN/REQ take the same id; a requeued message comes back in the ext layout too
        c.send(v2.req(got[0][1], 0))
        again = read_ext(c)
        assert again[1] == got[0][1] and again[0] == 2 and again[3]["k"] == "v"
    assert message_get(nsqd, "h", 0)["headers"] == {"k": "v", "##client_dispatch_tag": "blue"}


def test_traced_responses(nsqd: NsqdProcess) -> None:
    with RawClient(nsqd.tcp_address) as c:
        c.pub("tr", b"zero")
        c.send(v2.pub_trace("tr", 77, b"traced"))
        mid, tid, off, size = v2.parse_traced_response(c.expect_response())
        assert (mid, tid, off, size) == (1, 77, 1, 30 + 6)
        c.send(v2.mpub_trace("tr", [(5, b"a"), (0, b"bb")]))
        assert v2.parse_traced_response(c.expect_response()) == (2, 0, 2, 31 + 32)
        c.send(v2.pub_ext("tr", b"x", {"##trace_id": "18446744073709551615"}))
        assert v2.parse_traced_response(c.expect_response())[1:3] == (2**64 - 1, 4)
        c.send(v2.pub_ext("tr", b"y", {"a": "b"}))  # no trace id: plain OK
        c.expect_ok()
    assert message_get(nsqd, "tr", 1)["headers"] == {"##trace_id": "77"}
    assert message_get(nsqd, "tr", 2)["headers"] == {"##trace_id": "5"}
    assert not message_get(nsqd, "tr", 3).get("headers")  # trace id 0: none kept
    with consumer(nsqd.tcp_address, "tr", "c", rdy=10) as c:
        assert [m.id for m in c.read_messages(6)][1] == b"%016x" % 1


def test_partitions_and_auth_order(nsqd: NsqdProcess) -> None:
    assert http_api.post(nsqd.http_address, "/topic/create", topic="hp",
                         partition_num="2").status == 200
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub_trace("hp", 9, b"p1", partition=1))
        mid, _, off, _ = v2.parse_traced_response(c.expect_response())
        assert (mid >> 48, off) == (1, 0)
        c.send(v2.pub_ext("hp", b"x", {"a": "b"}, partition=2))
        c.expect_error("E_BAD_PARTITION", closed=False)
        body = v2.mpub_body([b"\x00\x00a"])
        c.send(b"MPUB_EXT hp x\n" + struct.pack(">I", len(body)) + body)
        c.expect_error("E_BAD_PARTITION", closed=False)


@pytest.mark.parametrize("frame,code,closed", [
    # EXT bodies too short for their JSON length, or for any body at all: fatal E_BAD_BODY
    (b"PUB_EXT e\n" + struct.pack(">I", 2) + b"\x00\x00", "E_BAD_BODY", True),
    (b"PUB_EXT e\n" + struct.pack(">I", 1) + b"\x00", "E_BAD_BODY", True),
    (b"PUB_EXT e\n" + struct.pack(">I", 5) + b"\x00\x09{}x", "E_BAD_BODY", True),
    (b"PUB_TRACE e\n" + struct.pack(">I", 8) + b"\x00" * 8, "E_BAD_BODY", True),
    (b"PUB_EXT e\n" + struct.pack(">I", 0), "E_BAD_MESSAGE", True),
    (b"MPUB_EXT e\n" + struct.pack(">I", 9) + struct.pack(">I", 1) + struct.pack(">I", 1) + b"\x00",
     "E_BAD_BODY", True),
    (b"MPUB_TRACE e\n" + struct.pack(">I", 16) + v2.mpub_body([b"\x00" * 8]), "E_BAD_BODY", True),
    (b"MPUB_EXT e\n" + struct.pack(">I", 3) + b"abc", "E_BAD_BODY", True),
    (b"PUB_EXT bad!topic\n" + struct.pack(">I", 3) + b"\x00\x00x", "E_BAD_TOPIC", True),
    (b"PUB_TRACE\n", "E_INVALID", True),
    # a malformed header: non-fatal, the connection stays usable
    (v2.pub_ext("e", b"x", b"{not json"), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b"[1,2]"), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b'{"a":1}'), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b'{"a":{"b":"c"}}'), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b'{"a":NaN}'), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b'{"":"v"}'), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b'\xff\xfe'), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", b"[" * 5000 + b"]" * 5000), "E_INVALID_JSON_HEADER", False),
    (v2.pub_ext("e", b"x", {"##trace_id": "12a"}), "INVALID_TRACE_ID", False),
    (v2.pub_ext("e", b"x", {"##trace_id": str(2**64)}), "INVALID_TRACE_ID", False),
    (v2.pub_ext("e", b"x", b'{"##trace_id":12}'), "INVALID_TRACE_ID", False),
    (v2.pub_ext("e", b"x", {"##client_dispatch_tag": "no spaces"}), "E_BAD_TAG", False),
    (v2.pub_ext("e", b"x", {"##client_dispatch_tag": "t" * 101}), "E_BAD_TAG", False),
    (v2.mpub_ext("e", [({"ok": "1"}, b"x"), (b"{", b"y")]), "E_INVALID_JSON_HEADER", False),
])
def test_bad_input(nsqd: NsqdProcess, frame: bytes, code: str, closed: bool) -> None:
    with RawClient(nsqd.tcp_address) as c:
        c.send(frame)
        c.expect_error(code, closed=closed)
    if not closed:  # nothing of a refused batch was stored
        stats = http_api.stats(nsqd.http_address, "e")["topics"]
        assert not stats or stats[0]["message_count"] == 0


def test_topic_without_ext(nsqd: NsqdProcess) -> None:
    r = http_api.post(nsqd.http_address, "/topic/create", topic="plain", extend="false")
    assert r.status == 200
    r = http_api.post(nsqd.http_address, "/topic/create", topic="plain", extend="true")
    assert (r.status, r.json()["message"]) == (400, "TOPIC_EXISTS")
    r = http_api.post(nsqd.http_address, "/topic/create", topic="plain2", extend="maybe")
    assert (r.status, r.json()["message"]) == (400, "INVALID_EXTEND")
    nsqd.restart()  # the flag is kept in nsqd.dat
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.pub_ext("plain", b"x", {"custom": "1"}))
        c.expect_error("E_EXT_NOT_SUPPORT", "ext content not supported in topic plain",
                       closed=False)
        c.send(v2.mpub_ext("plain", [(None, b"a"), ({"custom": "1"}, b"b")]))
        c.expect_error("E_EXT_NOT_SUPPORT", closed=False)
        c.send(v2.pub_ext("plain", b"x", {"##trace_id": "5"}))  # reserved keys only: taken
        assert v2.parse_traced_response(c.expect_response())[1] == 5
    r = http_api.request("POST", f"http://{nsqd.http_address}/pub_ext?topic=plain&ext=%7B%22c%22%3A%221%22%7D",
                         b"body")
    assert (r.status, r.json()["message"]) == (400, "E_EXT_NOT_SUPPORT")


def test_http_pub_ext_and_pubtrace(nsqd: NsqdProcess) -> None:
    base = f"http://{nsqd.http_address}"
    ext = quote('{"a":"1","##trace_id":"42"}')
    r = http_api.request("POST", f"{base}/pub_ext?topic=hx&ext={ext}", b"first")
    assert r.status == 200
    assert r.json() == {"status": "OK", "id": 0, "trace_id": "42", "queue_offset": 0,
                        "rawsize": 35}
    req = urllib.request.Request(
        f"{base}/pub_ext?topic=hx&ext=%7B%22a%22%3A%221%22%7D", data=b"second", method="POST",
        headers={"X-Nsqext-Color": "red", "X-Nsqext-A": "override"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.read() == b"OK"
    r = http_api.request("POST", f"{base}/pubtrace?topic=hx&trace_id=7", b"third")
    assert r.json()["trace_id"] == "7" and r.json()["queue_offset"] == 2
    assert message_get(nsqd, "hx", 0)["headers"] == {"a": "1", "##trace_id": "42"}
    assert message_get(nsqd, "hx", 1)["headers"] == {"a": "override", "color": "red"}
    assert message_get(nsqd, "hx", 2)["headers"] == {"##trace_id": "7"}
    for path, body, status, code in [
        ("/pub_ext?topic=hx", b"x", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=hx&ext=", b"x", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=hx&ext=%7B", b"x", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=hx&ext=" + "%5B" * 2000, b"x", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=hx&ext=%7B%22a%22%3A2%7D", b"x", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=hx&ext=%7B%22a%22%3A%222%22%7D", b"", 400, "MSG_EMPTY"),
        ("/pub_ext?topic=bad!&ext=%7B%7D", b"x", 400, "INVALID_TOPIC"),
        ("/pub_ext?topic=hx&partition=3&ext=%7B%22a%22%3A%222%22%7D", b"x", 400, "E_BAD_PARTITION"),
        ("/pubtrace?topic=hx", b"x", 400, "INVALID_TRACE_ID"),
        ("/pubtrace?topic=hx&trace_id=-1", b"x", 400, "INVALID_TRACE_ID"),
        ("/pubtrace?topic=hx&trace_id=%C2%B2", b"x", 400, "INVALID_TRACE_ID"),
        ("/pubtrace?topic=hx&trace_id=18446744073709551616", b"x", 400, "INVALID_TRACE_ID"),
    ]:
        r = http_api.request("POST", base + path, body)
        assert (r.status, r.json()["message"]) == (status, code), path[:80]
    assert http_api.stats(nsqd.http_address, "hx")["topics"][0]["message_count"] == 3


def test_identify_fields(nsqd: NsqdProcess) -> None:
    with RawClient(nsqd.tcp_address) as c:
        info = c.identify({"feature_negotiation": True, "desired_tag": "blue",
                           "extend_support": True})
        assert info["desired_tag"] == "blue"
    with RawClient(nsqd.tcp_address) as c:  # stock clients see upstream's response
        assert "desired_tag" not in c.identify({"feature_negotiation": True})
    for tag, text in [("t" * 101, "IDENTIFY invalid tag len 101, exceed limit 100"),
                      ("a b", "IDENTIFY invalid tag a b")]:
        with RawClient(nsqd.tcp_address) as c:
            c.send(v2.identify({"desired_tag": tag}))
            c.expect_error("E_BAD_BODY", text, closed=True)
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.identify({"extend_support": "yes"}))
        c.expect_error("E_BAD_BODY", closed=True)
