"""Stock Python NSQ clients' own encoders/decoders against ours (pynsq, gnsq, python-snappy)."""

import json
import zlib

import pytest

from nsqx.protocol import frames, v2
from nsqx.protocol.compress import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder
from nsqx.protocol.v2 import Command, CommandParser

pynsq = pytest.importorskip("nsq.protocol")
gnsq = pytest.importorskip("gnsq.protocol")
snappy = pytest.importorskip("snappy")

ID = b"0123456789abcdef"


def parse_all(data):
    p = CommandParser()
    out = []
    got = p.feed(data)
    while got:
        out += got
        got = p.feed(b"")
    return out


def test_pynsq_commands():
    stream = b"".join([
        pynsq.identify({"short_id": "a", "feature_negotiation": True}),
        pynsq.auth(b"secret"),
        pynsq.subscribe("t", "c"),
        pynsq.ready(100),
        pynsq.finish(ID),
        pynsq.requeue(ID, 90000),
        pynsq.touch(ID),
        pynsq.nop(),
        pynsq.pub("t", b"hello"),
        pynsq.mpub("t", [b"a", b"bc", b"def"]),
        pynsq.dpub("t", 1000, b"later"),
    ])
    out = parse_all(stream)
    assert [c.name for c in out] == [b"IDENTIFY", b"AUTH", b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH",
                                     b"NOP", b"PUB", b"MPUB", b"DPUB"]
    ident = v2.parse_identify(out[0].body)
    assert ident.feature_negotiation
    assert out[2].params == [b"t", b"c"] and v2.parse_rdy(out[3].params, 2500) == 100
    assert v2.parse_req(out[5].params, 3600000) == (ID, 90000)
    assert out[9].bodies == [b"a", b"bc", b"def"]
    assert v2.parse_dpub_timeout(out[10].params, 3600000) == 1000


def test_gnsq_commands():
    stream = b"".join([
        gnsq.identify({"hostname": "h"}),
        gnsq.subscribe("t", "c"),
        gnsq.ready(5),
        gnsq.finish(ID),
        gnsq.requeue(ID, 0),
        gnsq.touch(ID),
        gnsq.close(),
        gnsq.nop(),
        gnsq.publish("t", b"x"),
        gnsq.multipublish("t", [b"a", b"b"]),
        gnsq.deferpublish("t", b"y", 5),
    ])
    out = parse_all(stream)
    assert [c.name for c in out] == [b"IDENTIFY", b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS",
                                     b"NOP", b"PUB", b"MPUB", b"DPUB"]
    assert out[8] == Command(b"PUB", [b"t"], b"x")
    assert out[9].bodies == [b"a", b"b"]
    assert out[10] == Command(b"DPUB", [b"t", b"5"], b"y")


def test_our_frames_decode_in_pynsq_and_gnsq():
    frame = frames.build_message_frames([b"body"], ID, 1234567890, 3)
    size, ftype = pynsq.struct_l.unpack(frame[:4])[0], pynsq.struct_l.unpack(frame[4:8])[0]
    assert size == len(frame) - 4 and ftype == pynsq.FRAME_TYPE_MESSAGE
    m = pynsq.decode_message(frame[8:])
    assert (m.id, m.body, m.timestamp, m.attempts) == (ID, b"body", 1234567890, 3)
    assert gnsq.unpack_message(frame[8:]) == (1234567890, 3, ID, b"body")
    assert pynsq.unpack_response(frames.OK_FRAME[4:]) == (0, b"OK")
    assert gnsq.unpack_response(frames.HEARTBEAT_FRAME[4:]) == (0, b"_heartbeat_")
    resp = v2.identify_response(v2.parse_identify(b"{}"), max_rdy_count=2500, version="1.3.0",
                                max_msg_timeout_ms=900000, max_deflate_level=6, auth_required=False)
    assert json.loads(resp)["max_rdy_count"] == 2500


def test_python_snappy_interop():
    # pynsq encodes every write with a fresh StreamCompressor: repeated stream identifiers
    writes = [b"NOP\n", b"PUB t\n\x00\x00\x00\x05hello", b"x" * 100000]
    stream = b"".join(snappy.StreamCompressor().compress(w) for w in writes)
    dec = SnappyDecoder()
    got = b""
    for i in range(0, len(stream), 7):
        got += dec.decode(stream[i : i + 7])
        while dec.pending:
            got += dec.decode(b"")
    assert got == b"".join(writes)
    # our server-side stream is read by pynsq's StreamDecompressor
    enc = SnappyEncoder()
    d = snappy.StreamDecompressor()
    out = b""
    for w in writes:
        out += d.decompress(enc.encode(w))
    assert out == b"".join(writes)


def test_deflate_interop_with_zlib_raw():
    enc = DeflateEncoder(6)
    d = zlib.decompressobj(-zlib.MAX_WBITS)  # pynsq's DeflateSocket
    assert d.decompress(enc.encode(frames.OK_FRAME)) == frames.OK_FRAME
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)  # pynsq's DeflateEncoder
    data = c.compress(b"NOP\n") + c.flush(zlib.Z_SYNC_FLUSH)
    assert DeflateDecoder().decode(data) == b"NOP\n"
