import json
import struct

import pytest

from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.v2 import (
    Command,
    CommandParser,
    IdentifyLimits,
    base10,
    identify_response,
    parse_dpub_timeout,
    parse_fin,
    parse_identify,
    parse_rdy,
    parse_req,
    parse_sub,
    parse_touch,
    validate_message_id,
)

ID = b"0123456789abcdef"


def raises(fn, *a):
    with pytest.raises(ProtocolError) as ei:
        fn(*a)
    return ei.value.code, ei.value.text, ei.value.fatal


def test_base10_like_go():
    assert base10(b"") == 0
    assert base10(b"0042") == 42
    assert base10(b"-1") is None and base10(b"+1") is None and base10(b"1_0") is None
    assert base10(b" 1") is None and base10("٣".encode()) is None
    assert base10(b"18446744073709551617") == 1  # uint64 wrap


def test_parse_rdy():
    assert parse_rdy([], 2500) == 1
    assert parse_rdy([b"0"], 2500) == 0
    assert parse_rdy([b"2500"], 2500) == 2500
    assert parse_rdy([b""], 2500) == 0
    assert raises(parse_rdy, [b"2501"], 2500) == ("E_INVALID", "RDY count 2501 out of range 0-2500", True)
    assert raises(parse_rdy, [b"x"], 2500) == ("E_INVALID", "RDY could not parse count x", True)
    assert raises(parse_rdy, [b"-1"], 2500)[1] == "RDY could not parse count -1"
    # int64 conversion of a wrapped uint64, as upstream prints it
    assert raises(parse_rdy, [b"18446744073709551615"], 2500)[1] == "RDY count -1 out of range 0-2500"


def test_parse_fin_touch_and_ids():
    assert parse_fin([ID]) == ID
    assert parse_fin([ID, b"extra"]) == ID
    assert raises(parse_fin, []) == ("E_INVALID", "FIN insufficient number of params", True)
    assert raises(parse_fin, [b"short"]) == ("E_INVALID", "invalid message ID", True)
    assert parse_touch([ID]) == ID
    assert raises(parse_touch, []) == ("E_INVALID", "TOUCH insufficient number of params", True)
    assert raises(parse_touch, [ID + b"0"])[1] == "invalid message ID"
    assert validate_message_id(ID) == ID


def test_parse_req_clamps():
    assert parse_req([ID, b"100"], 3600000) == (ID, 100)
    assert parse_req([ID, b"0"], 3600000) == (ID, 0)
    assert parse_req([ID, b"99999999"], 3600000) == (ID, 3600000)
    assert parse_req([ID, b""], 3600000) == (ID, 0)
    assert parse_req([ID, b"18446744073709551615"], 3600000) == (ID, 0)  # wraps negative -> 0
    assert raises(parse_req, [ID], 1) == ("E_INVALID", "REQ insufficient number of params", True)
    assert raises(parse_req, [b"x", b"1"], 1)[1] == "invalid message ID"
    assert raises(parse_req, [ID, b"1.5"], 1) == ("E_INVALID", "REQ could not parse timeout 1.5", True)


def test_parse_dpub_timeout():
    assert parse_dpub_timeout([b"t", b"3600000"], 3600000) == 3600000
    assert parse_dpub_timeout([b"t", b"0"], 3600000) == 0
    assert raises(parse_dpub_timeout, [b"t", b"3600001"], 3600000) == (
        "E_INVALID", "DPUB timeout 3600001 out of range 0-3600000", True)
    # upstream prints the unsigned value it parsed
    assert raises(parse_dpub_timeout, [b"t", b"18446744073709551615"], 3600000)[1] == (
        "DPUB timeout 18446744073709551615 out of range 0-3600000")
    assert raises(parse_dpub_timeout, [b"t"], 1)[1] == "DPUB insufficient number of parameters"
    assert raises(parse_dpub_timeout, [b"t", b"x"], 1)[1] == "DPUB could not parse timeout x"


def test_parse_sub():
    assert parse_sub([b"t", b"c#ephemeral"]) == ("t", "c#ephemeral")
    assert raises(parse_sub, [b"t"]) == ("E_INVALID", "SUB insufficient number of parameters", True)
    assert raises(parse_sub, [b"t!", b"c"]) == ("E_BAD_TOPIC", 'SUB topic name "t!" is not valid', True)
    assert raises(parse_sub, [b"t", b""]) == ("E_BAD_CHANNEL", 'SUB channel name "" is not valid', True)


def test_state_and_failure_errors():
    e = v2.cannot_in_state("SUB")
    assert e.payload == b"E_INVALID cannot SUB in current state" and e.fatal
    assert v2.tls_required(b"PUB").payload == b"E_INVALID cannot PUB in current state (TLS required)"
    e = v2.fin_failed(ID, "ID not in flight")
    assert e.payload == b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight" and not e.fatal
    assert not v2.req_failed(ID, "x").fatal and v2.req_failed(ID, "x").code == "E_REQ_FAILED"
    assert v2.touch_failed(ID, "client does not own message").payload == (
        b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed client does not own message")


# ------------------------------------------------------------------ IDENTIFY


def ident(d, **lim):
    return parse_identify(json.dumps(d).encode(), IdentifyLimits(**lim))


def test_identify_defaults_and_unknown_keys():
    s = ident({"short_id": "x", "long_id": "y", "client_id": "c", "hostname": "h",
               "user_agent": "pynsq/0.9.1", "feature_negotiation": True})
    assert (s.client_id, s.hostname, s.user_agent) == ("c", "h", "pynsq/0.9.1")
    assert s.heartbeat_interval_ms == 30000
    assert s.output_buffer_size == 16384 and s.output_buffer_timeout_ms == 250
    assert s.msg_timeout_ms == 60000 and s.sample_rate == 0
    assert s.feature_negotiation and not (s.tls_v1 or s.snappy or s.deflate)
    assert s.deflate_level == 6


def test_identify_values():
    s = ident({"heartbeat_interval": 1000, "output_buffer_size": 64, "output_buffer_timeout": 25,
               "msg_timeout": 900000, "sample_rate": 99})
    assert (s.heartbeat_interval_ms, s.output_buffer_size, s.output_buffer_timeout_ms,
            s.msg_timeout_ms, s.sample_rate) == (1000, 64, 25, 900000, 99)
    s = ident({"heartbeat_interval": -1, "output_buffer_timeout": -1})
    assert s.heartbeat_interval_ms == 0 and s.output_buffer_timeout_ms == 0
    s = ident({"output_buffer_size": -1, "output_buffer_timeout": 100})
    assert s.output_buffer_size == 1 and s.output_buffer_timeout_ms == 0


@pytest.mark.parametrize(
    "d, text",
    [
        ({"heartbeat_interval": 999}, "IDENTIFY heartbeat interval (999) is invalid"),
        ({"heartbeat_interval": 60001}, "IDENTIFY heartbeat interval (60001) is invalid"),
        ({"heartbeat_interval": -2}, "IDENTIFY heartbeat interval (-2) is invalid"),
        ({"output_buffer_timeout": 24}, "IDENTIFY output buffer timeout (24) is invalid"),
        ({"output_buffer_timeout": 30001}, "IDENTIFY output buffer timeout (30001) is invalid"),
        ({"output_buffer_size": 63}, "IDENTIFY output buffer size (63) is invalid"),
        ({"output_buffer_size": 65537}, "IDENTIFY output buffer size (65537) is invalid"),
        ({"sample_rate": 100}, "IDENTIFY sample rate (100) is invalid"),
        ({"sample_rate": -1}, "IDENTIFY sample rate (-1) is invalid"),
        ({"msg_timeout": 999}, "IDENTIFY msg timeout (999) is invalid"),
        ({"msg_timeout": 900001}, "IDENTIFY msg timeout (900001) is invalid"),
        # upstream order: heartbeat before output buffer before sample rate before msg timeout
        ({"msg_timeout": 1, "sample_rate": 200, "heartbeat_interval": 5},
         "IDENTIFY heartbeat interval (5) is invalid"),
        ({"output_buffer_size": 1, "output_buffer_timeout": 1},
         "IDENTIFY output buffer timeout (1) is invalid"),
    ],
)
def test_identify_field_errors(d, text):
    with pytest.raises(ProtocolError) as ei:
        ident(d)
    assert (ei.value.code, ei.value.text, ei.value.fatal) == ("E_BAD_BODY", text, True)


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b"1", b'"x"', b'{"heartbeat_interval": "1000"}', b'{"heartbeat_interval": 1000.0}',
     b'{"heartbeat_interval": 1e3}', b'{"snappy": 1}', b'{"client_id": 5}', b'{"a": NaN}',
     b'{"sample_rate": 4294967296}', b'{"msg_timeout": 99999999999999999999}', b"\xef\xbb\xbf{}"],
)
def test_identify_bad_json(body):
    with pytest.raises(ProtocolError) as ei:
        parse_identify(body)
    assert ei.value.payload == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_identify_go_json_quirks():
    assert parse_identify(b"null").heartbeat_interval_ms == 30000  # Go: null -> defaults
    s = parse_identify(b'{"Heartbeat_Interval": 2000, "heartbeat_interval": null, "CLIENT_ID": "x"}')
    assert s.heartbeat_interval_ms == 2000 and s.client_id == "x"
    s = parse_identify(b'{"msg_timeout": 5000, "msg_timeout": 6000}')
    assert s.msg_timeout_ms == 6000
    assert parse_identify(b'{"hostname": "a\xffb"}').hostname == "a\ufffdb"


def test_identify_negotiation():
    s = ident({"feature_negotiation": True, "snappy": True})
    assert s.snappy and not s.deflate
    s = ident({"feature_negotiation": True, "deflate": True, "deflate_level": 9})
    assert s.deflate and s.deflate_level == 6  # clamped to --max-deflate-level
    s = ident({"feature_negotiation": True, "deflate": True, "deflate_level": 3})
    assert s.deflate_level == 3
    s = ident({"feature_negotiation": True, "deflate": True, "deflate_level": 9}, max_deflate_level=9)
    assert s.deflate_level == 9
    s = ident({"feature_negotiation": True, "tls_v1": True})
    assert not s.tls_v1
    s = ident({"feature_negotiation": True, "tls_v1": True}, tls_available=True)
    assert s.tls_v1
    s = ident({"feature_negotiation": False, "tls_v1": True, "snappy": True, "deflate": True},
              tls_available=True)
    assert not (s.tls_v1 or s.snappy or s.deflate)
    # disabled on the server -> not an error even if both asked
    s = ident({"feature_negotiation": True, "snappy": True, "deflate": True}, snappy_enabled=False)
    assert s.deflate and not s.snappy
    with pytest.raises(ProtocolError) as ei:
        ident({"feature_negotiation": True, "snappy": True, "deflate": True})
    assert ei.value.payload == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    assert ei.value.fatal


def test_identify_response_shape():
    s = ident({"feature_negotiation": True})
    raw = identify_response(s, max_rdy_count=2500, version="1.3.0", max_msg_timeout_ms=900000,
                            max_deflate_level=6, auth_required=False)
    d = json.loads(raw)
    assert list(d) == ["max_rdy_count", "version", "max_msg_timeout", "msg_timeout", "tls_v1",
                       "deflate", "deflate_level", "max_deflate_level", "snappy", "sample_rate",
                       "auth_required", "output_buffer_size", "output_buffer_timeout",
                       "topology_region", "topology_zone"]
    assert d["max_rdy_count"] == 2500 and d["msg_timeout"] == 60000 and d["version"] == "1.3.0"
    assert raw.startswith(b'{"max_rdy_count":2500,"version":"1.3.0"')
    a = v2.auth_response("me", "http://x/<a>", 2)
    assert a == b'{"identity":"me","identity_url":"http://x/\\u003ca\\u003e","permission_count":2}'


# ------------------------------------------------------------------ encoders -> parser


def test_client_encoders_exact_bytes():
    assert v2.sub("t", "c") == b"SUB t c\n"
    assert v2.rdy(100) == b"RDY 100\n"
    assert v2.fin(ID) == b"FIN " + ID + b"\n"
    assert v2.req(ID, 90000) == b"REQ " + ID + b" 90000\n"
    assert v2.touch(ID) == b"TOUCH " + ID + b"\n"
    assert v2.cls() == b"CLS\n" and v2.nop() == b"NOP\n"
    assert v2.pub("t", b"ab") == b"PUB t\n\x00\x00\x00\x02ab"
    assert v2.dpub("t", 5, b"a") == b"DPUB t 5\n\x00\x00\x00\x01a"
    assert v2.mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n" + struct.pack(">IIIsI2s", 15, 2, 1, b"a", 2, b"bc"))
    assert v2.auth("s") == b"AUTH\n\x00\x00\x00\x01s"
    assert v2.identify({"a": 1}) == b'IDENTIFY\n\x00\x00\x00\x07{"a":1}'
    assert v2.MAGIC_V2 == b"  V2"


def test_encoders_round_trip_through_parser():
    stream = b"".join([
        v2.identify({"feature_negotiation": True}), v2.auth(b"secret"), v2.sub("t", "c"), v2.rdy(3),
        v2.fin(ID), v2.req(ID, 10), v2.touch(ID), v2.pub("t", b"x" * 10), v2.mpub("t", [b"a", b"b"]),
        v2.dpub("t", 100, b"d"), v2.nop(), v2.cls(),
    ])
    p = CommandParser()
    out = []
    chunk = p.feed(stream)
    while chunk:
        out += chunk
        chunk = p.feed(b"")
    assert out == [
        Command(b"IDENTIFY", [], b'{"feature_negotiation":true}'),
        Command(b"AUTH", [], b"secret"),
        Command(b"SUB", [b"t", b"c"]),
        Command(b"RDY", [b"3"]),
        Command(b"FIN", [ID]),
        Command(b"REQ", [ID, b"10"]),
        Command(b"TOUCH", [ID]),
        Command(b"PUB", [b"t"], b"x" * 10),
        Command(b"MPUB", [b"t"], None, [b"a", b"b"]),
        Command(b"DPUB", [b"t", b"100"], b"d"),
        Command(b"NOP", []),
        Command(b"CLS", []),
    ]
