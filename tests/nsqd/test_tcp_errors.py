"""Raw V2 protocol error paths against a real nsqd: exact codes and texts, fatal vs non-fatal.

Upstream (`nsqd/protocol_v2.go`): only E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED keep the
connection; every other error frame is followed by a close. After every test a control
consumer, subscribed since the module started, must still receive a fresh message intact:
no client's error may hurt the node or other clients' data.
"""

from __future__ import annotations

import itertools
import json
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsqx.protocol import v2
from nsqx.protocol.frames import FRAME_ERROR
from tests.support import http_api
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.certs import TLSFiles
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import ConnectionClosed, RawClient, consumer

MAX_MSG = 1024
MAX_BODY = 8192
MAX_RDY = 100
MAX_REQ_MS = 10_000
FLAGS = [
    f"--max-msg-size={MAX_MSG}",
    f"--max-body-size={MAX_BODY}",
    f"--max-rdy-count={MAX_RDY}",
    "--max-req-timeout=10s",
]

_seq = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    factory = NsqdFactory(Path(tmp_path_factory.mktemp("nsqd-errors")))
    try:
        yield factory.start(FLAGS)
    finally:
        complaints = factory.close()
    assert not complaints, complaints


@pytest.fixture(scope="module")
def control(node: NsqdProcess) -> Iterator[RawClient]:
    c = consumer(node.tcp_address, "control", "keep", rdy=50)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def node_survives(node: NsqdProcess, control: RawClient) -> Iterator[None]:
    """After the test: the node runs and an old subscriber still gets intact messages."""
    yield
    assert node.is_running(), "nsqd died:\n" + node.all_logs()
    body = b"control-%d-" % next(_seq) + bytes(range(256))
    with RawClient(node.tcp_address) as p:
        p.pub("control", body)
    m = control.read_message(5)
    assert m.body == body and m.attempts == 1
    control.send(v2.fin(m.id))


def connect(node: NsqdProcess) -> RawClient:
    return RawClient(node.tcp_address)


def subscribed(node: NsqdProcess, topic: str = "errs", channel: str = "c") -> RawClient:
    return consumer(node.tcp_address, topic, channel, rdy=None)  # type: ignore[arg-type]


def unknown_id(n: int = 987654) -> bytes:
    return b"%016x" % n


# --------------------------------------------------------------------------- framing


def test_bad_magic_is_rejected_and_closed(node: NsqdProcess) -> None:
    with RawClient(node.tcp_address, magic=b"  V1") as c:
        ftype, data = c.read_frame()
        assert (ftype, data) == (FRAME_ERROR, b"E_BAD_PROTOCOL")
        c.expect_closed()


def test_garbage_magic_is_rejected_and_closed(node: NsqdProcess) -> None:
    with RawClient(node.tcp_address, magic=b"GET / HTTP/1.1\r\n\r\n") as c:
        ftype, data = c.read_frame()
        assert (ftype, data) == (FRAME_ERROR, b"E_BAD_PROTOCOL")
        c.expect_closed()


def test_unknown_command_is_fatal(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"BOGUS foo\n")
        c.expect_error("E_INVALID", "invalid command BOGUS", closed=True)


def test_lowercase_command_is_unknown(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"nop\n")
        c.expect_error("E_INVALID", "invalid command nop", closed=True)


def test_commands_before_the_bad_one_still_run(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.pub("errs_order", b"a") + b"BOGUS\n" + v2.pub("errs_order", b"b"))
        c.expect_ok()
        c.expect_error("E_INVALID", "invalid command BOGUS", closed=True)
    with consumer(node.tcp_address, "errs_order", "c", rdy=10) as k:
        assert [m.body for m in k.drain_messages(quiet=0.5)] == [b"a"]


def test_line_longer_than_16k_closes(node: NsqdProcess) -> None:
    with connect(node) as c:
        assert c.try_send(b"PUB " + b"a" * 20000)
        # upstream drops the connection (bufio.ErrBufferFull); an E_INVALID first is fine
        try:
            ftype, data = c.read_frame(5)
        except ConnectionClosed:
            return
        assert ftype == FRAME_ERROR and data.startswith(b"E_INVALID"), data
        c.expect_closed()


def test_nop_has_no_response(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.nop() + v2.nop())
        c.expect_nothing(0.3)
        c.expect_open()


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize(
    "line,name",
    [
        (b"RDY 1\n", "RDY"),
        (b"FIN " + unknown_id() + b"\n", "FIN"),
        (b"REQ " + unknown_id() + b" 0\n", "REQ"),
        (b"TOUCH " + unknown_id() + b"\n", "TOUCH"),
        (b"CLS\n", "CLS"),
    ],
)
def test_subscriber_commands_before_sub_are_fatal(node: NsqdProcess, line: bytes, name: str) -> None:
    with connect(node) as c:
        c.send(line)
        c.expect_error("E_INVALID", f"cannot {name} in current state", closed=True)


def test_identify_twice_is_fatal(node: NsqdProcess) -> None:
    # (upstream keeps stateInit after IDENTIFY; nsqx refuses a second one, as clients never send it)
    with connect(node) as c:
        c.identify({})
        c.send(v2.identify({}))
        c.expect_error("E_INVALID", "cannot IDENTIFY in current state", closed=True)


def test_identify_after_sub_is_fatal(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.identify({}))
        c.expect_error("E_INVALID", "cannot IDENTIFY in current state", closed=True)


def test_sub_twice_is_fatal(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.sub("errs", "other"))
        c.expect_error("E_INVALID", "cannot SUB in current state", closed=True)


def test_cls_twice_is_fatal(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(v2.cls())
        c.expect_error("E_INVALID", "cannot CLS in current state", closed=True)


def test_rdy_after_cls_is_ignored(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(v2.rdy(5))
        c.expect_open()


def test_sub_with_heartbeats_disabled_is_fatal(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.identify({"heartbeat_interval": -1})
        c.send(v2.sub("errs", "c"))
        c.expect_error("E_INVALID", "cannot SUB with heartbeats disabled", closed=True)


def test_sub_insufficient_params(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"SUB errs\n")
        c.expect_error("E_INVALID", "SUB insufficient number of parameters", closed=True)


def test_auth_without_auth_server_is_disabled(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.auth(b"secret"))
        c.expect_error("E_AUTH_DISABLED", "AUTH disabled", closed=True)


def test_auth_with_params_is_fatal(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"AUTH x\n" + struct.pack(">I", 6) + b"secret")
        c.expect_error("E_INVALID", "AUTH invalid number of parameters", closed=True)


def test_auth_after_sub_is_fatal(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.auth(b"secret"))
        c.expect_error("E_INVALID", "cannot AUTH in current state", closed=True)


def test_publishing_while_subscribed_is_allowed(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.pub("errs_pubsub", b"x")
        c.mpub("errs_pubsub", [b"y", b"z"])
        c.dpub("errs_pubsub", 0, b"w")


# --------------------------------------------------------------------------- names

@pytest.mark.parametrize("name", ["bad!", "x" * 65, "t#ephemeralx", "sp/ace"])
def test_pub_bad_topic(node: NsqdProcess, name: str) -> None:
    with connect(node) as c:
        c.send(v2.pub(name, b"x"))
        c.expect_error("E_BAD_TOPIC", f'PUB topic name "{name}" is not valid', closed=True)


def test_dpub_bad_topic(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.dpub("bad!", 10, b"x"))
        c.expect_error("E_BAD_TOPIC", 'DPUB topic name "bad!" is not valid', closed=True)


def test_mpub_bad_topic_has_upstream_quirk_text(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.mpub("bad!", [b"x"]))
        c.expect_error("E_BAD_TOPIC", 'E_BAD_TOPIC MPUB topic name "bad!" is not valid',
                       closed=True)


def test_sub_bad_topic(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.sub("bad!", "c"))
        c.expect_error("E_BAD_TOPIC", 'SUB topic name "bad!" is not valid', closed=True)


@pytest.mark.parametrize("name", ["bad!", "x" * 65, "c#eph"])
def test_sub_bad_channel(node: NsqdProcess, name: str) -> None:
    with connect(node) as c:
        c.send(v2.sub("errs", name))
        c.expect_error("E_BAD_CHANNEL", f'SUB channel name "{name}" is not valid', closed=True)


def test_sub_64_char_names_are_valid(node: NsqdProcess) -> None:
    t = "t" * 64
    ch = "c" * 54 + "#ephemeral"
    with consumer(node.tcp_address, t, ch, rdy=1) as c:
        c.expect_open()


# --------------------------------------------------------------------------- PUB / DPUB bodies


def test_pub_insufficient_params(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"PUB\n" + struct.pack(">I", 1) + b"x")
        c.expect_error("E_INVALID", "PUB insufficient number of parameters", closed=True)


def test_pub_empty_body(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"PUB errs\n" + struct.pack(">I", 0))
        c.expect_error("E_BAD_MESSAGE", "PUB invalid message body size 0", closed=True)


def test_pub_negative_size(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"PUB errs\n" + struct.pack(">i", -1))
        c.expect_error("E_BAD_MESSAGE", "PUB invalid message body size -1", closed=True)


def test_pub_too_big(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.pub("errs", b"x" * (MAX_MSG + 1)))
        c.expect_error("E_BAD_MESSAGE", f"PUB message too big {MAX_MSG + 1} > {MAX_MSG}",
                       closed=True)


def test_pub_exactly_max_size_is_ok(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.pub("errs_max", b"m" * MAX_MSG)
    with consumer(node.tcp_address, "errs_max", "c", rdy=1) as k:
        assert k.read_message().body == b"m" * MAX_MSG


@pytest.mark.parametrize("cmd,code,text", [
    (b"PUB errs\n", "E_BAD_MESSAGE", "PUB message too big 2147483647 > 1024"),
    (b"DPUB errs 10\n", "E_BAD_MESSAGE", "DPUB message too big 2147483647 > 1024"),
    (b"MPUB errs\n", "E_BAD_BODY", "MPUB body too big 2147483647 > 8192"),
    (b"IDENTIFY\n", "E_BAD_BODY", "IDENTIFY body too big 2147483647 > 8192"),
    (b"AUTH\n", "E_BAD_BODY", "AUTH body too big 2147483647 > 8192"),
])
def test_huge_declared_size_is_rejected_without_waiting_for_the_body(
        node: NsqdProcess, cmd: bytes, code: str, text: str) -> None:
    with connect(node) as c:
        c.send(cmd + struct.pack(">i", 2**31 - 1) + b"only a few bytes")
        c.expect_error(code, text, closed=True, timeout=2)


def test_dpub_out_of_range_is_fatal(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.dpub("errs", MAX_REQ_MS + 1, b"x"))
        c.expect_error("E_INVALID", f"DPUB timeout {MAX_REQ_MS + 1} out of range 0-{MAX_REQ_MS}",
                       closed=True)


def test_dpub_max_is_ok(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.dpub("errs_dpub", MAX_REQ_MS, b"x")


def test_dpub_negative_cannot_be_parsed(node: NsqdProcess) -> None:
    # upstream ByteToBase10 accepts digits only: "-1" is a parse error, not a range error
    with connect(node) as c:
        c.send(b"DPUB errs -1\n" + struct.pack(">I", 1) + b"x")
        c.expect_error("E_INVALID", "DPUB could not parse timeout -1", closed=True)


def test_dpub_insufficient_params(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"DPUB errs\n" + struct.pack(">I", 1) + b"x")
        c.expect_error("E_INVALID", "DPUB insufficient number of parameters", closed=True)


# --------------------------------------------------------------------------- MPUB bodies


def mpub_raw(body: bytes, topic: bytes = b"errs") -> bytes:
    return b"MPUB " + topic + b"\n" + struct.pack(">I", len(body)) + body


def test_mpub_zero_body_size(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"MPUB errs\n" + struct.pack(">I", 0))
        c.expect_error("E_BAD_BODY", "MPUB invalid body size 0", closed=True)


def test_mpub_body_too_big(node: NsqdProcess) -> None:
    bodies = [b"x" * 1000] * 9  # 4 + 9 * 1004 > 8192
    with connect(node) as c:
        c.send(v2.mpub("errs", bodies))
        size = 4 + 9 * 1004
        c.expect_error("E_BAD_BODY", f"MPUB body too big {size} > {MAX_BODY}", closed=True)


def test_mpub_zero_count(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(mpub_raw(struct.pack(">I", 0)))
        c.expect_error("E_BAD_BODY", "MPUB invalid message count 0", closed=True)


def test_mpub_count_above_limit(node: NsqdProcess) -> None:
    count = (MAX_BODY - 4) // 5 + 1
    with connect(node) as c:
        c.send(mpub_raw(struct.pack(">I", count) + b"\x00" * 16))
        c.expect_error("E_BAD_BODY", f"MPUB invalid message count {count}", closed=True)


def test_mpub_message_size_zero(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(mpub_raw(struct.pack(">II", 1, 0)))
        c.expect_error("E_BAD_MESSAGE", "MPUB invalid message(0) body size 0", closed=True)


def test_mpub_message_too_big(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.mpub("errs", [b"ok", b"y" * (MAX_MSG + 1)]))
        c.expect_error("E_BAD_MESSAGE", f"MPUB message too big {MAX_MSG + 1} > {MAX_MSG}",
                       closed=True)


def test_mpub_is_atomic_on_error(node: NsqdProcess) -> None:
    with connect(node) as c:
        # count says 3 but the second message's size runs past the body
        body = struct.pack(">I", 3) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 50) + b"b"
        c.send(mpub_raw(body, b"errs_atomic"))
        payload = c.expect_error("E_BAD_MESSAGE", closed=True)
        assert "MPUB" in payload
    with connect(node) as c:
        c.pub("errs_atomic", b"after")
    with consumer(node.tcp_address, "errs_atomic", "c", rdy=10) as k:
        assert [m.body for m in k.drain_messages(quiet=0.5)] == [b"after"]


# --------------------------------------------------------------------------- RDY


def test_rdy_above_max_is_fatal(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.rdy(MAX_RDY + 1))
        c.expect_error("E_INVALID", f"RDY count {MAX_RDY + 1} out of range 0-{MAX_RDY}",
                       closed=True)


def test_rdy_max_is_ok(node: NsqdProcess) -> None:
    with subscribed(node) as c:
        c.send(v2.rdy(MAX_RDY))
        c.expect_open()


@pytest.mark.parametrize("count", [
    "abc", "5x",
    "-1",
    "+5",
    "1_0",
])
def test_rdy_unparsable(node: NsqdProcess, count: str) -> None:
    # upstream ByteToBase10 accepts ASCII digits only: a sign is a parse error
    with subscribed(node) as c:
        c.send(b"RDY %s\n" % count.encode())
        c.expect_error("E_INVALID", f"RDY could not parse count {count}", closed=True,
                       timeout=2)


# --------------------------------------------------------------------------- FIN / REQ / TOUCH


@pytest.mark.parametrize("cmd,code,verb", [
    (v2.fin, "E_FIN_FAILED", "FIN"),
    (lambda mid: v2.req(mid, 0), "E_REQ_FAILED", "REQ"),
    (v2.touch, "E_TOUCH_FAILED", "TOUCH"),
])
@pytest.mark.parametrize("mid", [unknown_id(), b"zzzzzzzzzzzzzzzz", b"FFFFFFFFFFFFFFFF"])
def test_unknown_id_is_non_fatal(node: NsqdProcess, cmd, code: str, verb: str, mid: bytes) -> None:
    with subscribed(node) as c:
        c.send(cmd(mid))
        c.expect_error(code, f"{verb} {mid.decode()} failed ID not in flight", closed=False)


def test_non_fatal_errors_keep_subscription_working(node: NsqdProcess) -> None:
    with consumer(node.tcp_address, "errs_nf", "c", rdy=5) as c:
        for i in range(3):
            c.send(v2.fin(unknown_id(1000 + i)))
        for i in range(3):
            c.expect_error("E_FIN_FAILED", f"FIN {unknown_id(1000 + i).decode()} failed ID not in flight")
        with connect(node) as p:
            p.pub("errs_nf", b"hello")
        m = c.read_message()
        assert m.body == b"hello"
        c.send(v2.fin(m.id))
        # a second FIN of the same id: no longer in flight
        c.send(v2.fin(m.id))
        c.expect_error("E_FIN_FAILED", f"FIN {m.id.decode()} failed ID not in flight", closed=False)


def test_fin_of_another_clients_message(node: NsqdProcess) -> None:
    with consumer(node.tcp_address, "errs_own", "c", rdy=1) as a, \
            consumer(node.tcp_address, "errs_own", "c", rdy=0) as b:
        with connect(node) as p:
            p.pub("errs_own", b"mine")
        m = a.read_message()
        for cmd, code, verb in [(v2.fin, "E_FIN_FAILED", "FIN"),
                                (lambda i: v2.req(i, 0), "E_REQ_FAILED", "REQ"),
                                (v2.touch, "E_TOUCH_FAILED", "TOUCH")]:
            b.send(cmd(m.id))
            b.expect_error(code, f"{verb} {m.id.decode()} failed client does not own message",
                           closed=False)
        # the owner can still finish it, and nothing is redelivered
        a.send(v2.fin(m.id))
        a.expect_nothing(0.3)
        a.expect_open()


@pytest.mark.parametrize("line", [
    b"FIN abc\n", b"FIN 0123456789abcdef0\n", b"TOUCH abc\n", b"REQ abc 0\n",
])
def test_invalid_message_id_length_is_fatal(node: NsqdProcess, line: bytes) -> None:
    with subscribed(node) as c:
        c.send(line)
        c.expect_error("E_INVALID", "invalid message ID", closed=True)


@pytest.mark.parametrize("line,text", [
    (b"FIN\n", "FIN insufficient number of params"),
    (b"TOUCH\n", "TOUCH insufficient number of params"),
    (b"REQ " + unknown_id() + b"\n", "REQ insufficient number of params"),
])
def test_missing_params_are_fatal(node: NsqdProcess, line: bytes, text: str) -> None:
    with subscribed(node) as c:
        c.send(line)
        c.expect_error("E_INVALID", text, closed=True)


@pytest.mark.parametrize("timeout", ["soon", "-5", "+5"])
def test_req_unparsable_timeout(node: NsqdProcess, timeout: str) -> None:
    with subscribed(node) as c:
        c.send(b"REQ " + unknown_id() + b" " + timeout.encode() + b"\n")
        c.expect_error("E_INVALID", f"REQ could not parse timeout {timeout}", closed=True,
                       timeout=2)


# --------------------------------------------------------------------------- IDENTIFY


@pytest.mark.parametrize("field,value,text", [
    ("heartbeat_interval", 999, "IDENTIFY heartbeat interval (999) is invalid"),
    ("heartbeat_interval", 60_001, "IDENTIFY heartbeat interval (60001) is invalid"),
    ("heartbeat_interval", -2, "IDENTIFY heartbeat interval (-2) is invalid"),
    ("msg_timeout", 999, "IDENTIFY msg timeout (999) is invalid"),
    ("msg_timeout", 900_001, "IDENTIFY msg timeout (900001) is invalid"),
    ("sample_rate", 100, "IDENTIFY sample rate (100) is invalid"),
    ("sample_rate", -1, "IDENTIFY sample rate (-1) is invalid"),
    ("output_buffer_size", 63, "IDENTIFY output buffer size (63) is invalid"),
    ("output_buffer_timeout", 1, "IDENTIFY output buffer timeout (1) is invalid"),
])
def test_identify_bad_values(node: NsqdProcess, field: str, value: int, text: str) -> None:
    with connect(node) as c:
        c.send(v2.identify({"feature_negotiation": True, field: value}))
        c.expect_error("E_BAD_BODY", text, closed=True)


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b'"str"', b'{"heartbeat_interval":"x"}',
                                  b'{"heartbeat_interval":1000.5}', b'{"snappy":"yes"}'])
def test_identify_bad_json(node: NsqdProcess, body: bytes) -> None:
    with connect(node) as c:
        c.send(v2.identify(body))
        payload = c.expect_error("E_BAD_BODY", closed=True)
        assert payload.startswith("E_BAD_BODY IDENTIFY failed to decode JSON body"), payload


def test_identify_zero_size(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(b"IDENTIFY\n" + struct.pack(">I", 0))
        c.expect_error("E_BAD_BODY", "IDENTIFY invalid body size 0", closed=True)


def test_identify_snappy_and_deflate(node: NsqdProcess) -> None:
    with connect(node) as c:
        c.send(v2.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
        c.expect_error("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression",
                       closed=True)


def test_identify_snappy_and_deflate_without_negotiation_is_ok(node: NsqdProcess) -> None:
    # upstream returns OK before looking at the features when feature_negotiation is false
    with connect(node) as c:
        c.send(v2.identify({"snappy": True, "deflate": True}))
        c.expect_ok()
        c.expect_open()


def test_identify_unknown_keys_are_ignored(node: NsqdProcess) -> None:
    with connect(node) as c:
        info = c.identify({"feature_negotiation": True, "short_id": "a", "long_id": "b",
                           "whatever": [1, {"x": None}]})
        assert isinstance(info, dict) and info["max_rdy_count"] == MAX_RDY
        c.expect_open()


def test_identify_response_fields(node: NsqdProcess) -> None:
    with connect(node) as c:
        info = c.identify({"feature_negotiation": True, "msg_timeout": 5000,
                           "sample_rate": 10, "heartbeat_interval": 2000})
        assert isinstance(info, dict)
        assert info["msg_timeout"] == 5000
        assert info["max_msg_timeout"] == 900_000
        assert info["sample_rate"] == 10
        assert info["auth_required"] is False
        assert info["version"] == "1.3.0"
        assert json.loads(json.dumps(info)) == info
        assert list(info)[:3] == ["max_rdy_count", "version", "max_msg_timeout"]


# --------------------------------------------------------------------------- nodes with options


def test_max_channel_consumers(nsqd_factory: NsqdFactory) -> None:
    n = nsqd_factory.start(["--max-channel-consumers=1"])
    with consumer(n.tcp_address, "lim", "c", rdy=1) as first, RawClient(n.tcp_address) as c:
        c.send(v2.sub("lim", "c"))
        c.expect_error("E_SUB_FAILED", "SUB failed consumers for lim:c exceeds limit of 1",
                       closed=True)
        first.expect_open()
    # another channel of the same topic is fine
    with consumer(n.tcp_address, "lim", "d", rdy=1) as other:
        other.expect_open()


def test_tls_required(nsqd_factory: NsqdFactory, tls_files: TLSFiles) -> None:
    n = nsqd_factory.start([f"--tls-cert={tls_files.server_cert}",
                            f"--tls-key={tls_files.server_key}", "--tls-required=true"])
    for line in (v2.pub("t", b"x"), v2.sub("t", "c"), v2.nop()):
        name = line.split(b" ")[0].split(b"\n")[0].decode()
        with RawClient(n.tcp_address) as c:
            c.send(line)
            c.expect_error("E_INVALID", f"cannot {name} in current state (TLS required)",
                           closed=True)
    # IDENTIFY is allowed (the TLS upgrade itself: test_tls_upgrade_is_reliable)
    with RawClient(n.tcp_address) as c:
        info = c.identify({"feature_negotiation": True})
        assert isinstance(info, dict) and info["tls_v1"] is False
        c.send(v2.pub("t", b"x"))
        c.expect_error("E_INVALID", "cannot PUB in current state (TLS required)", closed=True)


@pytest.fixture
def auth_node(nsqd_factory: NsqdFactory, auth_server: AuthServer) -> NsqdProcess:
    auth_server.identities["good"] = Identity(
        "alice", [grant("^allowed$", ("^ok$",), ("subscribe", "publish"))],
        identity_url="http://id/alice")
    auth_server.identities["empty"] = Identity("nobody", [])
    return nsqd_factory.start([f"--auth-http-address={auth_server.address}"])


def test_auth_required_before_pub_and_sub(auth_node: NsqdProcess) -> None:
    with RawClient(auth_node.tcp_address) as c:
        info = c.identify({"feature_negotiation": True})
        assert isinstance(info, dict) and info["auth_required"] is True
        c.send(v2.pub("allowed", b"x"))
        c.expect_error("E_AUTH_FIRST", "AUTH required before PUB", closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.sub("allowed", "ok"))
        c.expect_error("E_AUTH_FIRST", "AUTH required before SUB", closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.dpub("allowed", 10, b"x"))
        c.expect_error("E_AUTH_FIRST", "AUTH required before DPUB", closed=True)


def test_mpub_auth_is_checked_before_the_body(auth_node: NsqdProcess) -> None:
    # upstream MPUB: CheckAuth runs before the body size is even read
    with RawClient(auth_node.tcp_address) as c:
        c.send(b"MPUB allowed\n" + struct.pack(">i", 2**31 - 1))
        c.expect_error("E_AUTH_FIRST", "AUTH required before MPUB", closed=True, timeout=2)


def test_auth_outcomes(auth_node: NsqdProcess) -> None:
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"wrong"))
        c.expect_error("E_AUTH_FAILED", "AUTH failed", closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"empty"))
        c.expect_error("E_UNAUTHORIZED", "AUTH no authorizations found", closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"good"))
        resp = json.loads(c.expect_response())
        assert resp == {"identity": "alice", "identity_url": "http://id/alice",
                        "permission_count": 1}
        c.send(v2.auth(b"good"))
        c.expect_error("E_INVALID", "AUTH already set", closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"good"))
        c.expect_response()
        c.pub("allowed", b"yes")
        c.send(v2.pub("other", b"no"))
        c.expect_error("E_UNAUTHORIZED", 'AUTH failed for PUB on "other" ""', closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"good"))
        c.expect_response()
        c.send(v2.sub("allowed", "nope"))
        c.expect_error("E_UNAUTHORIZED", 'AUTH failed for SUB on "allowed" "nope"', closed=True)
    with RawClient(auth_node.tcp_address) as c:
        c.send(v2.auth(b"good"))
        c.expect_response()
        c.subscribe("allowed", "ok", rdy=1)
        assert c.read_message().body == b"yes"


@pytest.mark.parametrize("name", ["IDENTIFY", "AUTH"])
def test_state_is_checked_before_the_body(node: NsqdProcess, name: str) -> None:
    # upstream checks the state first, then reads the body size
    with subscribed(node) as c:
        c.send(name.encode() + b"\n" + struct.pack(">i", 2**31 - 1))
        c.expect_error("E_INVALID", f"cannot {name} in current state", closed=True, timeout=2)


def test_tls_policy_is_checked_before_the_body(nsqd_factory: NsqdFactory,
                                               tls_files: TLSFiles) -> None:
    # upstream enforceTLSPolicy runs before the command (and its body) is read
    n = nsqd_factory.start([f"--tls-cert={tls_files.server_cert}",
                            f"--tls-key={tls_files.server_key}", "--tls-required=true"])
    with RawClient(n.tcp_address) as c:
        c.send(b"PUB t\n" + struct.pack(">i", 2**31 - 1))
        c.expect_error("E_INVALID", "cannot PUB in current state (TLS required)", closed=True,
                       timeout=2)


def test_tls_upgrade_is_reliable(nsqd_factory: NsqdFactory, tls_files: TLSFiles) -> None:
    """A client starts its handshake as soon as it has the IDENTIFY response (go-nsq, pynsq),
    while other clients keep the server busy: every upgrade must succeed."""
    import threading

    n = nsqd_factory.start([f"--tls-cert={tls_files.server_cert}",
                            f"--tls-key={tls_files.server_key}"])
    ctx = ssl.create_default_context(cafile=str(tls_files.ca_cert))
    stop = threading.Event()

    def load() -> None:
        with RawClient(n.tcp_address, timeout=10) as p:
            batch = v2.pub("tls_load", b"x" * 100) * 100
            while not stop.is_set():
                p.send(batch)
                for _ in range(100):
                    p.expect_ok()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        for i in range(150):
            with RawClient(n.tcp_address, timeout=3) as c:
                try:
                    c.identify({"feature_negotiation": True, "tls_v1": True}, ssl_context=ctx)
                except (OSError, AssertionError) as e:
                    raise AssertionError(f"TLS upgrade #{i} failed: {e!r}") from None
                c.pub("tls_many", b"%d" % i)  # an OK over TLS
    finally:
        stop.set()
        loader.join(15)


def test_fin_batch_with_bad_ids_in_one_write(node: NsqdProcess) -> None:
    """A run of FIN lines in one packet (the server's batch path) answers exactly like
    separate FINs: an error per bad id, in order, and the good ones finished."""
    with consumer(node.tcp_address, "errs_batch", "c", rdy=20) as c:
        with connect(node) as p:
            p.mpub("errs_batch", [b"%d" % i for i in range(12)])
        ms = c.read_messages(12)
        ids = [m.id for m in ms]
        assert ids[11] != ids[11].upper(), ids  # an id with hex letters
        bad1, bad2 = unknown_id(70001), ids[11].upper()  # ids are compared byte for byte
        c.send(b"".join(v2.fin(x) for x in (ids[0], bad1, ids[1], ids[1], bad2, ids[2])))
        c.expect_error("E_FIN_FAILED", f"FIN {bad1.decode()} failed ID not in flight")
        c.expect_error("E_FIN_FAILED", f"FIN {ids[1].decode()} failed ID not in flight")
        c.expect_error("E_FIN_FAILED", f"FIN {bad2.decode()} failed ID not in flight")
        c.expect_open()
        c.send(b"".join(v2.fin(x) for x in ids[3:]))  # the rest, including the real ids[11]
        c.expect_nothing(0.3)
    st = http_api.channel_stats(node.http_address, "errs_batch", "c")
    assert st is not None and st["in_flight_count"] == 0 and st["depth"] == 0, st
