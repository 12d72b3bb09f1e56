import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqx.protocol import frames
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    FrameReader,
    build_message_frame,
    build_message_frames,
    decode_message,
    encode_error,
    encode_frame,
    encode_response,
    patch_attempts,
)


def ref_frame(body, mid, ts, attempts):
    data = struct.pack(">qH", ts, attempts) + mid + body
    return struct.pack(">ii", len(data) + 4, 2) + data


def test_constants():
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"
    assert (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE) == (0, 1, 2)
    assert encode_response(b"{}") == b"\x00\x00\x00\x06\x00\x00\x00\x00{}"
    assert encode_error("E_INVALID", "x") == b"\x00\x00\x00\x0f\x00\x00\x00\x01E_INVALID x"
    assert encode_frame(2, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x02"


def test_message_frame_layout():
    f = build_message_frame(b"body", b"0123456789abcdef", 1234, 1)
    assert len(f) == 34 + 4
    assert struct.unpack(">i", f[:4])[0] == 30 + 4
    assert f[16:18] == b"\x00\x01"
    assert f == ref_frame(b"body", b"0123456789abcdef", 1234, 1)
    g = patch_attempts(f, 7)
    assert g[16:18] == b"\x00\x07" and g[:16] == f[:16] and g[18:] == f[18:]
    assert decode_message(g[8:]) == (1234, 7, b"0123456789abcdef", b"body")
    with pytest.raises(ValueError):
        decode_message(b"short")


@given(st.lists(st.binary(max_size=50), max_size=30), st.integers(0, 2**63 - 1), st.integers(0, 65535))
def test_build_message_frames_matches_reference(bodies, ts, attempts):
    ids = b"".join(b"%016x" % i for i in range(len(bodies)))
    got = build_message_frames(bodies, ids, ts, attempts)
    want = b"".join(ref_frame(b, ids[16 * i : 16 * i + 16], ts, attempts) for i, b in enumerate(bodies))
    assert got == want


def test_build_message_frames_checks_ids():
    with pytest.raises(ValueError):
        build_message_frames([b"a"], b"short", 1)


@given(st.lists(st.tuples(st.integers(0, 2), st.binary(max_size=40)), max_size=20), st.data())
def test_frame_reader_any_chunking(frames_in, data):
    stream = b"".join(encode_frame(t, d) for t, d in frames_in)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    r = FrameReader()
    got = []
    prev = 0
    for c in [*cuts, len(stream)]:
        got += r.feed(stream[prev:c])
        prev = c
    assert got == frames_in
    assert r.buffered == 0


def test_frame_reader_rejects_bad_size_before_buffering():
    r = FrameReader(max_frame_size=100)
    with pytest.raises(ProtocolError):
        r.feed(struct.pack(">ii", 10**6, 2))
    with pytest.raises(ProtocolError):
        FrameReader().feed(struct.pack(">ii", 3, 0))


def test_frames_module_exports():
    for name in frames.__all__:
        assert hasattr(frames, name)


def test_bad_protocol_frame():
    assert frames.BAD_PROTOCOL_FRAME == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"
