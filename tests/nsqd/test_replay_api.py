"""Replay and lookup: POST /channel/setoffset, GET /message/get and SUB_ADVANCED against a real
nsqd (and an in-process one where the test needs to steer timestamps or retention)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from nsqx.nsqd.http import make_app
from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import Options
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.http_api import Response
from tests.support.nsqd_process import NsqdProcess
from tests.support.rawclient import RawClient, consumer


def setoffset(node: NsqdProcess, body: bytes | str, **params: Any) -> Response:
    params.setdefault("topic", "t")
    params.setdefault("channel", "c")
    data = body.encode() if isinstance(body, str) else body
    return http_api.request("POST", http_api._url(node.http_address, "/channel/setoffset",
                                                  params), data)


def msg_get(node: NsqdProcess, **params: Any) -> Response:
    params.setdefault("topic", "t")
    return http_api.get(node.http_address, "/message/get", **params)


def seed(node: NsqdProcess, n: int = 10, topic: str = "t", channel: str = "c") -> None:
    assert http_api.post(node.http_address, "/topic/create", topic=topic).status == 200
    assert http_api.post(node.http_address, "/channel/create", topic=topic,
                         channel=channel).status == 200
    assert http_api.mpub(node.http_address, topic, [b"m%d" % i for i in range(n)]).status == 200


def bodies(msgs: list[Any]) -> list[bytes]:
    return [m.body for m in msgs]


# --------------------------------------------------------------------------- setoffset


def test_setoffset_replays_from_the_position_and_drops_in_flight(nsqd: NsqdProcess) -> None:
    seed(nsqd)
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        first = c.read_messages(10)
        for m in first[:8]:
            c.send(v2.fin(m.id))
        # two in flight; replay from message 3 (Youzan's count)
        r = setoffset(nsqd, "msgcount:3")
        assert r.status == 200, r.body
        assert r.json() == {"topic": "t", "channel": "c", "partition": 0, "offset": 3,
                            "earliest": 0, "latest": 10, "clamped": False, "persisted": True}
        again = c.read_messages(7)
        assert bodies(again) == [b"m%d" % i for i in range(3, 10)]
        assert all(m.attempts == 1 for m in again)
        for m in again:
            c.send(v2.fin(m.id))
        c.expect_nothing(0.3)
    st = http_api.stats(nsqd.http_address, "t", "c")["topics"][0]["channels"][0]
    assert (st["depth"], st["in_flight_count"]) == (0, 0)


def test_late_fin_of_a_message_from_before_the_reset_fails(nsqd: NsqdProcess) -> None:
    seed(nsqd, 6)
    with consumer(nsqd.tcp_address, "t", "c", rdy=2) as c:
        old = c.read_messages(2)  # offsets 0, 1 in flight
        assert setoffset(nsqd, "virtual_queue:4").status == 200
        new = c.read_messages(2)  # the reset freed the RDY window
        assert bodies(new) == [b"m4", b"m5"]
        c.send(v2.fin(old[0].id))
        c.expect_error("E_FIN_FAILED", f"FIN {old[0].id.decode()} failed ID not in flight",
                       closed=False)


def test_earliest_latest_and_the_query_form(nsqd: NsqdProcess) -> None:
    seed(nsqd, 5)
    assert setoffset(nsqd, "latest").json()["offset"] == 5
    assert setoffset(nsqd, "", to="earliest").json()["offset"] == 0
    assert setoffset(nsqd, "special:-1").json()["offset"] == 5
    assert setoffset(nsqd, "special:-2").json()["offset"] == 0
    assert setoffset(nsqd, "", to="offset:2").json()["offset"] == 2
    # the body wins over the query
    assert setoffset(nsqd, "msgcount:1", to="latest").json()["offset"] == 1
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(4)) == [b"m1", b"m2", b"m3", b"m4"]


def test_setoffset_by_time_is_a_seek_in_the_time_index(nsqd: NsqdProcess) -> None:
    seed(nsqd, 3)
    time.sleep(1.1)  # Youzan's timestamps are whole seconds
    t = int(time.time())
    while int(time.time()) == t:
        time.sleep(0.05)
    t = int(time.time())
    assert http_api.mpub(nsqd.http_address, "t", [b"late1", b"late2"]).status == 200
    r = setoffset(nsqd, f"timestamp:{t}")
    assert r.json()["offset"] == 3
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(2)) == [b"late1", b"late2"]
        c.expect_nothing(0.3)
    # a time before everything: the oldest kept; a time in the future: the log end
    assert setoffset(nsqd, "timestamp:0").json()["offset"] == 0
    assert setoffset(nsqd, f"timestamp:{t + 3600}").json()["offset"] == 5


def test_reset_survives_sigkill(nsqd: NsqdProcess) -> None:
    seed(nsqd, 10)
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        for m in c.read_messages(10):
            c.send(v2.fin(m.id))
        c.expect_nothing(0.3)
    assert setoffset(nsqd, "msgcount:6").status == 200
    nsqd.kill()  # SIGKILL: no shutdown persist; the reset must already be on disk
    nsqd.start()
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(4)) == [b"m6", b"m7", b"m8", b"m9"]
        c.expect_nothing(0.3)


def test_paused_channel_moves_and_stays_paused(nsqd: NsqdProcess) -> None:
    seed(nsqd, 4)
    assert http_api.post(nsqd.http_address, "/channel/pause", topic="t",
                         channel="c").status == 200
    assert setoffset(nsqd, "msgcount:2").status == 200
    ch = http_api.stats(nsqd.http_address, "t", "c")["topics"][0]["channels"][0]
    assert ch["paused"] is True and ch["depth"] == 2
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        c.expect_nothing(0.3)
        assert http_api.post(nsqd.http_address, "/channel/unpause", topic="t",
                             channel="c").status == 200
        assert bodies(c.read_messages(2)) == [b"m2", b"m3"]


def test_ephemeral_channel_moves_in_memory(nsqd: NsqdProcess) -> None:
    assert http_api.mpub(nsqd.http_address, "t", [b"m%d" % i for i in range(5)]).status == 200
    with consumer(nsqd.tcp_address, "t", "e#ephemeral", rdy=0) as c:
        r = setoffset(nsqd, "msgcount:1", channel="e#ephemeral")
        assert r.status == 200 and r.json()["persisted"] is False
        c.send(v2.rdy(10))
        assert bodies(c.read_messages(4)) == [b"m1", b"m2", b"m3", b"m4"]


def test_channel_of_an_ephemeral_topic(nsqd: NsqdProcess) -> None:
    with consumer(nsqd.tcp_address, "x#ephemeral", "c", rdy=0) as c:
        assert http_api.mpub(nsqd.http_address, "x#ephemeral", [b"a", b"b", b"c"]).status == 200
        r = setoffset(nsqd, "msgcount:1", topic="x#ephemeral")
        assert r.json()["offset"] == 1 and r.json()["persisted"] is False
        c.send(v2.rdy(5))
        assert bodies(c.read_messages(2)) == [b"b", b"c"]


@pytest.mark.parametrize("body", [
    "", "bogus", "timestamp", "timestamp:", "timestamp:-1", "timestamp:1.5", "timestamp:abc",
    "msgcount:-3", "msgcount:+3", "msgcount:0x10", "virtual_queue:1e3", "special:0",
    "special:-3", "msgcount:99999999999999999999999", "msgcount:281474976710656",
    "timestamp:9999999999999", "unknown:3", "msgcount:3:4", "msgcount:٣", "\xff\xfe",
])
def test_malformed_positions_are_refused(nsqd: NsqdProcess, body: str) -> None:
    seed(nsqd, 3)
    raw = body.encode("utf-8")
    r = setoffset(nsqd, raw)
    want = "MISSING_POSITION" if not body else "E_INVALID"
    assert (r.status, r.json()) == (400, {"message": want}), body


@pytest.mark.parametrize("params,status,code", [
    ({"topic": None}, 400, "MISSING_ARG_TOPIC"),
    ({"topic": "a/b"}, 400, "INVALID_ARG_TOPIC"),
    ({"channel": None}, 400, "MISSING_ARG_CHANNEL"),
    ({"channel": "x y"}, 400, "INVALID_ARG_CHANNEL"),
    ({"topic": "nope"}, 404, "TOPIC_NOT_FOUND"),
    ({"channel": "nope"}, 404, "CHANNEL_NOT_FOUND"),
    ({"partition": "1"}, 400, "E_BAD_PARTITION"),
    ({"partition": "-1"}, 400, "E_BAD_PARTITION"),
    ({"partition": "x"}, 400, "E_BAD_PARTITION"),
    ({"partition": "99999999999999999999"}, 400, "E_BAD_PARTITION"),
])
def test_bad_arguments(nsqd: NsqdProcess, params: dict[str, Any], status: int,
                       code: str) -> None:
    seed(nsqd, 3)
    full = {"topic": "t", "channel": "c", **params}
    full = {k: v for k, v in full.items() if v is not None}
    r = http_api.request("POST", http_api._url(nsqd.http_address, "/channel/setoffset", full),
                         b"msgcount:1")
    assert (r.status, r.json()) == (status, {"message": code})
    # nothing was created
    names = [t["topic_name"] for t in http_api.stats(nsqd.http_address)["topics"]]
    assert "nope" not in names
    assert [c["channel_name"] for c in
            http_api.stats(nsqd.http_address, "t")["topics"][0]["channels"]] == ["c"]


def test_beyond_the_log_end_is_refused_and_changes_nothing(nsqd: NsqdProcess) -> None:
    seed(nsqd, 3)
    assert setoffset(nsqd, "msgcount:2").status == 200
    r = setoffset(nsqd, "msgcount:4")
    assert (r.status, r.json()) == (400, {"message": "OFFSET_OUT_OF_RANGE"})
    assert setoffset(nsqd, "msgcount:3").json()["offset"] == 3  # the end itself is fine
    assert setoffset(nsqd, "msgcount:1").status == 200
    assert setoffset(nsqd, "virtual_queue:281474976710655").status == 400
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(2)) == [b"m1", b"m2"]


def test_huge_body_is_refused(nsqd: NsqdProcess) -> None:
    seed(nsqd, 1)
    r = setoffset(nsqd, "msgcount:" + "0" * 5000)
    assert (r.status, r.json()) == (413, {"message": "BODY_TOO_BIG"})


def test_setoffset_before_retention_start_clamps(tmp_path: Path) -> None:
    async def main() -> None:
        node = NSQD(Options(data_path=str(tmp_path), max_bytes_per_file=2000))
        client = TestClient(TestServer(make_app(node), host="127.0.0.1"))
        await client.start_server()
        try:
            topic = node.get_topic("r")
            topic.get_channel("c")
            for i in range(20):
                await node.publish("r", [b"%04d" % i + b"x" * 200])
            start = topic.log.apply_retention(15)
            assert start > 0
            resp = await client.post("/channel/setoffset?topic=r&channel=c", data=b"msgcount:0")
            doc = await resp.json()
            assert doc["offset"] == start and doc["clamped"] is True
            assert topic.channels["c"].cursor.next_read == start
            # a time before the retention start lands on the start too
            resp = await client.post("/channel/setoffset?topic=r&channel=c", data=b"timestamp:1")
            assert (await resp.json())["offset"] == start
            # the removed messages are not found any more
            resp = await client.get("/message/get?topic=r&search_mode=count&search_pos=0")
            assert (resp.status, await resp.json()) == (404, {"message": "MESSAGE_NOT_FOUND"})
            resp = await client.get(f"/message/get?topic=r&search_mode=count&search_pos={start}")
            assert (await resp.json())["body"].startswith(f"{start:04d}")
        finally:
            await client.close()
            await node.stop()

    asyncio.run(main())


def test_time_seek_on_explicit_timestamps(tmp_path: Path) -> None:
    """A day of records, one per minute: each minute's seek lands on its first record."""
    async def main() -> None:
        node = NSQD(Options(data_path=str(tmp_path)))
        try:
            topic = node.get_topic("day")
            ch = topic.get_channel("c")
            t0 = 1_700_000_000
            for m in range(24 * 60):
                topic.log.append([b"a", b"b"], timestamp_ns=(t0 + 60 * m) * 1_000_000_000)
            topic.log.flush()
            for m in (0, 1, 59, 777, 24 * 60 - 1):
                res = ch.seek(v2.StartPosition("timestamp", t0 + 60 * m))
                assert res.offset == 2 * m
                res = ch.seek(v2.StartPosition("timestamp", t0 + 60 * m + 1))
                assert res.offset == 2 * (m + 1)
        finally:
            await node.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- message/get


def test_message_get_by_id_count_and_offset(nsqd: NsqdProcess) -> None:
    seed(nsqd, 5)
    with consumer(nsqd.tcp_address, "t", "c", rdy=5) as c:
        msgs = c.read_messages(5)
    mid = msgs[3].id.decode()
    r = msg_get(nsqd, search_mode="id", search_pos=mid)
    doc = r.json()
    assert r.status == 200
    assert doc == {"id": mid, "partition": 0, "offset": 3, "queue_cnt_index": 3,
                   "timestamp": msgs[3].timestamp_ns, "attempts": 1, "body": "m3",
                   "body_encoding": "utf-8", "headers": {}, "headers_base64": []}
    assert msg_get(nsqd, search_mode="id", search_pos=str(int(mid, 16))).json() == doc
    assert msg_get(nsqd, search_mode="id", search_pos=mid.upper()).json() == doc
    assert msg_get(nsqd, search_mode="id", search_pos=mid, partition="00").json() == doc
    assert msg_get(nsqd, search_mode="count", search_pos="3").json() == doc
    assert msg_get(nsqd, search_mode="virtual_offset", search_pos="3", partition="0").json() \
        == doc
    assert msg_get(nsqd, search_pos=mid).json() == doc  # id is the default mode
    raw = msg_get(nsqd, search_mode="count", search_pos="3", raw="1")
    assert raw.body == b"m3" and raw.headers["content-type"] == "application/octet-stream"
    assert raw.headers["x-nsqx-message-id"] == mid and raw.headers["x-nsqx-offset"] == "3"
    assert raw.headers["x-nsqx-timestamp"] == str(msgs[3].timestamp_ns)


def test_message_get_binary_body_and_headers(nsqd: NsqdProcess) -> None:
    blob = bytes(range(256))
    # /nsqx/pub with keys=1 stores a "key" header per message
    body = struct.pack(">I", 1) + struct.pack(">I", 3) + b"k\xffz" + struct.pack(">I", len(blob)) \
        + blob
    r = http_api.request("POST", http_api._url(nsqd.http_address, "/nsqx/pub",
                         {"topic": "t", "writer": "w", "batch": "1", "task": "0", "keys": "1"}),
                         body)
    assert r.status == 200, r.body
    doc = msg_get(nsqd, search_mode="count", search_pos="0").json()
    assert doc["body_encoding"] == "base64" and base64.b64decode(doc["body"]) == blob
    assert base64.b64decode(doc["headers"]["key"]) == b"k\xffz"
    assert doc["headers_base64"] == ["key"]
    assert doc["headers"]["nsqx-pub"] == "w:1:0#1"


@pytest.mark.parametrize("params,status,code", [
    ({"topic": None, "search_pos": "0"}, 400, "MISSING_ARG_TOPIC"),
    ({"topic": "a/b", "search_pos": "0"}, 400, "INVALID_ARG_TOPIC"),
    ({"search_mode": "count"}, 400, "MISSING_ARG_SEARCH_POS"),
    ({"search_mode": "bogus", "search_pos": "0"}, 400, "E_INVALID"),
    ({"search_mode": "id", "search_pos": "xyz"}, 400, "E_INVALID"),
    ({"search_mode": "id", "search_pos": "000000000000000g"}, 400, "E_INVALID"),
    ({"search_mode": "id", "search_pos": "-1"}, 400, "E_INVALID"),
    ({"search_mode": "id", "search_pos": "99999999999999999999999"}, 400, "E_INVALID"),
    ({"search_mode": "count", "search_pos": "-1"}, 400, "E_INVALID"),
    ({"search_mode": "count", "search_pos": "1.5"}, 400, "E_INVALID"),
    ({"search_mode": "count", "search_pos": "99999999999999999999999"}, 400, "E_INVALID"),
    ({"search_mode": "count", "search_pos": "0", "partition": "1"}, 400, "E_BAD_PARTITION"),
    ({"search_mode": "count", "search_pos": "0", "partition": "z"}, 400, "E_BAD_PARTITION"),
    ({"search_mode": "id", "search_pos": "0001000000000000"}, 400, "E_BAD_PARTITION"),
    ({"search_mode": "id", "search_pos": "0000000000000000", "partition": "1"}, 400,
     "E_BAD_PARTITION"),
    ({"search_mode": "count", "search_pos": "3"}, 404, "MESSAGE_NOT_FOUND"),
    ({"search_mode": "count", "search_pos": "99999999999"}, 404, "MESSAGE_NOT_FOUND"),
    ({"search_mode": "id", "search_pos": "00000000000000ff"}, 404, "MESSAGE_NOT_FOUND"),
    ({"topic": "nope", "search_pos": "0000000000000000"}, 404, "TOPIC_NOT_FOUND"),
])
def test_message_get_bad_input(nsqd: NsqdProcess, params: dict[str, Any], status: int,
                               code: str) -> None:
    seed(nsqd, 3)
    full = {"topic": "t", **params}
    full = {k: v for k, v in full.items() if v is not None}
    r = http_api.get(nsqd.http_address, "/message/get", **full)
    assert (r.status, r.json()) == (status, {"message": code})
    assert "nope" not in [t["topic_name"] for t in http_api.stats(nsqd.http_address)["topics"]]


# --------------------------------------------------------------------------- SUB_ADVANCED


def sub_adv(node: NsqdProcess, *args: Any, rdy: int = 10) -> RawClient:
    c = RawClient(node.tcp_address)
    c.send(v2.sub_advanced(*args))
    c.expect_ok()
    c.send(v2.rdy(rdy))
    return c


def test_sub_advanced_applies_the_start_for_the_first_client_only(nsqd: NsqdProcess) -> None:
    seed(nsqd, 6)
    with sub_adv(nsqd, "t", "c", 0, "msgcount:4") as first:
        assert bodies(first.read_messages(2)) == [b"m4", b"m5"]
        with sub_adv(nsqd, "t", "c", 0, "earliest") as second:
            # not the first client: the channel stays where it is
            assert http_api.mpub(nsqd.http_address, "t", [b"n"]).status == 200
            got = []
            for cl in (first, second):
                got += cl.drain_messages(0.5)
            assert bodies(got) == [b"n"]


def test_sub_advanced_without_a_position_is_sub(nsqd: NsqdProcess) -> None:
    seed(nsqd, 2)
    with sub_adv(nsqd, "t", "c", 0) as c:
        assert bodies(c.read_messages(2)) == [b"m0", b"m1"]
        # FIN works as for SUB
        c.expect_nothing(0.1)


def test_sub_advanced_new_channel_and_time(nsqd: NsqdProcess) -> None:
    assert http_api.mpub(nsqd.http_address, "t", [b"a", b"b"]).status == 200
    with sub_adv(nsqd, "t", "late", 0, "latest") as c:
        c.expect_nothing(0.3)
        assert http_api.mpub(nsqd.http_address, "t", [b"c"]).status == 200
        assert bodies(c.read_messages(1)) == [b"c"]
    with sub_adv(nsqd, "t", "replay", 0, "timestamp:0") as c:
        assert bodies(c.read_messages(3)) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("line,code", [
    (b"SUB_ADVANCED t c\n", "E_INVALID"),
    (b"SUB_ADVANCED t c 0 msgcount:1 extra\n", "E_INVALID"),
    (b"SUB_ADVANCED t c 0 msgcount:-1\n", "E_INVALID"),
    (b"SUB_ADVANCED t c 0 bogus\n", "E_INVALID"),
    (b"SUB_ADVANCED t c 0 timestamp:99999999999999999999\n", "E_INVALID"),
    (b"SUB_ADVANCED t c x\n", "E_BAD_PARTITION"),
    (b"SUB_ADVANCED t c -1\n", "E_BAD_PARTITION"),
    (b"SUB_ADVANCED t c 1\n", "E_BAD_PARTITION"),
    (b"SUB_ADVANCED t c 65536\n", "E_BAD_PARTITION"),
    (b"SUB_ADVANCED nope c 3\n", "E_BAD_PARTITION"),
    (b"SUB_ADVANCED t c 0 msgcount:4\n", "E_SUB_FAILED"),
    (b"SUB_ADVANCED b@d c 0\n", "E_BAD_TOPIC"),
    (b"SUB_ADVANCED t b@d 0\n", "E_BAD_CHANNEL"),
])
def test_sub_advanced_bad_input_is_fatal(nsqd: NsqdProcess, line: bytes, code: str) -> None:
    seed(nsqd, 3)
    with RawClient(nsqd.tcp_address) as c:
        c.send(line)
        c.expect_error(code, closed=True)
    # the channel did not move and no topic was created
    st = http_api.stats(nsqd.http_address)
    assert "nope" not in [t["topic_name"] for t in st["topics"]]
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(3)) == [b"m0", b"m1", b"m2"]


def test_sub_advanced_with_a_bad_position_creates_no_channel(nsqd: NsqdProcess) -> None:
    seed(nsqd, 3)
    with RawClient(nsqd.tcp_address) as c:
        c.send(v2.sub_advanced("t", "fresh", 0, "msgcount:9"))
        c.expect_error("E_SUB_FAILED", closed=True)
    chans = http_api.stats(nsqd.http_address, "t")["topics"][0]["channels"]
    assert [ch["channel_name"] for ch in chans] == ["c"]


def test_sub_advanced_twice_is_refused(nsqd: NsqdProcess) -> None:
    seed(nsqd, 1)
    with sub_adv(nsqd, "t", "c", 0) as c:
        c.send(v2.sub_advanced("t", "c", 0))
        # the message may arrive before the error
        while True:
            ftype, data = c.read_frame()
            if ftype == 1:
                assert data == b"E_INVALID cannot SUB_ADVANCED in current state"
                break
        c.expect_closed()


def test_deferred_messages_keep_their_delay_after_a_replay(nsqd: NsqdProcess) -> None:
    seed(nsqd, 5)
    assert http_api.pub(nsqd.http_address, "t", b"later", defer_ms=3_600_000).status == 200
    assert setoffset(nsqd, "msgcount:0").status == 200

    def channel() -> dict[str, Any]:
        return http_api.stats(nsqd.http_address, "t", "c")["topics"][0]["channels"][0]

    assert channel()["deferred_count"] == 1  # offset 5 is at/after 0: still deferred
    with consumer(nsqd.tcp_address, "t", "c", rdy=10) as c:
        assert bodies(c.read_messages(5)) == [b"m%d" % i for i in range(5)]
        c.expect_nothing(0.3)  # not the deferred one
    assert setoffset(nsqd, "latest").json()["offset"] == 6
    assert channel()["deferred_count"] == 0  # before the new position: dropped


# --------------------------------------------------------------------------- hostile HTTP

_valid = st.one_of(
    st.sampled_from([b"earliest", b"latest", b"special:-1", b"special:-2", b"timestamp:0"]),
    st.builds(lambda k, v: f"{k}:{v}".encode(),
              st.sampled_from(["msgcount", "virtual_queue", "offset", "timestamp"]),
              st.integers(0, 10)))
_bodies = st.one_of(
    _valid, _valid, _valid,
    st.sampled_from([b"", b"msgcount:-1", b"x:1", b"virtual_queue:99"]),
    st.builds(lambda k, v: f"{k}:{v}".encode(),
              st.sampled_from(["timestamp", "msgcount", "virtual_queue", "offset", "special"]),
              st.integers(-(2**70), 2**70)),
    st.binary(max_size=40))
_qvalue = st.one_of(st.sampled_from(["t", "c", "0", "1", "-1", "", "%zz", "a/b", "nope",
                                     "0000000000000002", "id", "count", "virtual_offset"]),
                    st.text(max_size=12))
_queries = st.dictionaries(st.sampled_from(["topic", "channel", "partition", "to",
                                            "search_mode", "search_pos", "raw"]),
                           _qvalue, max_size=2)
_requests = st.lists(st.tuples(st.sampled_from(["setoffset", "get"]), _queries, _bodies),
                     min_size=5, max_size=30)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reqs=_requests)
def test_hostile_requests_get_codes_and_never_corrupt_the_cursor(tmp_path_factory, reqs) -> None:
    from urllib.parse import quote

    async def main() -> None:
        node = NSQD(Options(data_path=str(tmp_path_factory.mktemp("fz"))))
        client = TestClient(TestServer(make_app(node), host="127.0.0.1"))
        await client.start_server()
        try:
            topic = node.get_topic("t")
            ch = topic.get_channel("c")
            await node.publish("t", [b"m%d" % i for i in range(8)])
            moved = 0
            for kind, q, body in reqs:
                q = {"topic": "t", "channel": "c", **q}
                qs = "&".join(f"{k}={quote(v, safe='%')}" for k, v in q.items())
                if kind == "setoffset":
                    resp = await client.post(f"/channel/setoffset?{qs}", data=body)
                else:
                    resp = await client.get(f"/message/get?{qs}")
                data = await resp.read()
                assert resp.status in (200, 400, 404, 413), (resp.status, data)
                if resp.status != 200:
                    assert set(json.loads(data)) == {"message"}
                if kind == "setoffset" and resp.status == 200:
                    moved += 1
                    assert json.loads(data)["offset"] == ch.cursor.confirmed
                c = ch.cursor
                assert topic.log.start_offset <= c.confirmed <= c.next_read
                assert c.confirmed <= topic.log.next_offset
            note(f"{moved} resets applied")
            # what is on disk is what is in memory
            ch.cursor.persist()
            from nsqx.storage.cursor import ChannelCursor

            again = ChannelCursor(0, state_path=ch.cursor.state_path)
            assert again.confirmed == ch.cursor.confirmed
            again.close()
        finally:
            await client.close()
            await node.stop()

    asyncio.run(main())


def test_message_get_needs_subscribe_permission(nsqd_factory, auth_server) -> None:  # type: ignore[no-untyped-def]
    from tests.support.auth_server import Identity, grant

    auth_server.identities["reader"] = Identity("r", [grant("t", (".*",), ("subscribe",))])
    auth_server.identities["writer"] = Identity("w", [grant("t", (".*",), ("publish",))])
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    assert http_api.mpub(node.http_address, "t", [b"secret"]).status == 200

    def get(secret: str | None) -> Response:
        return http_api.with_secret(node.http_address, "GET", "/message/get",
                                    {"topic": "t", "search_mode": "count", "search_pos": "0"},
                                    secret=secret)

    assert (get(None).status, get(None).json()) == (401, {"message": "AUTH_REQUIRED"})
    assert (get("writer").status, get("writer").json()) == (403, {"message": "UNAUTHORIZED"})
    r = get("reader")
    assert r.status == 200 and r.json()["body"] == "secret"
    # setoffset moves a channel: publish on the topic with the channel matching (issue 23;
    # every operator endpoint is covered in test_operator_auth.py)
    assert setoffset(node, "earliest").status == 401
    auth_server.identities["operator"] = Identity("o", [grant("t", ("c",),
                                                              ("subscribe", "publish"))])
    q = {"topic": "t", "channel": "c"}
    for path, body in (("/channel/create", b""), ("/channel/setoffset", b"earliest")):
        r = http_api.with_secret(node.http_address, "POST", path, q, body, "operator")
        assert r.status == 200, (path, r.body)
