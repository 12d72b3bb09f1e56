"""Hostile input against one running nsqd: it answers with well-formed frames (an error frame
or nothing), never crashes, keeps its memory bounded, and other clients' data stays intact.

Each fuzz connection sends its bytes, then half-closes (or resets) the socket, and everything
the server sends back is read until it closes: no waiting on timeouts per example.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqx.protocol import v2
from nsqx.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameReader
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient, consumer, split_address

pytestmark = pytest.mark.slow

MAX_MSG = 4096
MAX_BODY = 16384
# upstream's non-fatal errors, and Youzan's for a bad ext header, trace id, tag or
# partition (the command is refused, the connection stays)
NON_FATAL = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED", b"E_INVALID_JSON_HEADER",
             b"INVALID_TRACE_ID", b"E_BAD_TAG", b"E_BAD_PARTITION", b"E_EXT_NOT_SUPPORT")
ERROR_RE = re.compile(rb"^E_[A-Z_]+( |$)")
RSS_LIMIT_KIB = 300 * 1024

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Control:
    """A subscriber and a publisher that must see every message intact, whatever else runs."""

    def __init__(self, node: NsqdProcess) -> None:
        self.node = node
        self.consumer = consumer(node.tcp_address, "fz_control", "c", rdy=100)
        self.n = 0

    def roundtrip(self, count: int = 20) -> None:
        sent = []
        with RawClient(self.node.tcp_address) as p:
            for _ in range(count):
                body = b"ctl-%06d-" % self.n + bytes(range(256)) * 4
                self.n += 1
                p.pub("fz_control", body)
                sent.append(body)
        msgs = self.consumer.read_messages(count, timeout=10)
        self.consumer.send(b"".join(v2.fin(m.id) for m in msgs))
        assert [m.body for m in msgs] == sent
        assert all(m.attempts == 1 for m in msgs)

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    factory = NsqdFactory(Path(tmp_path_factory.mktemp("nsqd-fuzz")))
    try:
        yield factory.start([f"--max-msg-size={MAX_MSG}", f"--max-body-size={MAX_BODY}"])
    finally:
        complaints = factory.close()
    assert not complaints, complaints


@pytest.fixture(scope="module")
def control(node: NsqdProcess) -> Iterator[Control]:
    c = Control(node)
    c.roundtrip(5)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def rss_before(node: NsqdProcess, control: Control) -> int:
    assert node.pid is not None
    return rss_kib(node.pid)


@pytest.fixture(autouse=True)
def healthy_after(node: NsqdProcess, control: Control, rss_before: int) -> Iterator[None]:
    yield
    assert node.is_running(), "nsqd died:\n" + node.all_logs()
    r = http_api.get(node.http_address, "/ping")
    assert (r.status, r.body) == (200, b"OK")
    control.roundtrip()
    assert node.pid is not None
    rss = rss_kib(node.pid)
    assert rss < RSS_LIMIT_KIB, f"RSS {rss} KiB (was {rss_before} KiB)"


# --------------------------------------------------------------------------- helpers


def exchange(node: NsqdProcess, data: bytes, *, magic: bytes = v2.MAGIC_V2,
             reset: bool = False, timeout: float = 10.0) -> list[tuple[int, bytes]]:
    """Send magic+data, half-close (or reset), read until the server closes; return frames."""
    sock = socket.create_connection(split_address(node.tcp_address), timeout=timeout)
    try:
        try:
            sock.sendall(magic + data)
        except OSError:
            pass  # the server may already have closed on a fatal error
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return []
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, "server neither answered nor closed"
            try:
                b = sock.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        sock.close()
    raw = b"".join(chunks)
    reader = FrameReader(max_frame_size=MAX_MSG + 64 * 1024)
    frames = reader.feed(raw)
    assert reader.buffered == 0, f"partial frame at the end of the stream: {raw[-40:]!r}"
    return frames


def check_frames(frames: list[tuple[int, bytes]]) -> None:
    for i, (ftype, data) in enumerate(frames):
        assert ftype in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE), (ftype, data[:100])
        if ftype == FRAME_ERROR:
            assert ERROR_RE.match(data), data[:200]
            if not data.startswith(NON_FATAL):
                assert i == len(frames) - 1, f"frames after fatal error {data!r}: {frames[i + 1:][:3]}"
        elif ftype == FRAME_MESSAGE:
            assert len(data) >= 26


# --------------------------------------------------------------------------- strategies

names = st.sampled_from(["fza", "fzb", "fz.c", "fz_d#ephemeral", "bad!", ""])
ids = st.one_of(st.integers(0, 50).map(lambda n: b"%016x" % n),
                st.binary(min_size=0, max_size=20).map(lambda b: b.hex()[:16].encode()))
small = st.binary(min_size=0, max_size=80)

headers = st.one_of(
    st.none(), st.binary(max_size=20),
    st.dictionaries(st.sampled_from(["a", "##trace_id", "##client_dispatch_tag", "k"]),
                    st.text(alphabet="ab1-_ \x00", max_size=6), max_size=3))

command = st.one_of(
    st.builds(v2.nop),
    st.builds(v2.cls),
    st.builds(v2.rdy, st.integers(0, 3000)),
    st.builds(v2.sub, names, names),
    st.builds(v2.sub_advanced, names, names, st.integers(0, 3),
              st.one_of(st.none(), st.sampled_from(["earliest", "latest", "special:-1",
                                                    "timestamp:0", "msgcount:0", "msgcount:5",
                                                    "virtual_queue:99999999", "bogus:1",
                                                    "timestamp:-1", "msgcount:" + "9" * 30]))),
    st.builds(v2.fin, ids),
    st.builds(v2.req, ids, st.integers(0, 10**7)),
    st.builds(v2.touch, ids),
    st.builds(v2.pub, names, small),
    st.builds(v2.dpub, names, st.integers(0, 10**7), small),
    st.builds(v2.mpub, names, st.lists(small, min_size=0, max_size=5)),
    st.builds(v2.identify, st.fixed_dictionaries(
        {}, optional={"heartbeat_interval": st.integers(-2, 70000),
                      "msg_timeout": st.integers(-1, 10**6),
                      "sample_rate": st.integers(-1, 101),
                      "output_buffer_size": st.integers(-1, 10**5),
                      "client_id": st.text(max_size=10),
                      "extend_support": st.booleans(),
                      "desired_tag": st.sampled_from(["", "blue", "x y", "t" * 101])})),
    st.builds(v2.auth, small),
    st.builds(v2.pub_ext, names, small, headers),
    st.builds(v2.pub_trace, names, st.integers(0, 2**64 - 1), small),
    st.builds(v2.mpub_ext, names, st.lists(st.tuples(headers, small), min_size=1, max_size=3)),
    st.builds(v2.mpub_trace, names, st.lists(st.tuples(st.integers(0, 5), small), min_size=1,
                                             max_size=3)),
    st.sampled_from([b"\n", b"\r\n", b"BOGUS\n", b"PUB\n", b"RDY\n", b"MPUB fza\n\x00\x00\x00\x04",
                     b"FIN 0000000000000000\r\n", b"IDENTIFY\n\xff\xff\xff\xff"]),
)
streams = st.lists(command, max_size=20).map(b"".join)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(streams))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "insert" or not data:
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "flip":
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.integers(0, 255))
        elif op == "delete":
            pos = draw(st.integers(0, len(data) - 1))
            del data[pos:pos + draw(st.integers(1, 8))]
        else:
            del data[draw(st.integers(0, len(data))):]
    return bytes(data)


# --------------------------------------------------------------------------- tests


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_after_magic(node: NsqdProcess, data: bytes) -> None:
    check_frames(exchange(node, data))


@FUZZ
@given(magic=st.binary(min_size=4, max_size=4), data=st.binary(max_size=64))
def test_random_magic(node: NsqdProcess, magic: bytes, data: bytes) -> None:
    frames = exchange(node, data, magic=magic)
    if magic != v2.MAGIC_V2:
        assert frames == [(FRAME_ERROR, b"E_BAD_PROTOCOL")]


@FUZZ
@given(data=mutated())
def test_mutated_command_streams(node: NsqdProcess, data: bytes) -> None:
    check_frames(exchange(node, data))


@FUZZ
@given(data=streams, cut=st.floats(0, 1), reset=st.booleans())
def test_half_frames_then_disconnect(node: NsqdProcess, data: bytes, cut: float,
                                     reset: bool) -> None:
    part = data[: int(len(data) * cut)]
    frames = exchange(node, part, reset=reset)
    if not reset:
        check_frames(frames)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=2000))
def test_random_bytes_after_negotiated_compression(node: NsqdProcess, data: bytes) -> None:
    for feature in ("snappy", "deflate"):
        with RawClient(node.tcp_address) as c:
            c.identify({"feature_negotiation": True, feature: True})
            c.sock.sendall(data)  # raw, not compressed: a corrupt stream
            c.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 5
            while not c.closed_by_peer:
                assert time.monotonic() < deadline, "server did not close a corrupt stream"
                c._recv(deadline)


def test_huge_sizes_do_not_allocate(node: NsqdProcess) -> None:
    limits = {b"PUB fza\n": MAX_MSG, b"DPUB fza 1\n": MAX_MSG, b"MPUB fza\n": MAX_BODY,
              b"IDENTIFY\n": MAX_BODY, b"AUTH\n": MAX_BODY}
    for cmd, limit in limits.items():
        for size in (2**31 - 1, 2**32 - 1, MAX_BODY + 1, MAX_MSG + 1):
            if 0 < size <= limit:
                continue  # within limits: the server waits for the body (then EOF)
            frames = exchange(node, cmd + struct.pack(">I", size) + b"xx")
            assert len(frames) == 1 and frames[0][0] == FRAME_ERROR, (cmd, size, frames)
            check_frames(frames)


def test_slowloris_does_not_block_others(node: NsqdProcess, control: Control) -> None:
    """Connections trickling a PUB byte by byte: everyone else is served meanwhile."""
    n_conns = 20
    errors: list[BaseException] = []
    body = b"trickled-body"
    data = v2.pub("fz_slow", body)

    def trickle() -> None:
        try:
            with RawClient(node.tcp_address, timeout=15) as c:
                for i in range(len(data)):
                    c.sock.sendall(data[i:i + 1])
                    time.sleep(2.0 / len(data))
                c.expect_ok()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=trickle) for _ in range(n_conns)]
    for t in threads:
        t.start()
    try:
        t0 = time.monotonic()
        control.roundtrip(10)
        assert time.monotonic() - t0 < 2.0, "control traffic stalled behind slow clients"
    finally:
        for t in threads:
            t.join(20)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)
    with consumer(node.tcp_address, "fz_slow", "c", rdy=100) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [body] * n_conns


def test_many_connections(node: NsqdProcess, control: Control) -> None:
    socks = []
    try:
        for i in range(300):
            s = socket.create_connection(split_address(node.tcp_address), timeout=5)
            s.sendall(v2.MAGIC_V2 if i % 3 else b"  V")  # some never finish the magic
            socks.append(s)
        control.roundtrip(10)
        # half a PUB on each finished handshake, left hanging: the server keeps waiting
        waiting = [s for i, s in enumerate(socks) if i % 3]
        for s in waiting:
            s.sendall(b"PUB fz_many\n\x00\x00")
        control.roundtrip(10)
        time.sleep(0.5)
        # ... and completes each one when the rest arrives
        for s in waiting:
            s.sendall(b"\x00\x01x")
        for s in waiting:
            reader = FrameReader()
            frames: list[tuple[int, bytes]] = []
            while not frames:
                data = s.recv(64)
                assert data, "server closed a connection that was only slow"
                frames = reader.feed(data)
            assert frames[0] == (FRAME_RESPONSE, b"OK"), frames
    finally:
        for s in socks:
            s.close()
    st = http_api.stats(node.http_address, "fz_many")["topics"][0]
    assert st["message_count"] == 200


def test_unread_output_does_not_grow_memory(node: NsqdProcess, control: Control) -> None:
    """A subscriber that never reads while lots is published: the server must not buffer it all."""
    big = b"z" * MAX_MSG
    s = socket.create_connection(split_address(node.tcp_address), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.sendall(v2.MAGIC_V2 + v2.sub("fz_unread", "c") + v2.rdy(2500))
        with RawClient(node.tcp_address) as p:
            batch = v2.mpub("fz_unread", [big] * 3)
            for _ in range(20):
                p.send(batch * 50)  # 150 x 4 KiB per round, 12 MiB in all
                for _ in range(50):
                    p.expect_ok(10)
        control.roundtrip(5)
    finally:
        s.close()


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mutated(), feature=st.sampled_from(["snappy", "deflate"]))
def test_mutated_streams_over_negotiated_compression(node: NsqdProcess, data: bytes,
                                                     feature: str) -> None:
    """Validly compressed hostile commands: answered (compressed) with well-formed frames."""
    with RawClient(node.tcp_address) as c:
        c.identify({"feature_negotiation": True, feature: True})
        c.try_send(data)
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while not c.closed_by_peer:
            assert time.monotonic() < deadline, "server neither answered nor closed"
            c._recv(deadline)
        check_frames(c.frames)
        assert c.reader.buffered == 0
