import pytest

from nsqx.protocol import frames
from nsqx.protocol.errors import (
    NON_FATAL_CODES,
    ProtocolError,
    fatal,
    go_quote,
    non_fatal,
    raw_text,
)
from nsqx.protocol.names import is_ephemeral, valid_channel_name, valid_name, valid_topic_name


@pytest.mark.parametrize(
    "raw, quoted",
    [
        (b"abc", '"abc"'),
        (b"", '""'),
        (b'a"b', '"a\\"b"'),
        (b"a\\b", '"a\\\\b"'),
        (b"a\nb\tc\r", '"a\\nb\\tc\\r"'),
        (b"\x00\x7f", '"\\x00\\x7f"'),
        (b"\xff", '"\\xff"'),
        ("é".encode(), '"é"'),
        ("\u00a0".encode(), '"\\u00a0"'),
        (b"\xe2\x82", '"\\xe2\\x82"'),  # truncated rune
        ("😀".encode(), '"😀"'),
    ],
)
def test_go_quote(raw, quoted):
    assert go_quote(raw) == quoted


def test_protocol_error_payload_is_byte_exact():
    e = ProtocolError("E_INVALID", "RDY could not parse count " + raw_text(b"x\xff"))
    assert e.payload == b"E_INVALID RDY could not parse count x\xff"
    assert e.fatal and str(e) == e.args[0]
    assert frames.encode_error(e) == frames.encode_frame(1, e.payload)
    assert not non_fatal("E_FIN_FAILED", "x").fatal
    assert fatal("E_X", "y").fatal
    assert {"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"} == NON_FATAL_CODES


@pytest.mark.parametrize(
    "name, ok",
    [
        ("a", True),
        ("test_topic.1-2", True),
        ("t#ephemeral", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("a" * 54 + "#ephemeral", True),  # 64 incl. suffix
        ("a" * 55 + "#ephemeral", False),
        ("", False),
        ("#ephemeral", False),
        ("a#ephemeral#ephemeral", False),
        ("a b", False),
        ("a\n", False),  # Python's `$` would accept this; Go's does not
        ("a#eph", False),
        ("é", False),
        ("a/b", False),
        ("a:b", False),
    ],
)
def test_names(name, ok):
    assert valid_name(name) is ok
    assert valid_topic_name(name.encode()) is ok
    assert valid_channel_name(name) is ok


def test_is_ephemeral():
    assert is_ephemeral("c#ephemeral") and is_ephemeral(b"c#ephemeral")
    assert not is_ephemeral("c") and not is_ephemeral(b"c")
