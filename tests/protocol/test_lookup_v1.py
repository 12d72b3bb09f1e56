import json
import struct

import pytest

from nsqx.protocol import lookup_v1 as lk
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.lookup_v1 import LookupCommand, LookupCommandParser, ResponseReader


def test_client_encoders():
    assert lk.MAGIC_V1 == b"  V1"
    assert lk.register("t") == b"REGISTER t\n"
    assert lk.register("t", "c") == b"REGISTER t c\n"
    assert lk.register("t", "") == b"REGISTER t\n"
    assert lk.unregister(b"t", b"c") == b"UNREGISTER t c\n"
    assert lk.unregister("t") == b"UNREGISTER t\n"
    assert lk.ping() == b"PING\n"
    raw = lk.identify({"version": "1.3.0", "tcp_port": 4150})
    assert raw.startswith(b"IDENTIFY\n")
    assert struct.unpack(">I", raw[9:13])[0] == len(raw) - 13


def test_parser_round_trip_and_chunking():
    info = {"version": "1.3.0", "tcp_port": 4150, "http_port": 4151, "hostname": "h",
            "broadcast_address": "b", "topology_zone": "", "topology_region": ""}
    stream = lk.identify(info) + lk.register("t", "c") + lk.unregister("t") + lk.ping()
    want = [
        LookupCommand(b"IDENTIFY", [], json.dumps(info, separators=(",", ":")).encode()),
        LookupCommand(b"REGISTER", [b"t", b"c"]),
        LookupCommand(b"UNREGISTER", [b"t"]),
        LookupCommand(b"PING", []),
    ]
    assert LookupCommandParser().feed(stream) == want
    p = LookupCommandParser()
    got = []
    for i in range(len(stream)):
        got += p.feed(stream[i : i + 1])
    assert got == want and p.buffered == 0


def test_parser_trims_whitespace():
    assert LookupCommandParser().feed(b"  PING \r\n") == [LookupCommand(b"PING", [])]


def test_parser_errors():
    with pytest.raises(ProtocolError) as ei:
        LookupCommandParser().feed(b"PING\nNOPE x\n")
    assert ei.value.payload == b"E_INVALID invalid command NOPE"
    assert ei.value.commands == [LookupCommand(b"PING", [])]
    with pytest.raises(ProtocolError) as ei:
        LookupCommandParser(max_body_size=100).feed(b"IDENTIFY\n" + struct.pack(">i", 101))
    assert ei.value.code == "E_BAD_BODY"
    with pytest.raises(ProtocolError):
        LookupCommandParser().feed(b"IDENTIFY\n" + struct.pack(">i", -1))
    with pytest.raises(ProtocolError):
        LookupCommandParser(max_line=10).feed(b"REGISTER aaaaaaaa")

    def pre(name, params):
        raise lk.cannot_identify_again()

    with pytest.raises(ProtocolError) as ei:
        LookupCommandParser(precheck=pre).feed(b"IDENTIFY\n")
    assert ei.value.payload == b"E_INVALID cannot IDENTIFY again"


def test_topic_channel_helper():
    assert lk.parse_topic_channel("REGISTER", [b"t"]) == ("t", None)
    assert lk.parse_topic_channel("REGISTER", [b"t", b"c#ephemeral"]) == ("t", "c#ephemeral")
    assert lk.parse_topic_channel("REGISTER", [b"t", b""]) == ("t", None)
    cases = [
        ([], "E_INVALID REGISTER insufficient number of params"),
        ([b"t!"], "E_BAD_TOPIC REGISTER topic name 't!' is not valid"),
        ([b"t", b"c!"], "E_BAD_CHANNEL REGISTER channel name 'c!' is not valid"),
    ]
    for params, payload in cases:
        with pytest.raises(ProtocolError) as ei:
            lk.parse_topic_channel("REGISTER", params)
        assert ei.value.payload.decode() == payload and ei.value.fatal
    assert lk.must_identify().payload == b"E_INVALID client must IDENTIFY"


def test_identify_body():
    body = b'{"version":"1.3.0","tcp_port":4150,"http_port":4151,"hostname":"h","broadcast_address":"b"}'
    info = lk.parse_identify(body, "127.0.0.1:5555")
    assert (info.broadcast_address, info.tcp_port, info.http_port, info.version) == ("b", 4150, 4151, "1.3.0")
    assert info.remote_address == "127.0.0.1:5555"
    with pytest.raises(ProtocolError) as ei:
        lk.parse_identify(b'{"version":"1.3.0","tcp_port":4150}', "x")
    assert ei.value.payload == b"E_BAD_BODY IDENTIFY missing fields"
    for bad in (b"", b"{", b'{"tcp_port":"4150"}'):
        with pytest.raises(ProtocolError) as ei:
            lk.parse_identify(bad, "x")
        assert ei.value.payload == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_responses():
    assert lk.encode_response(b"OK") == b"\x00\x00\x00\x02OK"
    assert lk.OK_RESPONSE == b"\x00\x00\x00\x02OK"
    assert lk.encode_error(lk.must_identify()) == lk.encode_response(b"E_INVALID client must IDENTIFY")
    resp = lk.identify_response(tcp_port=4160, http_port=4161, version="1.3.0",
                                broadcast_address="host", hostname="host")
    assert resp == (b'{"broadcast_address":"host","hostname":"host","http_port":4161,'
                    b'"tcp_port":4160,"version":"1.3.0"}')
    r = ResponseReader()
    stream = lk.encode_response(b"OK") + lk.encode_response(resp) + lk.encode_response(b"")
    got = []
    for i in range(len(stream)):
        got += r.feed(stream[i : i + 1])
    assert got == [b"OK", resp, b""]
    with pytest.raises(ProtocolError):
        ResponseReader(max_size=10).feed(struct.pack(">i", 11))
