"""Youzan's headers and trace ids on the wire: PUB_EXT/MPUB_EXT/PUB_TRACE/MPUB_TRACE bodies,
the traced response, the ext message frame and the IDENTIFY fields (sans-IO)."""

from __future__ import annotations

import pytest

from nsqx.protocol import frames, v2
from nsqx.protocol.errors import ProtocolError


def test_parser_takes_the_four_commands_whatever_the_chunking() -> None:
    stream = (v2.pub_ext("t", b"body", {"a": "b"}) + v2.mpub_trace("t", [(5, b"x"), (6, b"yy")])
              + v2.pub_trace("t", 7, b"z", partition=2) + v2.mpub_ext("t", [(None, b"q"), ({"k": "v"}, b"r")]))
    whole = v2.CommandParser().feed(stream)
    for step in (1, 3, 7):
        p = v2.CommandParser()
        got = []
        for i in range(0, len(stream), step):
            got += p.feed(stream[i:i + step])
        assert got == whole
    assert [c.name for c in whole] == [b"PUB_EXT", b"MPUB_TRACE", b"PUB_TRACE", b"MPUB_EXT"]
    assert v2.split_ext(whole[0].body) == ({"a": b"b"}, b"body")
    assert [v2.split_trace(b) for b in whole[1].bodies] == [(5, b"x"), (6, b"yy")]
    assert whole[2].params == [b"t", b"2"]
    assert [v2.split_ext(b) for b in whole[3].bodies] == [(None, b"q"), ({"k": b"v"}, b"r")]


def test_sizes_are_checked_before_the_body_is_buffered() -> None:
    p = v2.CommandParser(max_msg_size=10, max_body_size=20)
    with pytest.raises(ProtocolError) as e:
        p.feed(b"PUB_EXT t\n\x00\x00\x00\x0b")
    assert (e.value.code, e.value.text) == ("E_BAD_MESSAGE", "PUB_EXT message too big 11 > 10")
    with pytest.raises(ProtocolError) as e:
        v2.CommandParser(max_body_size=20).feed(b"MPUB_TRACE t\n\x00\x00\x00\x15")
    assert (e.value.code, e.value.text) == ("E_BAD_BODY", "MPUB_TRACE body too big 21 > 20")
    with pytest.raises(ProtocolError) as e:
        v2.CommandParser().feed(b"MPUB_EXT bad!\n")
    assert e.value.code == "E_BAD_TOPIC"


@pytest.mark.parametrize("raw,code", [
    (b"{", "E_INVALID_JSON_HEADER"),
    (b"1", "E_INVALID_JSON_HEADER"),
    (b'{"a":true}', "E_INVALID_JSON_HEADER"),
    (b'{"a":"\\ud800"}', "E_INVALID_JSON_HEADER"),
    (b'{"a":"' + b"x" * 65530 + b'"}', "E_INVALID_JSON_HEADER"),  # 65537 bytes: too long
    (b'{"##trace_id":"-1"}', "INVALID_TRACE_ID"),
    (b'{"##trace_id":null}', "INVALID_TRACE_ID"),
    (b'{"##client_dispatch_tag":""}', "E_BAD_TAG"),
])
def test_bad_headers_are_non_fatal(raw: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as e:
        v2.parse_ext_json(raw)
    assert e.value.code == code and not e.value.fatal


def test_good_headers() -> None:
    assert v2.parse_ext_json(b'{"a":"\\u00e9","##trace_id":"0018","##client_dispatch_tag":"b-1_X"}') == {
        "a": "é".encode(), "##trace_id": b"0018", "##client_dispatch_tag": b"b-1_X"}
    assert v2.parse_ext_json(b"{}") == {}
    assert v2.split_ext(b"\x00\x02{}x") == (None, b"x")  # an empty object is no header
    assert v2.ext_json({"a": b"\xc3\xa9", "b": "c"}) == '{"a":"é","b":"c"}'.encode()


def test_traced_response_layout() -> None:
    data = v2.traced_response((3 << 48) | 9, 2**64 - 1, 9, 36)
    assert len(data) == 30 and data[:2] == b"OK"
    assert data[2:10] == ((3 << 48) | 9).to_bytes(8, "big")
    assert data[10:18] == b"\xff" * 8 and data[18:26] == (9).to_bytes(8, "big")
    assert data[26:] == (36).to_bytes(4, "big")
    assert v2.parse_traced_response(data) == ((3 << 48) | 9, 2**64 - 1, 9, 36)
    with pytest.raises(ValueError):
        v2.parse_traced_response(b"OK")


def test_ext_frame_layout() -> None:
    stored = frames.build_message_frame(b"hello", b"0000000000000007", 123, 1)
    plain = frames.FrameReader().feed(frames.patch_attempts(stored, 3))[0][1]
    ext = frames.FrameReader().feed(frames.ext_message_frame(frames.patch_attempts(stored, 3),
                                                             b'{"a":"b"}'))[0][1]
    assert ext[:26] == plain[:26]  # ts, attempts, id unchanged
    assert ext[26:29] == b"\x04\x00\x09" and ext[29:38] == b'{"a":"b"}' and ext[38:] == b"hello"
    none = frames.FrameReader().feed(frames.ext_message_frame(stored, b""))[0][1]
    assert none[26:] == b"\x00hello"
    assert frames.decode_ext_message(none) == (123, 1, b"0000000000000007", 0, b"", b"hello")


def test_identify_fields() -> None:
    st = v2.parse_identify(b'{"desired_tag":"blue","extend_support":true}')
    assert (st.desired_tag, st.extend_support) == ("blue", True)
    resp = v2.identify_response(st, max_rdy_count=1, version="x", max_msg_timeout_ms=1,
                                max_deflate_level=6, auth_required=False)
    assert resp.endswith(b',"desired_tag":"blue"}')
    plain = v2.parse_identify(b"{}")
    assert (plain.desired_tag, plain.extend_support) == ("", False)
    assert b"desired_tag" not in v2.identify_response(
        plain, max_rdy_count=1, version="x", max_msg_timeout_ms=1, max_deflate_level=6,
        auth_required=False)
    for body in (b'{"desired_tag":"a b"}', b'{"desired_tag":1}', b'{"extend_support":"y"}'):
        with pytest.raises(ProtocolError) as e:
            v2.parse_identify(body)
        assert e.value.code == "E_BAD_BODY" and e.value.fatal
