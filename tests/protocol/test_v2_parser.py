import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqx.protocol import v2
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.v2 import FIN_BATCH, Command, CommandParser, split_mpub

ID = b"0123456789abcdef"


def size(n):
    return struct.pack(">i", n)


def parse(data, **kw):
    return CommandParser(**kw).feed(data)


def err(data, **kw):
    with pytest.raises(ProtocolError) as ei:
        CommandParser(**kw).feed(data)
    return ei.value


def fed_bytewise(data, **kw):
    p = CommandParser(**kw)
    out = []
    for i in range(len(data)):
        out += p.feed(data[i : i + 1])
    while p.buffered:
        more = p.feed(b"")
        if not more:
            break
        out += more
    return out


# ------------------------------------------------------------------ line commands


@pytest.mark.parametrize(
    "line, cmd",
    [
        (b"NOP\n", Command(b"NOP", [])),
        (b"CLS\n", Command(b"CLS", [])),
        (b"RDY 10\n", Command(b"RDY", [b"10"])),
        (b"RDY\n", Command(b"RDY", [])),
        (b"SUB t c\n", Command(b"SUB", [b"t", b"c"])),
        (b"FIN " + ID + b"\n", Command(b"FIN", [ID])),
        (b"REQ " + ID + b" 100\n", Command(b"REQ", [ID, b"100"])),
        (b"TOUCH " + ID + b"\n", Command(b"TOUCH", [ID])),
        (b"SUB t c\r\n", Command(b"SUB", [b"t", b"c"])),  # one trailing \r stripped
        (b"SUB  t\n", Command(b"SUB", [b"", b"t"])),  # single-space split like bytes.Split
        (b"RDY \n", Command(b"RDY", [b""])),
        (b"NOP extra\n", Command(b"NOP", [b"extra"])),
    ],
)
def test_line_commands(line, cmd):
    assert parse(line) == [cmd]
    assert fed_bytewise(line) == [cmd]


def test_params_are_bytes():
    (c,) = parse(b"SUB t c\n")
    assert all(type(x) is bytes for x in [c.name, *c.params])


def test_unknown_command_is_fatal():
    e = err(b"FOO a b\n")
    assert (e.code, e.text, e.fatal) == ("E_INVALID", "invalid command FOO", True)
    assert e.payload == b"E_INVALID invalid command FOO"
    e = err(b"\n")
    assert e.text == "invalid command "
    e = err(b"nop\n")  # case-sensitive like upstream
    assert e.text == "invalid command nop"
    assert err(b"FIN*\n").text == "invalid command FIN*"


def test_commands_before_error_are_attached_and_parser_stays_dead():
    p = CommandParser()
    with pytest.raises(ProtocolError) as ei:
        p.feed(b"NOP\nRDY 1\nBAD\nNOP\n")
    assert ei.value.commands == [Command(b"NOP", []), Command(b"RDY", [b"1"])]
    with pytest.raises(ProtocolError) as ei2:
        p.feed(b"NOP\n")
    assert ei2.value is ei.value
    assert p.error is ei.value and p.buffered == 0


def test_line_too_long_fatal_even_without_newline():
    p = CommandParser(max_line=100)
    assert p.feed(b"SUB " + b"a" * 94) == []  # 98 bytes, could still end
    with pytest.raises(ProtocolError) as ei:
        p.feed(b"aa")  # 100 bytes without \n: upstream's bufio buffer is full
    assert ei.value.code == "E_INVALID" and ei.value.fatal
    # exactly max_line bytes including the \n is fine
    assert parse(b"SUB " + b"a" * 95 + b"\n", max_line=100)[0].params == [b"a" * 95]
    with pytest.raises(ProtocolError):
        parse(b"SUB " + b"a" * 96 + b"\n", max_line=100)
    assert "too long" in err(b"x" * 20000).text


# ------------------------------------------------------------------ PUB / DPUB


def test_pub():
    data = b"PUB topic\n" + size(5) + b"hello"
    assert parse(data) == [Command(b"PUB", [b"topic"], b"hello")]
    assert fed_bytewise(data) == [Command(b"PUB", [b"topic"], b"hello")]
    c = parse(data + b"NOP\n")
    assert [x.name for x in c] == [b"PUB", b"NOP"]


@pytest.mark.parametrize(
    "data, code, text",
    [
        (b"PUB\n", "E_INVALID", "PUB insufficient number of parameters"),
        (b"PUB bad!topic\n", "E_BAD_TOPIC", 'PUB topic name "bad!topic" is not valid'),
        (b"PUB \n", "E_BAD_TOPIC", 'PUB topic name "" is not valid'),
        (b"PUB t\n" + size(0), "E_BAD_MESSAGE", "PUB invalid message body size 0"),
        (b"PUB t\n" + size(-1), "E_BAD_MESSAGE", "PUB invalid message body size -1"),
        (b"PUB t\n" + size(1048577), "E_BAD_MESSAGE", "PUB message too big 1048577 > 1048576"),
        (b"PUB t\n" + size(2**31 - 1), "E_BAD_MESSAGE", "PUB message too big 2147483647 > 1048576"),
        (b"DPUB t\n", "E_INVALID", "DPUB insufficient number of parameters"),
        (b"DPUB b@d 10\n", "E_BAD_TOPIC", 'DPUB topic name "b@d" is not valid'),
        (b"DPUB t x1\n", "E_INVALID", "DPUB could not parse timeout x1"),
        (b"DPUB t -1\n", "E_INVALID", "DPUB could not parse timeout -1"),
        (b"DPUB t 10\n" + size(0), "E_BAD_MESSAGE", "DPUB invalid message body size 0"),
        (b"DPUB t 10\n" + size(1048577), "E_BAD_MESSAGE", "DPUB message too big 1048577 > 1048576"),
    ],
)
def test_pub_dpub_errors(data, code, text):
    e = err(data)
    assert (e.code, e.text, e.fatal) == (code, text, True)


def test_pub_topic_quoting_uses_go_quote():
    assert err(b'PUB a"\xff\n').text == 'PUB topic name "a\\"\\xff" is not valid'


def test_dpub():
    data = b"DPUB t 1500\n" + size(1) + b"x"
    assert parse(data) == [Command(b"DPUB", [b"t", b"1500"], b"x")]
    # range is only checked by the parser when it knows the max
    assert parse(b"DPUB t 3600001\n" + size(1) + b"x")[0].params[1] == b"3600001"
    e = err(b"DPUB t 3600001\n", max_req_timeout_ms=3600000)
    assert (e.code, e.text) == ("E_INVALID", "DPUB timeout 3600001 out of range 0-3600000")
    assert parse(b"DPUB t 3600000\n" + size(1) + b"x", max_req_timeout_ms=3600000)


def test_huge_declared_size_errors_immediately_without_buffering():
    p = CommandParser()
    with pytest.raises(ProtocolError) as ei:
        p.feed(b"PUB t\n" + size(2**31 - 1))
    assert ei.value.code == "E_BAD_MESSAGE"
    assert p.buffered == 0
    p = CommandParser()
    with pytest.raises(ProtocolError):
        p.feed(b"MPUB t\n" + size(100 * 1024 * 1024))
    p = CommandParser()
    with pytest.raises(ProtocolError):
        p.feed(b"IDENTIFY\n" + size(100 * 1024 * 1024))


def test_body_waits_without_rescanning_until_complete():
    p = CommandParser()
    assert p.feed(b"PUB t\n" + size(1000) + b"a" * 10) == []
    for _ in range(98):
        assert p.feed(b"b" * 10) == []
    assert p.buffered == 6 + 4 + 990
    (c,) = p.feed(b"c" * 10 + b"NOP\n")[:1]
    assert c.body == b"a" * 10 + b"b" * 980 + b"c" * 10


# ------------------------------------------------------------------ MPUB


def mpub_raw(bodies, count=None, body_size=None):
    body = v2.mpub_body(bodies)
    if count is not None:
        body = struct.pack(">i", count) + body[4:]
    return b"MPUB t\n" + size(len(body) if body_size is None else body_size) + body


def test_mpub_uniform_and_mixed():
    for bodies in ([b"abc"] * 5, [b"a", b"bb", b"ccc"], [b"x"], [b"\x00\x00\x00\x01" * 3] * 4):
        (c,) = parse(mpub_raw(bodies))
        assert c.name == b"MPUB" and c.params == [b"t"] and c.bodies == bodies and c.body is None
        assert fed_bytewise(mpub_raw(bodies)) == [c]


@pytest.mark.parametrize(
    "data, code, text",
    [
        (b"MPUB\n", "E_INVALID", "MPUB insufficient number of parameters"),
        (b"MPUB b*d\n", "E_BAD_TOPIC", 'E_BAD_TOPIC MPUB topic name "b*d" is not valid'),
        (b"MPUB t\n" + size(0), "E_BAD_BODY", "MPUB invalid body size 0"),
        (b"MPUB t\n" + size(-5), "E_BAD_BODY", "MPUB invalid body size -5"),
        (b"MPUB t\n" + size(5242881), "E_BAD_BODY", "MPUB body too big 5242881 > 5242880"),
        (b"MPUB t\n" + size(8) + size(0), "E_BAD_BODY", "MPUB invalid message count 0"),
        (b"MPUB t\n" + size(8) + size(-1), "E_BAD_BODY", "MPUB invalid message count -1"),
        (b"MPUB t\n" + size(8) + size(1048576), "E_BAD_BODY", "MPUB invalid message count 1048576"),
        (b"MPUB t\n" + size(2) + b"ab", "E_BAD_BODY", "MPUB failed to read message count"),
        (b"MPUB t\n" + size(6) + size(1) + b"ab", "E_BAD_MESSAGE", "MPUB failed to read message(0) body size"),
        (b"MPUB t\n" + size(8) + size(1) + size(0), "E_BAD_MESSAGE", "MPUB invalid message(0) body size 0"),
        (b"MPUB t\n" + size(13) + size(2) + size(1) + b"a" + size(-3), "E_BAD_MESSAGE",
         "MPUB invalid message(1) body size -3"),
        (b"MPUB t\n" + size(8) + size(1) + size(1048577), "E_BAD_MESSAGE", "MPUB message too big 1048577 > 1048576"),
        (b"MPUB t\n" + size(10) + size(1) + size(5) + b"ab", "E_BAD_MESSAGE", "MPUB failed to read message body"),
        (b"MPUB t\n" + size(11) + size(1) + size(1) + b"abc", "E_BAD_BODY", "MPUB invalid body size 11"),
    ],
)
def test_mpub_errors(data, code, text):
    e = err(data)
    assert (e.code, e.text, e.fatal) == (code, text, True)


def test_mpub_count_checked_before_body_arrives():
    p = CommandParser()
    with pytest.raises(ProtocolError) as ei:
        p.feed(b"MPUB t\n" + size(5000) + size(0))
    assert ei.value.text == "MPUB invalid message count 0"


def test_mpub_uniform_too_big_text_matches_general():
    body = v2.mpub_body([b"a" * 20] * 3)
    with pytest.raises(ProtocolError) as e1:
        split_mpub(body, 10)
    with pytest.raises(ProtocolError) as e2:
        v2._split_general(body, 3, 10)
    assert e1.value.payload == e2.value.payload == b"E_BAD_MESSAGE MPUB message too big 20 > 10"


def test_mpub_uniform_path_taken_and_general_agrees():
    body = v2.mpub_body([bytes([i]) * 7 for i in range(50)])
    fast = v2._split_uniform(body, 50, 1 << 20)
    assert fast is not None
    assert fast == v2._split_general(body, 50, 1 << 20)
    # divisible but not uniform -> fast path declines
    odd = v2.mpub_body([b"a" * 3, b"b" * 5])
    assert v2._split_uniform(odd, 2, 1 << 20) is None
    assert split_mpub(odd, 1 << 20) == [b"a" * 3, b"b" * 5]


# ------------------------------------------------------------------ IDENTIFY / AUTH


def test_identify_stops_feed_for_upgrade():
    p = CommandParser()
    body = b'{"snappy":true}'
    rest = b"\xff\x06\x00\x00sNaPpY-compressed"
    out = p.feed(b"IDENTIFY\n" + size(len(body)) + body + rest)
    assert out == [Command(b"IDENTIFY", [], body)]
    assert p.buffered == len(rest)
    assert p.take_buffered() == rest
    assert p.buffered == 0 and p.feed(b"NOP\n") == [Command(b"NOP", [])]


def test_identify_then_feed_empty_continues():
    p = CommandParser()
    out = p.feed(v2.identify({"a": 1}) + b"NOP\n" + v2.auth(b"s") + b"NOP\n")
    assert [c.name for c in out] == [b"IDENTIFY"]
    assert [c.name for c in p.feed(b"")] == [b"NOP", b"AUTH"]
    assert p.feed(b"") == [Command(b"NOP", [])]
    assert p.feed(b"") == []


@pytest.mark.parametrize(
    "data, code, text",
    [
        (b"IDENTIFY\n" + size(5242881), "E_BAD_BODY", "IDENTIFY body too big 5242881 > 5242880"),
        (b"IDENTIFY\n" + size(0), "E_BAD_BODY", "IDENTIFY invalid body size 0"),
        (b"IDENTIFY\n" + size(-1), "E_BAD_BODY", "IDENTIFY invalid body size -1"),
        (b"AUTH x\n", "E_INVALID", "AUTH invalid number of parameters"),
        (b"AUTH \n", "E_INVALID", "AUTH invalid number of parameters"),
        (b"AUTH\n" + size(5242881), "E_BAD_BODY", "AUTH body too big 5242881 > 5242880"),
        (b"AUTH\n" + size(0), "E_BAD_BODY", "AUTH invalid body size 0"),
    ],
)
def test_identify_auth_errors(data, code, text):
    e = err(data)
    assert (e.code, e.text, e.fatal) == (code, text, True)


def test_auth_body():
    assert parse(b"AUTH\n" + size(6) + b"secret") == [Command(b"AUTH", [], b"secret")]


# ------------------------------------------------------------------ precheck hook


def test_precheck_runs_once_before_body_and_for_unknown():
    calls = []

    def pre(name, params):
        calls.append((name, params))
        if name == b"MPUB":
            raise ProtocolError("E_AUTH_FIRST", "AUTH required before MPUB")

    p = CommandParser(precheck=pre)
    assert p.feed(b"NOP\nPUB t\n" + size(3)) == [Command(b"NOP", [])]
    assert p.feed(b"a") == [] and p.feed(b"bc") == [Command(b"PUB", [b"t"], b"abc")]
    assert calls == [(b"PUB", [b"t"])]  # once, though the command was resumed
    with pytest.raises(ProtocolError) as ei:
        p.feed(b"SUB a b\nMPUB t\n")
    assert ei.value.code == "E_AUTH_FIRST"
    assert ei.value.commands == [Command(b"SUB", [b"a", b"b"])]

    def tls(name, params):
        raise ProtocolError("E_INVALID", f"cannot {name.decode()} in current state (TLS required)")

    assert err(b"BOGUS\n", precheck=tls).text == "cannot BOGUS in current state (TLS required)"
    assert err(b"PUB b!d\n", precheck=tls).text.endswith("(TLS required)")


# ------------------------------------------------------------------ FIN batching


def test_fin_batch():
    ids = [b"%016x" % i for i in range(100)]
    data = b"".join(b"FIN " + i + b"\n" for i in ids)
    out = parse(data, batch_fin=True)
    assert out == [Command(FIN_BATCH, ids)]
    # without batching: one command per line
    assert parse(data) == [Command(b"FIN", [i]) for i in ids]


def test_fin_batch_keeps_order_and_falls_back():
    data = (
        b"FIN " + ID + b"\r\n"
        + b"FIN " + ID + b"\n"
        + b"RDY 5\n"
        + b"FIN " + ID + b"\n"  # single FIN -> plain FIN
        + b"FIN short\n"  # malformed -> plain FIN (server says invalid message ID)
        + b"FIN " + ID + b" extra\n"  # extra params -> plain
        + b"FIN " + ID + b"\n" + b"FIN " + ID + b"\n"
    )
    out = parse(data, batch_fin=True)
    assert out == [
        Command(FIN_BATCH, [ID, ID]),
        Command(b"RDY", [b"5"]),
        Command(b"FIN", [ID]),
        Command(b"FIN", [b"short"]),
        Command(b"FIN", [ID, b"extra"]),
        Command(FIN_BATCH, [ID, ID]),
    ]


def test_fin_batch_partial_line_waits():
    p = CommandParser(batch_fin=True)
    assert p.feed(b"FIN " + ID + b"\nFIN 0123") == [Command(b"FIN", [ID])]
    assert p.feed(b"456789abcdef\n") == [Command(b"FIN", [ID])]


def test_fin_lines_cuts_a_clean_run_and_refuses_anything_else():
    """The split-based cut takes only reads the regexes would take whole, same ids."""
    ids = [b"%016x" % i for i in range(50)]
    run = b"".join(b"FIN " + i + b"\n" for i in ids)
    assert v2._fin_lines(run, 0) == ids
    assert v2._fin_lines(b"RDY 1\n" + run + b"FIN 01", 6) == ids  # partial tail stays
    bad = [
        run + b"RDY 5\n",  # another command after the run
        run[:-1] + b"\r\n",  # CR
        run.replace(ids[3], b"0123 56789abcdef"),  # space inside an id
        run.replace(b"FIN " + ids[3] + b"\nFIN " + ids[4], b"FIN " + ids[3] + b"x\nFIN "
                    + ids[4][1:]),  # 17 + 15 bytes: right length overall, wrong lines
        run.replace(ids[7], b"0123456\n89abcdef"[:16]),  # LF inside an id
        b"FIN " + ids[0] + b"\n",  # one FIN: a plain FIN command, not a batch
    ]
    for data in bad:
        assert v2._fin_lines(data, 0) is None, data


_LINES = st.sampled_from([
    b"FIN 0123456789abcdef\n", b"FIN 00000000000000ff\n", b"FIN 0123456789abcdef\r\n",
    b"FIN short\n", b"FIN 0123456789abcdef extra\n", b"FIN 0123 56789abcdef\n",
    b"FIN 0123456789abcdefg\n", b"RDY 5\n", b"NOP\n", b"FIN ", b"FIN 0123",
])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_LINES, max_size=40), cut=st.integers(min_value=0, max_value=900))
def test_fin_batch_same_commands_with_and_without_the_split_cut(parts, cut):
    """Whatever a read holds, the split cut changes no command: same as the regexes alone."""
    data = b"".join(parts)
    cut = min(cut, len(data))
    real = v2._fin_lines

    def run(cutter) -> list:
        v2._fin_lines = cutter
        try:
            p = CommandParser(batch_fin=True)
            return p.feed(data[:cut]) + p.feed(data[cut:])
        except ProtocolError as e:
            return [("error", e.code, str(e))]
        finally:
            v2._fin_lines = real

    assert run(real) == run(lambda buf, pos: None)


def test_fin_lines_tried_once_per_read(monkeypatch):
    """A read of FINs mixed with other lines tries the whole-read cut once, not at every
    FIN (each try copies the rest of the read: quadratic on a hostile 1 MB read)."""
    calls = []
    real = v2._fin_lines

    def counting(buf, pos):
        calls.append(pos)
        return real(buf, pos)

    monkeypatch.setattr(v2, "_fin_lines", counting)
    data = (b"FIN " + ID + b"\n" + b"NOP\n") * 1000
    out = parse(data, batch_fin=True)
    assert out == [Command(b"FIN", [ID]), Command(b"NOP", [])] * 1000
    assert calls == [0]
