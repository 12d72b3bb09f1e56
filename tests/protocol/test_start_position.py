"""SUB_ADVANCED's and /channel/setoffset's start positions (Youzan's ``<type>:<value>``)."""

from __future__ import annotations

import pytest

from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.v2 import Command, CommandParser, StartKind, StartPosition


@pytest.mark.parametrize("raw,want", [
    (b"earliest", StartPosition("earliest")),
    (b"latest", StartPosition("latest")),
    (b" latest\n", StartPosition("latest")),
    (b"special:-1", StartPosition("latest")),
    (b"special:-2", StartPosition("earliest")),
    (b"timestamp:1700000000", StartPosition("timestamp", 1700000000)),
    (b"timestamp:0", StartPosition("timestamp", 0)),
    (b"virtual_queue:42", StartPosition("offset", 42)),
    (b"msgcount:42", StartPosition("offset", 42)),
    (b"offset:0", StartPosition("offset", 0)),
    (b"msgcount:281474976710655", StartPosition("offset", 2**48 - 1)),
    (b"msgcount:007", StartPosition("offset", 7)),
])
def test_positions(raw: bytes, want: StartPosition) -> None:
    assert v2.parse_start_position(raw) == want


@pytest.mark.parametrize("raw", [b"earliest", b"latest", b"timestamp:1700000000",
                                 b"offset:42"])
def test_kind_is_an_enum_and_text_reads_back(raw: bytes) -> None:
    pos = v2.parse_start_position(raw)
    assert isinstance(pos.kind, StartKind) and pos.to_text().encode() == raw
    assert v2.parse_start_position(pos.to_text().encode()) == pos


def test_a_kind_given_as_str_becomes_the_enum_and_a_bad_one_is_refused() -> None:
    assert StartPosition("timestamp", 5).kind is StartKind.TIMESTAMP
    with pytest.raises(ValueError):
        StartPosition("first")


@pytest.mark.parametrize("raw", [
    b"", b"first", b"timestamp", b"timestamp:", b":5", b"msgcount:-1", b"msgcount:+1",
    b"msgcount: 1", b"msgcount:1.0", b"msgcount:1e3", b"msgcount:0x1", b"msgcount:1:2",
    b"msgcount:281474976710656", b"msgcount:" + b"9" * 40, b"timestamp:9223372037",
    b"special:0", b"special:-3", b"special:", b"MSGCOUNT:1", b"msgcount:\xd9\xa3",
    b"\xff:1", b"earliest:1",
])
def test_bad_positions(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as ei:
        v2.parse_start_position(raw)
    assert ei.value.code == "E_INVALID" and ei.value.fatal


def test_sub_advanced_params_and_encoder() -> None:
    assert v2.sub_advanced("t", "c", 3, "msgcount:5") == b"SUB_ADVANCED t c 3 msgcount:5\n"
    assert v2.sub_advanced("t", "c") == b"SUB_ADVANCED t c 0\n"
    (cmd,) = CommandParser().feed(v2.sub_advanced("t", "c", 2, "timestamp:9"))
    assert cmd == Command(b"SUB_ADVANCED", [b"t", b"c", b"2", b"timestamp:9"])
    assert v2.parse_sub_advanced(cmd.params) == ("t", "c", 2, StartPosition("timestamp", 9))
    assert v2.parse_sub_advanced([b"t", b"c", b"0"]) == ("t", "c", 0, None)


@pytest.mark.parametrize("params,code,text", [
    ([b"t", b"c"], "E_INVALID", "SUB_ADVANCED insufficient number of parameters"),
    ([b"t", b"c", b"0", b"latest", b"x"], "E_INVALID", "SUB_ADVANCED too many parameters"),
    ([b"t!", b"c", b"0"], "E_BAD_TOPIC", 'SUB_ADVANCED topic name "t!" is not valid'),
    ([b"t", b"c!", b"0"], "E_BAD_CHANNEL", 'SUB_ADVANCED channel name "c!" is not valid'),
    ([b"t", b"c", b"-1"], "E_BAD_PARTITION", "SUB_ADVANCED partition -1 is not valid"),
    ([b"t", b"c", b""], "E_BAD_PARTITION", "SUB_ADVANCED partition  is not valid"),
    ([b"t", b"c", b"65536"], "E_BAD_PARTITION", "SUB_ADVANCED partition 65536 is not valid"),
    ([b"t", b"c", b"0" * 9], "E_BAD_PARTITION", "SUB_ADVANCED partition 000000000 is not valid"),
    ([b"t", b"c", b"0", b"x:1"], "E_INVALID", "invalid start position type x"),
])
def test_sub_advanced_errors(params: list[bytes], code: str, text: str) -> None:
    with pytest.raises(ProtocolError) as ei:
        v2.parse_sub_advanced(params)
    assert (ei.value.code, ei.value.text) == (code, text)
