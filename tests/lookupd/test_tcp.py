"""nsqlookupd's TCP protocol (magic "  V1") with raw sockets against a real process:
every command, every error (all fatal: answer then close), registrations following the
connection."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import quote

import pytest

from nsqx.protocol import lookup_v1 as lk
from tests.lookupd.rawpeer import RawPeer, body_size, ident
from tests.support.lookupd_process import LookupdProcess


@pytest.fixture
def lookupd(shared_lookupd: LookupdProcess) -> LookupdProcess:
    return shared_lookupd


def peer(lookupd: LookupdProcess, **kw) -> RawPeer:
    return RawPeer(lookupd.tcp_address, **kw)


def lookup(lookupd: LookupdProcess, topic: str) -> tuple[int, dict]:
    return lookupd.get_json(f"/lookup?topic={quote(topic)}")


def wait_for(pred, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.02)


def test_bad_magic(lookupd):
    with peer(lookupd, magic=b"  V2") as p:
        p.expect_error(b"E_BAD_PROTOCOL")
    with peer(lookupd, magic=b"GET / HTTP/1.1\r\n\r\n") as p:
        p.expect_error(b"E_BAD_PROTOCOL")


def test_magic_split_and_early_close(lookupd):
    with peer(lookupd, magic=None) as p:
        for b in b"  V1":
            p.send(bytes([b]))
            time.sleep(0.01)
        assert p.call(b"PING\n") == b"OK"
    # closing before the magic is complete is harmless
    s = socket.create_connection(("127.0.0.1", lookupd.tcp_port))
    s.sendall(b" ")
    s.close()
    assert lookupd.get_json("/info")[0] == 200


def test_ping_before_identify(lookupd):
    with peer(lookupd) as p:
        assert p.call(b"PING\n") == b"OK"
        assert p.call(b"PING extra params\n") == b"OK"


def test_identify_response(lookupd):
    with peer(lookupd) as p:
        raw = p.call(lk.identify(ident()))
        resp = json.loads(raw)
        # a Go map: keys sorted; the real bound ports
        assert list(resp) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
        assert resp["tcp_port"] == lookupd.tcp_port
        assert resp["http_port"] == lookupd.http_port
        assert resp["version"] == "1.3.0"
        assert resp["broadcast_address"] == "127.0.0.1"
        assert resp["hostname"] == socket.gethostname()
        assert p.call(b"PING\n") == b"OK"


def test_identify_again(lookupd):
    with peer(lookupd) as p:
        p.identify()
        # refused before the body is read (only the line is sent)
        p.send(b"IDENTIFY\n")
        p.expect_error(b"E_INVALID cannot IDENTIFY again")
    with peer(lookupd) as p:
        # both in one write
        p.send(lk.identify(ident()) + lk.identify(ident()))
        json.loads(p.read())
        p.expect_error(b"E_INVALID cannot IDENTIFY again")


@pytest.mark.parametrize("body, err", [
    (b"not json", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b'{"tcp_port": "4150"}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"[1,2]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"{}", b"E_BAD_BODY IDENTIFY missing fields"),
    (json.dumps(ident(broadcast_address="")).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
    (json.dumps(ident(version="")).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
    (json.dumps({**ident(), "tcp_port": 0}).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
    (json.dumps({**ident(), "http_port": None}).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
])
def test_identify_bad_body(lookupd, body, err):
    with peer(lookupd) as p:
        p.send(b"IDENTIFY\n" + body_size(len(body)) + body)
        p.expect_error(err)


def test_identify_unknown_keys_ignored(lookupd):
    with peer(lookupd) as p:
        resp = p.identify({**ident(), "short_id": "x", "extra": {"a": [1]}})
        assert resp["tcp_port"] == lookupd.tcp_port


@pytest.mark.parametrize("size", [-1, -(2**31), 1024 * 1024 + 1, 2**31 - 1])
def test_identify_bad_size(lookupd, size):
    with peer(lookupd) as p:
        p.send(b"IDENTIFY\n" + body_size(size))
        p.expect_error(f"E_BAD_BODY IDENTIFY invalid body size {size}".encode())


@pytest.mark.parametrize("cmd", [b"REGISTER t\n", b"REGISTER t c\n", b"UNREGISTER t\n",
                                 b"UNREGISTER t c\n", b"REGISTER\n"])
def test_must_identify(lookupd, cmd):
    with peer(lookupd) as p:
        p.send(cmd)
        p.expect_error(b"E_INVALID client must IDENTIFY")


@pytest.mark.parametrize("cmd, err", [
    (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
    (b"REGISTER bad!topic\n", b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
    (b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
    (b"REGISTER " + b"t" * 65 + b"\n",
     b"E_BAD_TOPIC REGISTER topic name '" + b"t" * 65 + b"' is not valid"),
    (b"UNREGISTER t bad:chan\n",
     b"E_BAD_CHANNEL UNREGISTER channel name 'bad:chan' is not valid"),
    (b"REGISTER t c#ephemeralx\n",
     b"E_BAD_CHANNEL REGISTER channel name 'c#ephemeralx' is not valid"),
    (b"REGISTER t\xff\n", b"E_BAD_TOPIC REGISTER topic name 't\xff' is not valid"),
])
def test_register_param_errors(lookupd, cmd, err):
    with peer(lookupd) as p:
        p.identify()
        p.send(cmd)
        p.expect_error(err)


@pytest.mark.parametrize("line, err", [
    (b"NOPE\n", b"E_INVALID invalid command NOPE"),
    (b"\n", b"E_INVALID invalid command "),
    (b"ping\n", b"E_INVALID invalid command ping"),
    (b"PUB t\n", b"E_INVALID invalid command PUB"),
    (b"\x00\xff\n", b"E_INVALID invalid command \x00\xff"),
])
def test_invalid_command(lookupd, line, err):
    with peer(lookupd) as p:
        p.send(line)
        p.expect_error(err)


def test_line_too_long(lookupd):
    with peer(lookupd) as p:
        p.send(b"REGISTER " + b"x" * 20000)
        got = p.read()
        assert got.startswith(b"E_INVALID command line too long")
        p.expect_closed()


def test_commands_before_an_error_run_first(lookupd):
    with peer(lookupd) as p:
        p.send(lk.identify(ident(6001)) + b"REGISTER t_before c\nPING\nBOGUS\nPING\n")
        json.loads(p.read())
        assert p.read() == b"OK"
        assert p.read() == b"OK"
        p.expect_error(b"E_INVALID invalid command BOGUS")


def test_register_lookup_unregister(lookupd):
    with peer(lookupd) as p:
        p.identify(ident(5001, hostname="host-a", topology_zone="z1", topology_region="r1"))
        assert p.call(lk.register("tcp_t1", "c1")) == b"OK"
        assert p.call(lk.register("tcp_t1", "c1")) == b"OK"  # idempotent
        assert p.call(lk.register("tcp_t1")) == b"OK"
        status, data = lookup(lookupd, "tcp_t1")
        assert status == 200
        assert data["channels"] == ["c1"]
        assert data["producers"] == [{
            "remote_address": p.local_address, "hostname": "host-a",
            "broadcast_address": "127.0.0.1", "tcp_port": 5001, "http_port": 5002,
            "version": "1.3.0", "topology_zone": "z1", "topology_region": "r1"}]
        assert "tcp_t1" in lookupd.get_json("/topics")[1]["topics"]
        assert lookupd.get_json("/channels?topic=tcp_t1")[1] == {"channels": ["c1"]}
        nodes = [n for n in lookupd.get_json("/nodes")[1]["producers"]
                 if n["remote_address"] == p.local_address]
        assert len(nodes) == 1
        assert nodes[0]["topics"] == ["tcp_t1"] and nodes[0]["tombstones"] == [False]

        # UNREGISTER a channel: the producer leaves it, the (durable) channel stays listed
        assert p.call(lk.unregister("tcp_t1", "c1")) == b"OK"
        assert p.call(lk.unregister("tcp_t1", "c1")) == b"OK"  # not registered: still OK
        debug = lookupd.get_json("/debug")[1]
        assert "channel:tcp_t1:c1" not in debug
        assert lookup(lookupd, "tcp_t1")[1]["channels"] == ["c1"]
        # UNREGISTER the topic: producer gone, registration stays (non-ephemeral)
        assert p.call(lk.unregister("tcp_t1")) == b"OK"
        assert lookup(lookupd, "tcp_t1") == (200, {"channels": ["c1"], "producers": []})


def test_unregister_topic_takes_this_peers_channels(lookupd):
    with peer(lookupd) as a, peer(lookupd) as b:
        a.identify(ident(5101))
        b.identify(ident(5201))
        for p in (a, b):
            assert p.call(lk.register("tcp_t2", "c1")) == b"OK"
        assert a.call(lk.register("tcp_t2", "c2")) == b"OK"
        assert a.call(lk.unregister("tcp_t2")) == b"OK"
        debug = lookupd.get_json("/debug")[1]
        assert [e["id"] for e in debug["channel:tcp_t2:c1"]] == [b.local_address]
        assert "channel:tcp_t2:c2" not in debug
        assert [e["id"] for e in debug["topic:tcp_t2:"]] == [b.local_address]
        assert [x["tcp_port"] for x in lookup(lookupd, "tcp_t2")[1]["producers"]] == [5201]


def test_ephemeral_registrations_go_with_last_producer(lookupd):
    with peer(lookupd) as a, peer(lookupd) as b:
        a.identify(ident(5301))
        b.identify(ident(5401))
        for p in (a, b):
            assert p.call(lk.register("tcp_t3", "e#ephemeral")) == b"OK"
            assert p.call(lk.register("tcp_t3#ephemeral")) == b"OK"
        assert a.call(lk.unregister("tcp_t3", "e#ephemeral")) == b"OK"
        assert lookup(lookupd, "tcp_t3")[1]["channels"] == ["e#ephemeral"]
        assert b.call(lk.unregister("tcp_t3", "e#ephemeral")) == b"OK"
        assert lookup(lookupd, "tcp_t3")[1]["channels"] == []
        assert a.call(lk.unregister("tcp_t3#ephemeral")) == b"OK"
        assert lookup(lookupd, "tcp_t3#ephemeral")[0] == 200
        assert b.call(lk.unregister("tcp_t3#ephemeral")) == b"OK"
        assert lookup(lookupd, "tcp_t3#ephemeral")[0] == 404


def test_close_removes_all_registrations(lookupd):
    a = peer(lookupd)
    a.identify(ident(5501))
    for line in (lk.register("tcp_t4", "c1"), lk.register("tcp_t4b")):
        assert a.call(line) == b"OK"
    addr = a.local_address
    debug = lookupd.get_json("/debug")[1]
    assert any(e["id"] == addr for e in debug["client::"])
    a.close()

    def gone():
        d = lookupd.get_json("/debug")[1]
        return not any(e["id"] == addr for entries in d.values() for e in entries)

    assert wait_for(gone)
    # upstream keeps the (now empty) registrations
    assert lookup(lookupd, "tcp_t4") == (200, {"channels": ["c1"], "producers": []})
    assert not any(n["remote_address"] == addr for n in lookupd.get_json("/nodes")[1]["producers"])


def test_ping_updates_last_update(lookupd):
    with peer(lookupd) as p:
        p.identify(ident(5601))
        assert p.call(lk.register("tcp_t5")) == b"OK"
        first = lookupd.get_json("/debug")[1]["topic:tcp_t5:"][0]["last_update"]
        time.sleep(0.05)
        assert p.call(lk.ping()) == b"OK"
        entry = lookupd.get_json("/debug")[1]["topic:tcp_t5:"][0]
        assert entry["last_update"] > first
        assert entry["tombstoned"] is False
        assert list(entry) == sorted(entry)


def test_pipelined_and_byte_by_byte(lookupd):
    stream = (lk.identify(ident(5701)) + lk.register("tcp_t6", "c") + lk.ping()
              + lk.unregister("tcp_t6", "c") + lk.ping())
    with peer(lookupd) as p:
        p.send(stream)
        assert json.loads(p.read())["tcp_port"] == lookupd.tcp_port
        assert [p.read() for _ in range(4)] == [b"OK"] * 4
    with peer(lookupd) as p:
        p.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(stream)):
            p.send(stream[i:i + 1])
        assert json.loads(p.read())["tcp_port"] == lookupd.tcp_port
        assert [p.read() for _ in range(4)] == [b"OK"] * 4


def test_peer_that_never_reads(lookupd):
    """Flow control: a peer pipelining without reading is paused, not buffered forever."""
    s = socket.create_connection(("127.0.0.1", lookupd.tcp_port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"  V1")
    s.settimeout(0.5)
    sent = 0
    chunk = b"PING\n" * 20000
    try:
        for _ in range(200):
            sent += s.send(chunk)
    except (TimeoutError, BlockingIOError):
        pass
    # the server stopped reading long before it buffered everything as answers
    assert sent < 200 * len(chunk)
    assert lookupd.get_json("/info")[0] == 200
    s.close()
    assert lookupd.get_json("/info")[0] == 200
