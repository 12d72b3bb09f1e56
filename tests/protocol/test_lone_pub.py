"""parse_lone_pub (the one-PUB-per-read fast path) agrees with the general parser."""

import struct

from hypothesis import given
from hypothesis import strategies as st

from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.v2 import CommandParser, parse_lone_marked_pub, parse_lone_pub, split_ext

MAX = 1000
NAMES = st.one_of(st.sampled_from([b"t", b"topic.1", b"a" * 64, b"a" * 65, b"x#ephemeral",
                                   b"", b"bad name", b"t\r", b"\xff", b"t\n"]),
                  st.binary(max_size=70))


def pub(name: bytes, body: bytes, declared: int | None = None) -> bytes:
    n = len(body) if declared is None else declared
    return b"PUB " + name + b"\n" + struct.pack(">i", n) + body


def general(data: bytes):
    """(topic, body) if the general parser sees exactly one PUB and nothing else."""
    try:
        cmds = CommandParser(max_msg_size=MAX).feed(data)
    except ProtocolError:
        return None
    if len(cmds) == 1 and cmds[0].name == b"PUB" and cmds[0].params and len(cmds[0].params) == 1:
        return cmds[0].params[0], cmds[0].body
    return None


@given(NAMES, st.binary(max_size=40), st.one_of(st.none(), st.integers(-2, MAX + 2)),
       st.binary(max_size=8), st.integers(0, 60))
def test_agrees_with_general_parser(name, body, declared, extra, cut):
    data = pub(name, body, declared)
    for candidate in (data, data + extra, data[:cut]):
        fast = parse_lone_pub(candidate, MAX)
        if fast is not None:  # whenever it answers, the general parser says the same
            assert fast == general(candidate)


def test_takes_plain_pubs_and_refuses_the_rest():
    assert parse_lone_pub(pub(b"t", b"hi"), MAX) == (b"t", b"hi")
    assert parse_lone_pub(pub(b"a" * 64, b"x" * MAX), MAX) == (b"a" * 64, b"x" * MAX)
    for data in (pub(b"t", b"x" * (MAX + 1)),  # too big: the general path says E_BAD_MESSAGE
                 pub(b"t", b""),  # empty body: E_BAD_MESSAGE
                 pub(b"t\r", b"hi"),  # \r\n line: the general path strips it
                 pub(b"bad name", b"hi"), pub(b"a" * 65, b"hi"),
                 pub(b"t", b"hi") + b"NOP\n",  # a second command
                 pub(b"t", b"hi")[:-1],  # partial
                 b"PUBX t\n" + struct.pack(">i", 1) + b"x", b"MPUB t\n", b"PUB"):
        assert parse_lone_pub(data, MAX) is None


MARKS = st.one_of(st.sampled_from([b"ab12.0:0:7", b"a:1:2", b"", b'x"y', b"x\\y", b"\xff"]),
                  st.binary(max_size=24))


def marked(name: bytes, mark: bytes, body: bytes, declared: int | None = None,
           json: bytes | None = None) -> bytes:
    j = b'{"##nsqx_producer":"' + mark + b'"}' if json is None else json
    data = struct.pack(">H", len(j)) + j + body
    n = len(data) if declared is None else declared
    return b"PUB_EXT " + name + b"\n" + struct.pack(">i", n) + data


def general_ext(data: bytes):
    """(topic, headers, body) if the general path sees exactly one PUB_EXT it accepts."""
    try:
        cmds = CommandParser(max_msg_size=MAX).feed(data)
        if len(cmds) != 1 or cmds[0].name != b"PUB_EXT" or len(cmds[0].params) != 1:
            return None
        h, body = split_ext(cmds[0].body)
    except ProtocolError:
        return None
    return cmds[0].params[0], h, body


@given(NAMES, MARKS, st.binary(max_size=40), st.one_of(st.none(), st.integers(-2, MAX + 2)),
       st.binary(max_size=8), st.integers(0, 90))
def test_marked_pub_agrees_with_the_general_path(name, mark, body, declared, extra, cut):
    data = marked(name, mark, body, declared)
    for candidate in (data, data + extra, data[:cut]):
        fast = parse_lone_marked_pub(candidate, MAX)
        if fast is not None:
            topic, m, b = fast
            assert general_ext(candidate) == (topic, {"##nsqx_producer": m}, b)


def test_takes_marked_pubs_and_refuses_the_rest():
    assert parse_lone_marked_pub(marked(b"t", b"a.0:1:2", b"hi"), MAX) == (b"t", b"a.0:1:2", b"hi")
    for data in (marked(b"t", b"a:1:2", b""),  # no body: E_BAD_BODY on the general path
                 marked(b"t 1", b"a:1:2", b"hi"),  # a partition: the general path
                 marked(b"t", b"a:1:2", b"hi", json=b'{"##nsqx_producer":"a:1:2","k":"v"}'),
                 marked(b"t", b'a\\"', b"hi"), marked(b"t", b"", b"hi"),
                 marked(b"t", b"a:1:2", b"x" * MAX),  # over the size the general path allows
                 marked(b"t", b"a:1:2", b"hi") + b"NOP\n", marked(b"t", b"a:1:2", b"hi")[:-1]):
        assert parse_lone_marked_pub(data, MAX) is None
