import os
import struct
import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.protocol.compress import (
    MAX_CHUNK_LEN,
    STREAM_IDENTIFIER,
    CompressionError,
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
    crc32c,
    masked_crc32c,
)
from nsqx.protocol.errors import ProtocolError


def chunked(data, cuts):
    prev = 0
    for c in sorted(cuts):
        yield data[prev:c]
        prev = c
    yield data[prev:]


def drain(dec, pieces):
    out = []
    for piece in pieces:
        out.append(dec.decode(piece))
        while dec.pending:
            out.append(dec.decode(b""))
    return b"".join(out)


def chunk(ctype, payload):
    return bytes([ctype]) + len(payload).to_bytes(3, "little") + payload


def test_crc32c_vectors():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"\x00" * 32) == 0x8A9136AA
    # masked CRC as cramjam (Rust snap) writes it in an uncompressible chunk
    data = os.urandom(100)
    framed = bytes(cramjam.snappy.compress(data))
    assert framed[:10] == STREAM_IDENTIFIER
    assert struct.unpack("<I", framed[14:18])[0] == masked_crc32c(data)


def test_snappy_known_golang_stream():
    # hand-built stream: identifier, uncompressed chunk with masked CRC, padding, skippable chunk
    data = b"hello nsq"
    stream = (STREAM_IDENTIFIER + chunk(0x01, struct.pack("<I", masked_crc32c(data)) + data)
              + chunk(0xFE, b"\x00" * 3) + chunk(0x80, b"skip"))
    assert SnappyDecoder().decode(stream) == data
    raw = bytes(cramjam.snappy.compress_raw(b"a" * 1000))
    stream = STREAM_IDENTIFIER + chunk(0x00, struct.pack("<I", masked_crc32c(b"a" * 1000)) + raw)
    assert SnappyDecoder().decode(stream) == b"a" * 1000


@settings(max_examples=60)
@given(st.lists(st.binary(max_size=3000) | st.sampled_from([b"a" * 70000, b"xyz" * 30000]), max_size=6),
       st.data())
def test_snappy_round_trip_any_chunking(writes, data):
    enc = SnappyEncoder()
    stream = b"".join(enc.encode(w) for w in writes)
    if any(writes):
        assert stream.startswith(STREAM_IDENTIFIER)
        assert stream.count(STREAM_IDENTIFIER) >= 1
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    dec = SnappyDecoder(max_output=70000)
    assert drain(dec, chunked(stream, cuts)) == b"".join(writes)
    # interop: cramjam's own framed decoder reads our stream
    if stream:
        assert bytes(cramjam.snappy.decompress(stream)) == b"".join(writes)


@settings(max_examples=40)
@given(st.binary(max_size=200000), st.data())
def test_snappy_decodes_cramjam_stream(payload, data):
    stream = bytes(cramjam.snappy.compress(payload))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert drain(SnappyDecoder(), chunked(stream, cuts)) == payload


def test_snappy_output_bounded_per_call():
    payload = b"a" * (10 * 65536)
    stream = SnappyEncoder().encode(payload)
    dec = SnappyDecoder(max_output=65536)
    first = dec.decode(stream)
    assert len(first) == 65536 and dec.pending
    rest = drain(dec, [b""])
    assert first + rest == payload and not dec.pending


@pytest.mark.parametrize(
    "stream",
    [
        chunk(0x01, b"\x00" * 8),  # no stream identifier first
        b"\xff\x05\x00\x00sNaPp",  # identifier with wrong length
        b"\xff\x06\x00\x00sNaPpX",  # identifier with wrong body
        STREAM_IDENTIFIER + chunk(0x02, b"x"),  # reserved unskippable
        STREAM_IDENTIFIER + chunk(0x01, b"ab"),  # shorter than a checksum
        STREAM_IDENTIFIER + chunk(0x01, b"\x00\x00\x00\x00data"),  # bad checksum
        STREAM_IDENTIFIER + chunk(0x00, b"\x00\x00\x00\x00\xff\xff\xff\xff\x0f"),  # bad length
        STREAM_IDENTIFIER + chunk(0x00, b"\x00\x00\x00\x00\x81\x80\x04"),  # decoded > 65536
    ],
)
def test_snappy_corrupt(stream):
    with pytest.raises(CompressionError) as ei:
        drain(SnappyDecoder(), [stream])
    assert isinstance(ei.value, ProtocolError) and ei.value.fatal


def test_snappy_oversize_chunk_rejected_before_buffering():
    dec = SnappyDecoder()
    dec.decode(STREAM_IDENTIFIER)
    with pytest.raises(CompressionError):
        dec.decode(b"\x00" + (MAX_CHUNK_LEN + 1).to_bytes(3, "little"))
    dec = SnappyDecoder()
    dec.decode(STREAM_IDENTIFIER)
    with pytest.raises(CompressionError):
        dec.decode(b"\x01" + (65536 + 5).to_bytes(3, "little"))
    assert SnappyEncoder().encode(b"") == b""


@settings(max_examples=60)
@given(st.lists(st.binary(max_size=5000), max_size=6), st.integers(1, 9), st.data())
def test_deflate_round_trip_any_chunking(writes, level, data):
    enc = DeflateEncoder(level)
    pieces = [enc.encode(w) for w in writes]
    # each write is decodable on its own as soon as it arrives (sync flush)
    dec = DeflateDecoder()
    for w, p in zip(writes, pieces, strict=True):
        assert drain(dec, [p]) == w
    stream = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert drain(DeflateDecoder(max_output=100), chunked(stream, cuts)) == b"".join(writes)
    # interop with zlib's own raw inflater (what pynsq uses) and cramjam's
    assert zlib.decompressobj(-15).decompress(stream) == b"".join(writes)


def test_deflate_reads_go_style_stream_and_is_bounded():
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = c.compress(b"z" * 10_000_000) + c.flush(zlib.Z_SYNC_FLUSH)
    assert len(stream) < 20000
    dec = DeflateDecoder(max_output=1 << 20)
    first = dec.decode(stream)
    assert len(first) == 1 << 20 and dec.pending
    assert len(first) + len(drain(dec, [b""])) == 10_000_000


def test_deflate_corrupt_and_trailing():
    with pytest.raises(CompressionError):
        DeflateDecoder().decode(b"\xff\xff\xff\xff")
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    done = c.compress(b"abc") + c.flush()  # final block
    dec = DeflateDecoder()
    with pytest.raises(CompressionError):
        dec.decode(done + b"junk")
