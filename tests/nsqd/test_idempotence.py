"""Idempotent publishes on one nsqd: HTTP Idempotency-Key, producer sequences, keyed PUB_EXT."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nsqx.client import Connection, NSQError
from nsqx.protocol import v2
from tests.client.helpers import run, start_fixed
from tests.nsqd.inprocess import running_node
from tests.support.log_checker import stored
from tests.support.nsqd_process import NsqdFactory

KEY = "Idempotency-Key"


def _post(port: int, path: str, body: bytes, key: str | None = None
          ) -> tuple[int, str | None, bytes]:
    headers = {KEY: key} if key is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Idempotent-Replayed"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Idempotent-Replayed"), e.read()


async def _http(port: int, path: str, body: bytes, key: str | None = None
                ) -> tuple[int, str | None, bytes]:
    return await asyncio.get_running_loop().run_in_executor(None, _post, port, path, body, key)


def test_http_idempotency_key_appends_once_and_replays_the_answer(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as n:
            port = n.http_port
            assert await _http(port, "/pub?topic=t", b"a", "k1") == (200, None, b"OK")
            assert await _http(port, "/pub?topic=t", b"a", "k1") == (200, "true", b"OK")
            st, _, body = await _http(port, "/pub?topic=t", b"other", "k1")
            assert st == 422 and b"IDEMPOTENCY_KEY_REUSED" in body and b"different" in body
            st, _, body = await _http(port, "/pub?topic=t2", b"a", "k1")
            assert st == 422 and b"topic t" in body
            assert await _http(port, "/mpub?topic=t", b"m1\nm2", "k2") == (200, None, b"OK")
            assert await _http(port, "/mpub?topic=t", b"m1\nm2", "k2") == (200, "true", b"OK")
            binary = v2.mpub_body([b"m1", b"m2"])  # same messages, another request
            assert (await _http(port, "/mpub?topic=t&binary=true", binary, "k2"))[0] == 422
            assert (await _http(port, "/pub?topic=t&defer=5000", b"d", "k3"))[:2] == (200, None)
            assert (await _http(port, "/pub?topic=t&defer=5000", b"d", "k3"))[:2] == (200, "true")
            ext = "/pub_ext?topic=t&ext=%7B%22%23%23trace_id%22%3A%229%22%7D"
            first = await _http(port, ext, b"e", "k4")
            again = await _http(port, ext, b"e", "k4")
            assert first[0] == 200 and again == (200, "true", first[2])
            assert b'"trace_id":"9"' in first[2]
            # no header: upstream's behaviour (and the fast path), every request appends
            assert await _http(port, "/pub?topic=t", b"p", None) == (200, None, b"OK")
            assert await _http(port, "/pub?topic=t", b"p", None) == (200, None, b"OK")
            st, _, body = await _http(port, "/pub?topic=t", b"p", "")
            assert (st, body) == (400, b'{"message":"INVALID_IDEMPOTENCY_KEY"}')
            assert (await _http(port, "/pub?topic=t", b"p", "x" * 256))[0] == 400
            # a, m1, m2, d, e, p, p
            assert n.topics["t"].log.next_offset == 7
            assert "t2" not in n.topics or n.topics["t2"].log.next_offset == 0
    run(main())


def test_http_key_survives_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as n:
            assert (await _http(n.http_port, "/mpub?topic=r", b"x\ny", "once"))[:2] == (200, None)
        async with running_node(tmp_path) as n:
            # the key's topic is known again after the restart: reused on another, a 422
            st, _, body = await _http(n.http_port, "/pub?topic=r2", b"x", "once")
            assert st == 422 and b"topic r" in body, (st, body)
            assert (await _http(n.http_port, "/mpub?topic=r", b"x\ny", "once"))[:2] == (200, "true")
            assert n.topics["r"].log.next_offset == 2
            assert "r2" not in n.topics or n.topics["r2"].log.next_offset == 0
    run(main())


def _mark(pid: str, epoch: int, seq: int) -> dict[str, str]:
    return {"##nsqx_producer": f"{pid}:{epoch}:{seq}"}


def test_producer_sequences_dedupe_refuse_gaps_and_fence_old_epochs(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                async def pub(seq: int, epoch: int = 0) -> bytes:
                    return await c.command(v2.pub_ext("s", b"m%d" % seq, _mark("abc", epoch, seq)))
                assert await pub(0) == b"OK"
                try:
                    await pub(2)
                    raise AssertionError("a gap was accepted")
                except NSQError as e:
                    assert e.code == "E_OUT_OF_ORDER_SEQUENCE"
                    assert "expected sequence 1, got 2" in str(e)
                assert await pub(1) == b"OK"
                assert await pub(1) == b"OK"  # a retry: answered, not stored
                assert await pub(0) == b"OK"
                assert await c.command(v2.mpub_ext("s", [(_mark("abc", 0, 2), b"x"), (None, b"y")])) == b"OK"
                assert await c.command(v2.mpub_ext("s", [(_mark("abc", 0, 2), b"x"), (None, b"y")])) == b"OK"
                assert await pub(0, epoch=1) == b"OK"  # a new epoch starts again at 0
                try:
                    await pub(3, epoch=0)
                    raise AssertionError("an old epoch was accepted")
                except NSQError as e:
                    assert e.code == "E_PRODUCER_FENCED"
                try:
                    await c.command(v2.pub_ext("s", b"z", {"##nsqx_producer": "bad"}))
                    raise AssertionError("a malformed mark was accepted")
                except NSQError as e:
                    assert e.code == "E_BAD_PRODUCER"
                assert c.is_open  # every refusal above is non-fatal
                assert n.topics["s"].log.next_offset == 5  # m0, m1, x, y, m0 (epoch 1)
            finally:
                c.close()
        # restarted: the sequences are read back (checkpoint and log), a retry is not stored
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                assert await c.command(v2.pub_ext("s", b"m0", _mark("abc", 1, 0))) == b"OK"
                assert n.topics["s"].log.next_offset == 5
            finally:
                c.close()
    run(main())


def test_keyed_pub_ext_is_stored_once(tmp_path: Path) -> None:
    """What a follower forwards for an HTTP key, or any Youzan client may send."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                cmd = v2.pub_ext("k", b"body", {"nsqx-pub": "h/abc#1#f1"})
                assert await c.command(cmd) == b"OK"
                assert await c.command(cmd) == b"OK"
                try:
                    await c.command(v2.pub_ext("k", b"body", {"nsqx-pub": "h/abc#1#f2"}))
                    raise AssertionError("a reused key was accepted")
                except NSQError as e:
                    assert e.code == "E_IDEMPOTENCY_KEY_REUSED"
                assert n.topics["k"].log.next_offset == 1
            finally:
                c.close()
    run(main())


def test_http_key_survives_kill9_and_a_lost_index(nsqd_factory: NsqdFactory) -> None:
    """kill -9 right after the answer, and the index files gone too: the key is read back
    from the log's headers, so the retry is answered and nothing is appended."""
    node = start_fixed(nsqd_factory)
    port = int(node.http_address.rsplit(":", 1)[1])
    assert _post(port, "/pub?topic=k9", b"once", "kill-key")[:2] == (200, None)
    assert _post(port, "/mpub?topic=k9", b"a\nb", "kill-key-2")[:2] == (200, None)
    node.kill()
    node.start()
    # the first keyed request after the restart reuses a key on another topic: 422, as
    # before the kill (the key's topic is read back from the index)
    st, _, body = _post(port, "/pub?topic=other", b"once", "kill-key")
    assert st == 422 and b"topic k9" in body, (st, body)
    node.kill()
    for f in node.data_path.rglob("pubkeys-*"):
        f.unlink()
    node.start()
    assert _post(port, "/pub?topic=k9", b"once", "kill-key") == (200, "true", b"OK")
    assert _post(port, "/mpub?topic=k9", b"a\nb", "kill-key-2") == (200, "true", b"OK")
    assert _post(port, "/pub?topic=k9", b"other", "kill-key")[0] == 422
    assert [b for b, _ in stored(node.http_address, "k9")] == [b"once", b"a", b"b"]


def test_an_unknown_producer_starts_at_sequence_0(tmp_path: Path) -> None:
    """A retried batch 1 that overtakes batch 0 must not make batch 0 look stored."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                with pytest.raises(NSQError, match="expected sequence 0, got 1"):
                    await c.command(v2.pub_ext("u", b"b1", _mark("new", 0, 1)))
                assert await c.command(v2.pub_ext("u", b"b0", _mark("new", 0, 0))) == b"OK"
                assert await c.command(v2.pub_ext("u", b"b1", _mark("new", 0, 1))) == b"OK"
                got = await asyncio.get_running_loop().run_in_executor(
                    None, stored, f"127.0.0.1:{n.http_port}", "u")
                assert [b for b, _ in got] == [b"b0", b"b1"]
            finally:
                c.close()
    run(main())


def test_a_producer_naming_no_partition_sticks_to_one(tmp_path: Path) -> None:
    """On a topic of several partitions its sequences must not be spread over them."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            n.ensure_partitions("multi", 4)
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                for seq in range(6):
                    cmd = v2.pub_ext("multi", b"m%d" % seq, _mark("sticky", 0, seq))
                    assert await c.command(cmd) == b"OK"
            finally:
                c.close()
            counts = sorted(p.log.next_offset for p in n.topics["multi"].partitions)
            assert counts == [0, 0, 0, 6]
    run(main())


class _AckGate:
    """A leader's gate whose acknowledgements the test gives (cluster.gates.LeaderGate's
    wrap contract): appends wait in ``waiters`` until ``ack``."""

    forwards = False

    def __init__(self) -> None:
        self.waiters: list[tuple[int, int, object]] = []

    def refuse(self, topic: object, count: int) -> None:
        return None

    def wrap(self, topic: object, end: int, done):  # type: ignore[no-untyped-def]
        def committed(base: int, exc: Exception | None) -> None:
            self.waiters.append((end, base, done)) if exc is None else done(base, exc)
        return committed

    def refuse_consumers(self, topic: object) -> None:
        return None

    def ack(self, part, end: int) -> None:  # type: ignore[no-untyped-def]
        part.advance_readable(end)
        for _w_end, base, done in [w for w in self.waiters if w[0] <= end]:
            done(base, None)
        self.waiters = [w for w in self.waiters if w[0] > end]


def test_a_new_leader_answers_a_retry_from_its_predecessors_unacked_tail(tmp_path: Path) -> None:
    """A failover: the first copy of a keyed publish and of a producer's batch were
    replicated here by the old leader, which died before the high watermark covered them.
    Their retries reach this node, now the leader: nothing is appended again, and each is
    answered only once the new leader's ISR acknowledges the copy it already holds (CI saw
    ``http-13`` stored twice before)."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                assert await c.command(v2.pub_ext("f", b"early", {"nsqx-pub": "h/e#1#f0"})) == b"OK"
                part = n.topics["f"]
                assert part.dedupe is not None and part.dedupe.keys.covered == 1
                # what replication from the old leader appended (not through this deduper)
                for body, h in ((b"keyed", {"nsqx-pub": b"h/k#1#f1"}),
                                (b"seq0", {"##nsqx_producer": b"p1:0:0"})):
                    fut = part.publish([body], 0, headers=[h])
                    assert fut is not None
                    await fut
                gate = _AckGate()
                part.attach_gate(gate)  # type: ignore[arg-type]  # this node leads now
                part.advance_readable(1)  # the high watermark it learned: below the tail
                assert part.readable_end == 1 and part.log.flushed_offset == 3

                keyed = asyncio.ensure_future(
                    c.command(v2.pub_ext("f", b"keyed", {"nsqx-pub": "h/k#1#f1"})))
                seq = asyncio.ensure_future(
                    c.command(v2.pub_ext("f", b"seq0", _mark("p1", 0, 0))))
                await asyncio.sleep(0.2)
                assert not keyed.done() and not seq.done()  # not acknowledged yet
                assert part.log.next_offset == 3  # and nothing appended again
                gate.ack(part, 3)
                assert await asyncio.wait_for(keyed, 5) == b"OK"
                assert await asyncio.wait_for(seq, 5) == b"OK"
                assert part.log.next_offset == 3
                # the next sequence follows the inherited one
                nxt2 = asyncio.ensure_future(c.command(v2.pub_ext("f", b"seq1", _mark("p1", 0, 1))))
                await asyncio.sleep(0.1)
                gate.ack(part, 4)
                assert await asyncio.wait_for(nxt2, 5) == b"OK"
                assert part.log.next_offset == 4
            finally:
                c.close()
    run(main())


def test_a_cut_tail_is_forgotten_by_the_index(tmp_path: Path) -> None:
    """A follower's diverged tail is truncated: a key stored only there is not stored any
    more, so its retry must be appended (not answered from the index)."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                assert await c.command(v2.pub_ext("cut", b"a", {"nsqx-pub": "h/a#1#f"})) == b"OK"
                assert await c.command(v2.pub_ext("cut", b"b", {"nsqx-pub": "h/b#1#f"})) == b"OK"
                part = n.topics["cut"]
                part.truncate_to(1)
                assert part.dedupe.keys.get("h/b") is None and part.dedupe.keys.get("h/a")
                assert await c.command(v2.pub_ext("cut", b"b", {"nsqx-pub": "h/b#1#f"})) == b"OK"
                assert await c.command(v2.pub_ext("cut", b"a", {"nsqx-pub": "h/a#1#f"})) == b"OK"
                assert part.log.next_offset == 2
            finally:
                c.close()
    run(main())


class _StubLog:
    flushed_offset = 0
    start_offset = 0
    next_offset = 0

    def headers_range(self, lo: int, hi: int) -> dict:
        return {}


class _StubPart:
    """A partition whose appends the test finishes (or refuses) by hand."""

    name, partition, gate, hold_reads = "stub", 0, None, False

    def __init__(self) -> None:
        self.log = _StubLog()
        self.appends: list[tuple[list[bytes], object]] = []
        self.refuse: Exception | None = None

    def publish(self, bodies, defer_ms, done, headers=None, producer=""):  # type: ignore[no-untyped-def]
        if self.refuse is not None:
            raise self.refuse
        self.appends.append((bodies, done))


def test_a_sequence_in_flight_answers_its_repeats_and_a_failed_one_is_taken_again() -> None:
    from nsqx.nsqd.idempotence import Deduper, IdempotenceError
    from nsqx.storage.publish_keys import PRODUCER_HEADER, PublishKeys

    async def main() -> None:
        part = _StubPart()
        d = Deduper(part, PublishKeys(None, part.log))
        got: list[tuple[str, int, object]] = []

        def done(tag: str):  # type: ignore[no-untyped-def]
            return lambda base, exc: got.append((tag, base, exc))

        def mark(seq: int) -> list:
            return [{PRODUCER_HEADER: b"p:0:%d" % seq}, None]

        assert d.publish([b"a", b"b"], 0, mark(0), done("first")) is False
        assert d.publish([b"a", b"b"], 0, mark(0), done("repeat")) is True  # waits for it
        assert got == [] and len(part.appends) == 1
        part.log.flushed_offset = 2
        part.appends[0][1](0, None)
        assert got == [("first", 0, None), ("repeat", 0, None)]
        assert d.keys.covered == 2 and d.keys.producer("p").seq == 0
        assert d.publish([b"a", b"b"], 0, mark(0), done("late")) is True  # from the index
        assert got[-1] == ("late", 0, None)
        # a failed append: not stored, so the producer's retry of the sequence is taken
        boom = RuntimeError("disk")
        assert d.publish([b"c"], 0, mark(1), done("fails")) is False
        part.appends[1][1](-1, boom)
        assert got[-1] == ("fails", -1, boom)
        part.refuse = RuntimeError("refused")  # refused before anything was written
        assert d.publish([b"c"], 0, mark(1), done("refused")) is False
        assert got[-1][0] == "refused" and got[-1][2] is part.refuse
        part.refuse = None
        assert d.publish([b"c"], 0, mark(1), done("again")) is False
        part.log.flushed_offset = 3
        part.appends[2][1](2, None)
        assert got[-1] == ("again", 2, None)
        with pytest.raises(IdempotenceError, match="expected sequence 2"):
            d.publish([b"d"], 0, mark(3), done("gap"))
        d.close()
    run(main())


def test_nsqx_controls_on_pub_ext_delay_and_replayed_answers(tmp_path: Path) -> None:
    """``##nsqx_defer`` defers a PUB_EXT/MPUB_EXT batch (an idempotent producer's dpublish,
    a follower's forward); ``##nsqx_ask_replayed`` makes a repeat's answer say so. Both are
    taken off the headers, never stored."""
    async def main() -> None:
        async with running_node(tmp_path) as n:
            c = Connection(f"127.0.0.1:{n.tcp_port}")
            await c.connect()
            try:
                await c.command(v2.sub("ctl", "ch"))
                ask = {"nsqx-pub": "h/q#1#f", v2.ASK_REPLAYED_KEY: "1"}
                assert await c.command(v2.pub_ext("ctl", b"a", ask)) == b"OK"
                assert await c.command(v2.pub_ext("ctl", b"a", ask)) == b"OK REPLAYED"
                # not asked: the plain answer (what any Youzan client gets)
                assert await c.command(v2.pub_ext("ctl", b"a", {"nsqx-pub": "h/q#1#f"})) == b"OK"
                traced = {**ask, "nsqx-pub": "h/t#1#f", "##trace_id": "5"}
                first = await c.command(v2.pub_ext("ctl", b"t", traced))
                assert await c.command(v2.pub_ext("ctl", b"t", traced)) == first + b" REPLAYED"
                seq = {**_mark("dp", 0, 0), v2.DEFER_KEY: "3600000"}
                assert await c.command(v2.pub_ext("ctl", b"d", seq)) == b"OK"
                assert await c.command(v2.pub_ext("ctl", b"d", seq)) == b"OK"
                assert await c.command(v2.mpub_ext("ctl", [({v2.DEFER_KEY: "3600000"}, b"m1"),
                                                           (None, b"m2")])) == b"OK"
                try:
                    await c.command(v2.pub_ext("ctl", b"x", {v2.DEFER_KEY: "9" * 12}))
                    raise AssertionError("a delay over --max-delay was accepted")
                except NSQError as e:
                    assert e.code == "E_INVALID" and "out of range" in str(e)
                assert c.is_open  # non-fatal
                part = n.topics["ctl"]
                assert part.log.next_offset == 5  # a, t, d, m1, m2
                assert part.channels["ch"].deferred_count == 3  # d, m1, m2
                for h in part.log.headers_range(0, 5).values():
                    assert not {v2.DEFER_KEY, v2.ASK_REPLAYED_KEY} & set(h), h
            finally:
                c.close()
    run(main())
