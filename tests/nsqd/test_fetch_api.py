"""nsqd's /nsqx/* log API (offsets, fetch, idempotent publish): formats, bounds, errors, auth,
durability of publish keys across SIGKILL."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from nsqx.nsqd.fetch_api import FETCH_HEADER, FETCH_MAGIC, PUB_KEY_HEADER
from nsqx.nsqd.http import make_app
from nsqx.nsqd.options import Options
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.nsqd_process import NsqdFactory, NsqdProcess


def call(node: NsqdProcess, method: str, path: str, body: bytes | None = None,
         secret: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{node.http_address}{path}", data=body, method=method)
    if secret:
        req.add_header("Authorization", f"Bearer {secret}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def pub(node: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    body = struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b
                                                     for b in bodies)
    st, data = call(node, "POST", f"/mpub?topic={topic}&binary=true", body)
    assert st == 200, data


def mpub_body(bodies: list[bytes]) -> bytes:
    return struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)


def parse(data: bytes) -> dict[str, Any]:
    magic, ver, flags, part, start, count, nxt, earliest, latest, flen = FETCH_HEADER.unpack_from(
        data)
    assert magic == FETCH_MAGIC and ver == 1
    frames = data[FETCH_HEADER.size:FETCH_HEADER.size + flen]
    msgs = []
    p = 0
    while p < len(frames):
        (size,) = struct.unpack_from(">I", frames, p)
        ftype, ts, attempts = struct.unpack_from(">IqH", frames, p + 4)
        assert ftype == 2
        mid = frames[p + 18:p + 34]
        msgs.append((mid, ts, frames[p + 34:p + 4 + size]))
        p += 4 + size
    assert len(msgs) == count
    return {"flags": flags, "partition": part, "start": start, "count": count, "next": nxt,
            "earliest": earliest, "latest": latest, "msgs": msgs,
            "tail": data[FETCH_HEADER.size + flen:]}


def test_offsets_and_fetch_roundtrip(nsqd: NsqdProcess) -> None:
    st, data = call(nsqd, "GET", "/nsqx/offsets?topic=nope")
    assert (st, json.loads(data)) == (404, {"message": "TOPIC_NOT_FOUND"})
    st, _ = call(nsqd, "GET", "/nsqx/offsets?topic=nope")
    assert st == 404  # a read never creates the topic
    pub(nsqd, "t", [b"m%03d" % i for i in range(100)])
    pub(nsqd, "t", [b"short", b"a longer body", b"x"])
    st, data = call(nsqd, "GET", "/nsqx/offsets?topic=t")
    doc = json.loads(data)
    assert st == 200 and doc["topic"] == "t"
    (p,) = doc["partitions"]
    assert (p["partition"], p["earliest"], p["latest"]) == (0, 0, 103)
    st, data = call(nsqd, "GET", "/nsqx/fetch?topic=t&partition=0&offset=0")
    r = parse(data)
    assert (r["start"], r["count"], r["next"], r["latest"]) == (0, 103, 103, 103)
    assert [m[2] for m in r["msgs"]] == [b"m%03d" % i for i in range(100)] + [
        b"short", b"a longer body", b"x"]
    assert r["msgs"][5][0] == b"%016x" % 5
    # deterministic: the same range is the same bytes
    assert call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=0")[1] == data
    # end and max_bytes bound the answer; at least one record even if it is bigger
    r = parse(call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=10&end=15")[1])
    assert (r["start"], r["count"], r["next"]) == (10, 5, 15)
    r = parse(call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=10&max_bytes=100")[1])
    assert (r["count"], r["next"]) == (2, 12)  # frames are 38 bytes
    r = parse(call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=10&max_bytes=1")[1])
    assert r["count"] == 1
    r = parse(call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=103")[1])
    assert (r["count"], r["next"]) == (0, 103)
    st, data = call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=104")
    assert (st, json.loads(data)) == (416, {"message": "OFFSET_OUT_OF_RANGE"})
    # timestamps
    first = parse(call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=100&end=101")[1])["msgs"][0][1]
    doc = json.loads(call(nsqd, "GET", f"/nsqx/offsets?topic=t&timestamp_ns={first}")[1])
    assert doc["partitions"][0]["offset_for_timestamp"] <= 100
    doc = json.loads(call(nsqd, "GET", f"/nsqx/offsets?topic=t&timestamp_ns={first + 1}")[1])
    assert doc["partitions"][0]["offset_for_timestamp"] == 103


@pytest.mark.parametrize("path,code", [
    ("/nsqx/offsets", "MISSING_ARG_TOPIC"),
    ("/nsqx/offsets?topic=a/b", "INVALID_TOPIC"),
    ("/nsqx/offsets?topic=t&timestamp_ns=x", "INVALID_TIMESTAMP"),
    ("/nsqx/fetch?topic=t", "MISSING_ARG_OFFSET"),
    ("/nsqx/fetch?topic=t&offset=-1", "INVALID_ARG_OFFSET"),
    ("/nsqx/fetch?topic=t&offset=0&max_bytes=0", "INVALID_ARG_MAX_BYTES"),
    ("/nsqx/fetch?topic=t&offset=0&partition=x", "INVALID_ARG_PARTITION"),
])
def test_bad_arguments(nsqd: NsqdProcess, path: str, code: str) -> None:
    pub(nsqd, "t", [b"x"])
    st, data = call(nsqd, "GET", path)
    assert (st, json.loads(data)) == (400, {"message": code})


def test_unknown_partition(nsqd: NsqdProcess) -> None:
    pub(nsqd, "t", [b"x"])
    st, data = call(nsqd, "GET", "/nsqx/fetch?topic=t&offset=0&partition=3")
    assert (st, json.loads(data)) == (404, {"message": "PARTITION_NOT_FOUND"})


def test_idempotent_pub_and_keys(nsqd: NsqdProcess) -> None:
    path = "/nsqx/pub?topic=w&writer=q1&batch=7&task=0.0"
    st, data = call(nsqd, "POST", path, mpub_body([b"a", b"b", b"c"]))
    assert (st, json.loads(data)) == (200, {"partition": 0, "base": 0, "count": 3,
                                            "duplicate": False})
    st, data = call(nsqd, "POST", path, mpub_body([b"a", b"b", b"c"]))
    assert json.loads(data) == {"partition": 0, "base": 0, "count": 3, "duplicate": True}
    st, data = call(nsqd, "POST", "/nsqx/pub?topic=w&writer=q1&batch=7&task=0.1",
                    mpub_body([b"d"]))
    assert json.loads(data)["base"] == 3
    # keyed body: [klen][key][size][body]; the key becomes the "key" header
    body = struct.pack(">I", 2) + struct.pack(">I", 2) + b"k1" + struct.pack(">I", 1) + b"e" + \
        struct.pack(">I", 0) + struct.pack(">I", 1) + b"f"
    st, data = call(nsqd, "POST", "/nsqx/pub?topic=w&writer=q1&batch=8&task=0.0&keys=1", body)
    assert json.loads(data)["base"] == 4
    r = parse(call(nsqd, "GET", "/nsqx/fetch?topic=w&offset=0&headers=1")[1])
    assert [m[2] for m in r["msgs"]] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert r["flags"] & 1
    tail = r["tail"]
    (n,) = struct.unpack_from(">I", tail)
    assert n == 3  # offsets 0, 3 and 4 have headers
    assert b"k1" in tail and PUB_KEY_HEADER.encode() in tail
    for bad, code in [("/nsqx/pub?topic=w&batch=1&task=1", "MISSING_ARG_WRITER"),
                      ("/nsqx/pub?topic=w&writer=a&task=1", "MISSING_ARG_BATCH"),
                      ("/nsqx/pub?topic=w&writer=a&batch=1", "MISSING_ARG_TASK"),
                      ("/nsqx/pub?topic=w&writer=a%23b&batch=1&task=1", "INVALID_ARG_WRITER")]:
        st, data = call(nsqd, "POST", bad, mpub_body([b"x"]))
        assert (st, json.loads(data)) == (400, {"message": code})
    st, data = call(nsqd, "POST", "/nsqx/pub?topic=w&writer=a&batch=1&task=1", b"\x00\x00")
    assert (st, json.loads(data)) == (413, {"message": "BAD_BODY"})


def test_pub_keys_survive_sigkill_and_lost_index(nsqd: NsqdProcess) -> None:
    path = "/nsqx/pub?topic=d&writer=w&batch=1&task=0"
    assert json.loads(call(nsqd, "POST", path, mpub_body([b"1", b"2"]))[1])["duplicate"] is False
    nsqd.kill()
    nsqd.start()
    assert json.loads(call(nsqd, "POST", path, mpub_body([b"1", b"2"]))[1])["duplicate"] is True
    # the SQLite index gone (or never written before a crash): rebuilt from the log's headers
    nsqd.kill()
    for p in Path(nsqd.data_path).rglob("pubkeys-p0.sqlite*"):
        p.unlink()
    nsqd.start()
    doc = json.loads(call(nsqd, "POST", path, mpub_body([b"1", b"2"]))[1])
    assert doc == {"partition": 0, "base": 0, "count": 2, "duplicate": True}
    st, data = call(nsqd, "GET", "/nsqx/offsets?topic=d")
    assert json.loads(data)["partitions"][0]["latest"] == 2


def test_concurrent_retries_publish_once(nsqd: NsqdProcess) -> None:
    path = "/nsqx/pub?topic=c&writer=w&batch=1&task=0"
    body = mpub_body([b"x" * 1000] * 500)
    results: list[dict] = []

    def go() -> None:
        results.append(json.loads(call(nsqd, "POST", path, body)[1]))

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not r["duplicate"] for r in results) == 1
    assert {(r["base"], r["count"]) for r in results} == {(0, 500)}
    assert json.loads(call(nsqd, "GET", "/nsqx/offsets?topic=c")[1])["partitions"][0][
        "latest"] == 500


def test_auth_like_sub(nsqd_factory: NsqdFactory, auth_server: AuthServer) -> None:
    auth_server.identities["reader"] = Identity("r", [grant("t.*", (".*",), ("subscribe",))])
    auth_server.identities["writer"] = Identity("w", [grant("t.*", (".*",), ("publish",))])
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    pub(node, "t1", [b"x"])
    st, data = call(node, "GET", "/nsqx/offsets?topic=t1")
    assert (st, json.loads(data)) == (401, {"message": "AUTH_REQUIRED"})
    st, data = call(node, "GET", "/nsqx/fetch?topic=t1&offset=0", secret="nobody")
    assert (st, json.loads(data)) == (401, {"message": "AUTH_FAILED"})
    st, data = call(node, "GET", "/nsqx/fetch?topic=t1&offset=0", secret="writer")
    assert (st, json.loads(data)) == (403, {"message": "UNAUTHORIZED"})
    st, data = call(node, "GET", "/nsqx/fetch?topic=t1&offset=0", secret="reader")
    assert st == 200 and parse(data)["count"] == 1
    st, data = call(node, "GET", "/nsqx/offsets?topic=t1", secret="reader")
    assert st == 200
    st, data = call(node, "POST", "/nsqx/pub?topic=t1&writer=a&batch=1&task=1",
                    mpub_body([b"y"]), secret="reader")
    assert (st, json.loads(data)) == (403, {"message": "UNAUTHORIZED"})
    st, data = call(node, "POST", "/nsqx/pub?topic=t1&writer=a&batch=1&task=1",
                    mpub_body([b"y"]), secret="writer")
    assert st == 200
    # answers are cached for the TTL: one auth request per secret
    assert auth_server.secrets_seen().count("reader") == 1


def test_fetch_after_retention_reports_the_skip(tmp_path: Path) -> None:
    """Records removed by retention: fetch answers from the earliest kept offset."""
    from nsqx.nsqd.node import NSQD

    async def main() -> None:
        opts = Options(data_path=str(tmp_path), max_bytes_per_file=2000)
        node = NSQD(opts)
        client = TestClient(TestServer(make_app(node), host="127.0.0.1"))
        await client.start_server()
        try:
            for i in range(20):
                await node.publish("r", [b"%04d" % i + b"x" * 200])
            topic = node.topics["r"]
            start = topic.log.apply_retention(15)
            assert start > 0
            resp = await client.get("/nsqx/fetch?topic=r&offset=0")
            r = parse(await resp.read())
            assert r["start"] == start == r["earliest"]
            assert r["msgs"][0][2].startswith(b"%04d" % start)
            doc = await (await client.get("/nsqx/offsets?topic=r")).json()
            assert doc["partitions"][0]["earliest"] == start
        finally:
            await client.close()
            await node.stop()

    asyncio.run(main())
