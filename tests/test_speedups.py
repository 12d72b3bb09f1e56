"""nsqx._speedups (C) against its pure-Python twins: identical results on any input.

The install builds the extension (setup.py, optional); where it was not built these
tests are skipped and the twins are what runs. CI builds it, so both run there, and
`NSQX_NO_SPEEDUPS=1` makes a node use the twins (test below).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.v2 import (
    _split_general,
    _split_marked_py,
    _split_mixed_py,
    _strip_no_ext_py,
    split_mpub,
)
from nsqx.speedups import native
from nsqx.storage.message_id import ids_for_range
from nsqx.storage.records import build_frames, build_frames_general, build_frames_mixed

pytestmark = pytest.mark.skipif(native is None, reason="nsqx._speedups was not built")

bodies_st = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=60)


def mpub_body(bodies: list[bytes]) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(
        struct.pack(">i", len(b)) + b for b in bodies)


@settings(max_examples=300, deadline=None)
@given(bodies_st, st.integers(1, 400))
def test_split_mixed_same_as_twin_on_valid_bodies(bodies, max_size):
    raw = mpub_body(bodies)
    c = native.split_mixed(raw, len(bodies), max_size)
    assert c == _split_mixed_py(raw, len(bodies), max_size)
    assert c == _split_mixed_py(memoryview(raw), len(bodies), max_size)
    assert native.split_mixed(memoryview(raw), len(bodies), max_size) == c
    if c is not None:
        assert c == bodies


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=6), st.binary(max_size=40).map(lambda b: b"\0\0" + b)),
                max_size=20))
def test_strip_no_ext_same_as_twin(items):
    # MPUB_EXT messages: with or without a header, empty or too short for a body
    assert native.strip_no_ext(items) == _strip_no_ext_py(items)


ext_items_st = st.lists(st.one_of(st.binary(min_size=1, max_size=6),
                                  st.binary(max_size=40).map(lambda b: b"\0\0" + b)),
                        min_size=1, max_size=20)


def _general_marked(raw: bytes, max_size: int) -> list[bytes] | None:
    """What split_mpub + strip_no_ext make of an MPUB_EXT body (None: not a marked one)."""
    try:
        items = split_mpub(raw, max_size)
    except ProtocolError:
        return None
    rest = _strip_no_ext_py(items[1:]) if len(items) > 1 else None
    return None if rest is None else [items[0], *rest]


@settings(max_examples=400, deadline=None)
@given(ext_items_st, st.integers(1, 60), st.data())
def test_split_marked_same_as_twin_and_as_the_general_split(items, max_size, data):
    # MPUB_EXT bodies: messages with or without a header, too short, too big; some damaged
    raw = mpub_body(items)
    if data.draw(st.booleans()):
        b = bytearray(raw)
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] = data.draw(st.integers(0, 255))
        raw = bytes(b[: data.draw(st.integers(0, len(b)))])
    c = native.split_marked(raw, max_size)
    assert c == _split_marked_py(raw, max_size)
    assert native.split_marked(memoryview(raw), max_size) == c
    assert _split_marked_py(memoryview(raw), max_size) == c
    if c is not None:
        assert c == _general_marked(raw, max_size)
    elif len(raw) >= 4 and struct.unpack_from(">i", raw)[0] >= 2 and len(items) >= 2:
        # refused: the general split refuses it too, or finds a header (or a message too
        # short for a body) after the first message
        assert _general_marked(raw, max_size) is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 70), st.integers(-5, 1 << 40))
def test_split_mixed_same_as_twin_on_hostile_bodies(raw, count, max_size):
    # count >= 1: split_mpub refuses the others before either runs
    assert native.split_mixed(raw, count, max_size) == _split_mixed_py(raw, count, max_size)


@settings(max_examples=300, deadline=None)
@given(bodies_st, st.data())
def test_split_mixed_same_as_twin_on_damaged_bodies(bodies, data):
    raw = bytearray(mpub_body(bodies))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    raw = bytes(raw[: data.draw(st.integers(0, len(raw)))])
    n = len(bodies)
    assert native.split_mixed(raw, n, 300) == _split_mixed_py(raw, n, 300)
    # and split_mpub (which uses it) still gives upstream's result or error
    try:
        want = _split_general(raw, n, 300) if len(raw) >= 4 else None
    except ProtocolError:
        want = None
    if want is not None and struct.unpack_from(">i", raw)[0] == n:
        assert split_mpub(raw, 300) == want


@settings(max_examples=300, deadline=None)
@given(bodies_st, st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 1 << 20))
def test_build_frames_same_as_twins(bodies, ts, base):
    ids = ids_for_range(3, base, len(bodies))
    c = native.build_frames_mixed(bodies, ids, ts)
    assert c == build_frames_mixed(bodies, ids, ts) == build_frames_general(bodies, ids, ts)
    assert build_frames(bodies, ids, ts)[0] == c


def test_build_frames_refuses_bad_arguments():
    with pytest.raises(ValueError):
        native.build_frames_mixed([b"a", b"b"], b"0" * 16, 1)
    with pytest.raises(TypeError):
        native.build_frames_mixed([b"a", "b"], b"0" * 32, 1)


def test_no_speedups_env_selects_the_twins():
    code = ("import nsqx.speedups, nsqx.protocol.v2 as v; "
            "print(nsqx.speedups.native is None, v._split_mixed is v._split_mixed_py, "
            "v.split_marked is v._split_marked_py)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "NSQX_NO_SPEEDUPS": "1"}, check=True).stdout
    assert out.split() == ["True", "True", "True"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(bodies_st, st.integers(1, 50).flatmap(
    lambda k: st.lists(st.just(b"u" * k), min_size=2, max_size=40))),
    st.integers(0, 65535), st.integers(0, 1 << 40), st.integers(-(1 << 63), (1 << 63) - 1))
def test_log_frames_same_as_twin(bodies, partition, base, ts):
    from nsqx.storage.log import frames_py

    assert native.frames(bodies, partition, base, ts) == frames_py(bodies, partition, base, ts)


def test_log_frames_refuses_what_the_twin_refuses():
    from nsqx.storage.log import frames_py

    for args in (([b"a"], 65536, 0, 1), ([b"a"], 0, -1, 1), ([b"a", b"b"], 0, (1 << 48) - 1, 1)):
        with pytest.raises(ValueError):
            native.frames(*args)
        with pytest.raises(ValueError):
            frames_py(*args)
    with pytest.raises(TypeError):
        native.frames([b"a", bytearray(b"b")], 0, 0, 1)


def test_log_append_takes_bodies_that_are_not_bytes(tmp_path):
    from nsqx.storage.log import LogConfig, PartitionLog

    lg = PartitionLog(tmp_path, 0, LogConfig())
    lg.append([b"ab", bytearray(b"cde"), memoryview(b"f")], 5)
    lg.flush()
    assert [lg.read_frame(i)[34:] for i in range(3)] == [b"ab", b"cde", b"f"]
    lg.close()
