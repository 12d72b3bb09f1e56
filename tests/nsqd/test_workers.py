"""``nsqd --workers=2`` (issue 32, first step): real processes, one node to the outside.

Every test starts a node of two workers on free loopback ports (tests/support); topics are
picked so that each worker owns some, and every connection publishes to topics of both,
so whichever worker the kernel gives a connection to, publishes are forwarded and SUBs
handed over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
from collections import Counter
from pathlib import Path

import pytest

from nsqx.client import Consumer, Message, Producer
from nsqx.nsqd.workers.ownership import owner_of
from nsqx.protocol import v2
from tests.support import http_api
from tests.support.certs import TLSFiles
from tests.support.clients import pynsq_runner
from tests.support.compat_suite import assert_ok
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import RawClient

WORKERS = ["--workers=2"]


def topics_of_both(n: int = 4, prefix: str = "wt") -> list[str]:
    """``n`` topic names, half owned by each of two workers."""
    names: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in names.values()) < n // 2:
        name = f"{prefix}{i}"
        names[owner_of(name, 2)].append(name)
        i += 1
    return names[0][: n // 2] + names[1][: n // 2]


def wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def workers_up(node: NsqdProcess, n: int = 2) -> None:
    wait_for(lambda: node.log_bytes().count(b"workers: worker ") >= n
             and node.log_bytes().count(b" ready (internal sockets") >= n, what="workers ready")


async def consume(tcp: str, topic: str, expect: int, channel: str = "c",
                  idle: float = 0.5, limit: float = 20.0) -> list[bytes]:
    got: list[bytes] = []

    async def handle(m: Message) -> None:
        got.append(m.body)

    c = Consumer(topic, channel, handle, nsqd_tcp_addresses=[tcp], max_in_flight=100)
    await c.start()
    try:
        deadline = time.monotonic() + limit
        while len(got) < expect and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(idle)  # nothing more may come
    finally:
        await c.close()
    return got


async def _publish(tcp: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer([tcp]) as p:
        for body in bodies:
            await p.publish(topic, body)


def worker_pid(node: NsqdProcess, k: int) -> int | None:
    """The pid of worker ``k`` (its environment says which it is)."""
    for pid in node.children():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var.startswith(b"NSQX_WORKER=") and json.loads(var[12:])["index"] == k:
                return pid
    return None


def stats_topics(node: NsqdProcess) -> Counter[str]:
    return Counter(t["topic_name"] for t in http_api.stats(node.http_address)["topics"])


@pytest.mark.timeout(120)
def test_publish_over_tcp_and_http_read_back_with_sub_and_nsqx_client(
        nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    assert len(node.children()) == 2
    topics = topics_of_both(4)
    expected: dict[str, list[bytes]] = {t: [] for t in topics}

    async def publish() -> None:
        for i in range(6):  # six connections: the kernel gives them to either worker
            async with Producer([node.tcp_address]) as p:
                for t in topics:
                    body = f"tcp-{i}-{t}".encode()
                    await p.publish(t, body)
                    bodies = [f"mpub-{i}-{t}-{j}".encode() for j in range(3)]
                    await p.mpublish(t, bodies)
                    expected[t] += [body, *bodies]
    asyncio.run(publish())
    for i in range(6):  # a connection each (urllib): both workers' fast path and proxy
        for t in topics:
            body = f"http-{i}-{t}".encode()
            assert http_api.pub(node.http_address, t, body).status == 200
            expected[t].append(body)
            bodies = [f"hm-{i}-{t}-{j}".encode() for j in range(2)]
            assert http_api.mpub(node.http_address, t, bodies).status == 200
            expected[t] += bodies
    # one node: every topic once in /stats, whichever worker answers
    for _ in range(4):
        assert stats_topics(node) == Counter(topics)
    depth = {t["topic_name"]: t["depth"] for t in http_api.stats(node.http_address)["topics"]}
    assert depth == {t: len(expected[t]) for t in topics}
    # raw SUB (handed over when the connection lands on the other worker), then the
    # nsqx.client Consumer, each reading one topic of each worker
    for t0 in (topics[0], topics[2]):
        with RawClient(node.tcp_address) as c:
            c.identify({"client_id": "raw"})
            c.subscribe(t0, "c", rdy=100)
            msgs = c.read_messages(len(expected[t0]), timeout=10)
            assert Counter(m.body for m in msgs) == Counter(expected[t0])
            for m in msgs:
                c.send(b"FIN " + m.id + b"\n")
            c.send(b"NOP\n")
            c.expect_nothing(0.3)
    for t in (topics[1], topics[3]):
        got = asyncio.run(consume(node.tcp_address, t, len(expected[t])))
        assert Counter(got) == Counter(expected[t]), t
    for t in topics:
        ch = http_api.channel_stats(node.http_address, t, "c")
        assert ch is not None and (ch["depth"], ch["in_flight_count"]) == (0, 0), ch
    assert not node.died_unexpectedly()


@pytest.mark.compat
@pytest.mark.timeout(120)
def test_pynsq_publishes_and_consumes_through_both_workers(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    runner = pynsq_runner()
    for t in topics_of_both(2, prefix="py"):
        bodies = [f"{t}-{i}".encode() for i in range(5)]
        ops = [{"op": "pub", "topic": t, "body": bodies[0].hex()},
               {"op": "mpub", "topic": t, "bodies": [b.hex() for b in bodies[1:]]}]
        pub = runner.run("publish", {"nsqd": node.tcp_address, "ops": ops, "conn": {}})
        assert_ok(pub, 2)
        sub = runner.run("consume", {"nsqd": node.tcp_address, "conn": {}, "topic": t,
                                     "channel": "py", "idle_s": 1.0, "expect": len(bodies)})
        assert Counter(sub.bodies()) == Counter(bodies), sub.describe()


@pytest.mark.timeout(120)
def test_kill9_of_a_worker_restarts_it_and_loses_nothing_acknowledged(
        nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    topics = topics_of_both(2, prefix="k")  # topics[0] is worker 0's, topics[1] worker 1's
    acked: dict[str, list[bytes]] = {t: [] for t in topics}
    for t in topics:  # "c" first: it gets every message (a later channel starts at the end)
        assert http_api.post(node.http_address, "/topic/create", topic=t).status == 200
        assert http_api.post(node.http_address, "/channel/create", topic=t,
                             channel="c").status == 200
        for i in range(20):
            body = f"before-{t}-{i}".encode()
            assert http_api.pub(node.http_address, t, body).status == 200
            acked[t].append(body)
    # a consumer of worker 0's topic (on worker 0 whichever worker accepted it: a SUB
    # elsewhere is handed over) must not notice worker 1's death
    survivor = RawClient(node.tcp_address)
    waiting = None
    try:
        survivor.identify({"client_id": "survivor"})
        survivor.subscribe(topics[0], "live", rdy=100)
        victim = worker_pid(node, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        # reaped by the supervisor (every thread gone: its sockets are closed); the new
        # worker takes a moment to start
        wait_for(lambda: victim not in node.children(), what="the worker reaped")
        # /stats (worker 0 answers: the other is down) waits for the restarting worker's
        # part instead of failing (it was a 500: a NameError in the error path)
        r = http_api.get(node.http_address, "/stats", format="json")
        assert r.status == 200, r
        assert sorted(t["topic_name"] for t in r.json()["topics"]) == sorted(topics)
        # a SUB for the dead worker's topic (accepted by worker 0, the only one accepting
        # now) waits for the owner to be back instead of being refused
        waiting = RawClient(node.tcp_address)
        waiting.identify({"client_id": "waiting"})
        waiting.send(v2.sub(topics[1], "late"))
        # the other worker keeps serving: publishes (HTTP and TCP connections the kernel
        # gives to worker 0 only while worker 1 is down) reach the consumer it already had
        during = [f"during-{i}".encode() for i in range(10)]
        for body in during[:5]:
            assert http_api.pub(node.http_address, topics[0], body).status == 200
        asyncio.run(_publish(node.tcp_address, topics[0], during[5:]))
        acked[topics[0]] += during
        got = survivor.read_messages(len(during), timeout=15)
        assert Counter(m.body for m in got) == Counter(during)
        for m in got:
            survivor.send(b"FIN " + m.id + b"\n")
        wait_for(lambda: len(node.children()) == 2 and victim not in node.children(),
                 what="the worker restarted")
        assert b"killed by SIGKILL): restarting it" in node.log_bytes()
        workers_up(node, 3)  # the new one is ready too
        survivor.send(b"NOP\n")  # the same connection, through the restart
        survivor.expect_nothing(0.3)
        waiting.expect_ok(timeout=15)
        waiting.send(v2.rdy(10))
        assert http_api.pub(node.http_address, topics[1], b"to-the-waiting").status == 200
        acked[topics[1]].append(b"to-the-waiting")
        m = waiting.read_message(10)
        assert m.body == b"to-the-waiting"
        waiting.send(b"FIN " + m.id + b"\n")
    finally:
        survivor.close()
        if waiting is not None:
            waiting.close()
    for t in topics:  # the restarted worker's topics take publishes again
        for i in range(5):
            body = f"after-{t}-{i}".encode()
            assert http_api.pub(node.http_address, t, body).status == 200
            acked[t].append(body)
    for t in topics:
        got = asyncio.run(consume(node.tcp_address, t, len(acked[t])))
        assert Counter(got) == Counter(acked[t]), t
    assert node.is_running()


@pytest.mark.timeout(120)
def test_sigterm_stops_every_worker_and_one_process_finds_everything(
        nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    topics = topics_of_both(4, prefix="s")
    for t in topics:
        assert http_api.mpub(node.http_address, t, [b"a", b"b", b"c"]).status == 200
    assert http_api.post(node.http_address, "/channel/create", topic=topics[0],
                         channel="kept").status == 200
    assert http_api.post(node.http_address, "/topic/pause", topic=topics[1]).status == 200
    workers = node.children()
    assert node.stop() == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in _status(pid)
    log = node.log_bytes()
    assert log.count(b"NSQ: bye") == 3  # two workers and the supervisor
    data = node.data_path
    assert (data / "nsqd.dat").exists() and not list(data.glob("nsqd.w*.dat"))
    # --workers=1 (the default) on the same data: one process, every topic as it was
    node.args = []
    node.start()
    assert node.children() == []
    st = {t["topic_name"]: t for t in http_api.stats(node.http_address)["topics"]}
    assert set(st) == set(topics)
    assert [c["channel_name"] for c in st[topics[0]]["channels"]] == ["kept"]
    assert st[topics[0]]["channels"][0]["depth"] == 3
    assert st[topics[1]]["paused"] is True
    assert all(st[t]["depth"] == 3 for t in topics[1:])
    # and back to three workers: each finds the topics it owns now
    node.stop()
    node.args = ["--workers=3"]
    node.start()
    workers_up(node, 3)
    st = {t["topic_name"]: t for t in http_api.stats(node.http_address)["topics"]}
    assert set(st) == set(topics) and st[topics[1]]["paused"] is True


def _status(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes().lower()
    except OSError:
        return b"zombie"


@pytest.mark.timeout(120)
def test_a_worker_that_keeps_dying_stops_the_node_with_the_reason(
        nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    for _ in range(5):  # worker 1, five times (it is started again each time)
        wait_for(lambda: not node.is_running() or worker_pid(node, 1) is not None,
                 what="worker 1")
        pid = worker_pid(node, 1)
        if pid is None:
            break
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=pid: not node.is_running() or worker_pid(node, 1) != p,
                 what="a new worker 1")
    assert node.proc is not None
    assert node.proc.wait(30) == 1
    node._expected_exit = True
    assert b"worker 1 exited 5 times within 60 s" in node.log_bytes()
    assert b"stopping the node" in node.log_bytes()


def test_workers_1_is_one_process(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start(["--workers=1"])
    assert node.children() == []
    assert http_api.pub(node.http_address, "one", b"x").status == 200
    assert b"workers:" not in node.log_bytes() and b"[nsqd w0]" not in node.log_bytes()


@pytest.mark.timeout(120)
def test_lookupd_sees_one_node_with_every_workers_topics(
        nsqd_factory: NsqdFactory, lookupd_factory) -> None:  # type: ignore[no-untyped-def]
    ld = lookupd_factory.start()
    node = nsqd_factory.start([*WORKERS, f"--lookupd-tcp-address={ld.tcp_address}",
                               "--broadcast-address=127.0.0.1"])
    workers_up(node)
    topics = topics_of_both(4, prefix="l")
    for t in topics:
        assert http_api.pub(node.http_address, t, b"x").status == 200
        assert http_api.post(node.http_address, "/channel/create", topic=t,
                             channel="ch").status == 200

    def producers() -> list[dict]:  # type: ignore[type-arg]
        r = http_api.get(ld.http_address, "/nodes")
        return r.json()["producers"] if r.status == 200 else []

    def registered() -> bool:
        ps = producers()
        return len(ps) == 1 and sorted(ps[0]["topics"]) == sorted(topics)
    wait_for(registered, what=f"one producer with {topics} in lookupd")
    (p,) = producers()
    assert p["tcp_port"] == node.tcp_port and p["http_port"] == node.http_port
    for t in topics:
        r = http_api.get(ld.http_address, "/lookup", topic=t)
        assert r.status == 200 and r.json()["channels"] == ["ch"], (t, r.body)
    # a restarted worker 1 registers its topics again (through worker 0)
    victim = worker_pid(node, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: worker_pid(node, 1) not in (None, victim), what="worker 1 again")
    workers_up(node, 3)
    wait_for(registered, what="registered after the restart")
    # a restarted worker 0 (the one connected to lookupd) registers everything again
    victim = worker_pid(node, 0)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: worker_pid(node, 0) not in (None, victim), what="worker 0 again")
    workers_up(node, 4)
    wait_for(registered, what="registered after worker 0's restart")
    # a topic deleted on its owner leaves lookupd
    gone = topics[-1]
    assert http_api.post(node.http_address, "/topic/delete", topic=gone).status == 200
    wait_for(lambda: gone not in (producers() or [{"topics": [gone]}])[0]["topics"],
             what="the deleted topic unregistered")


@pytest.mark.timeout(120)
def test_pipelined_publishes_survive_the_connection_moving_to_the_owner(
        nsqd_factory: NsqdFactory) -> None:
    """A producer that writes many commands at once: those read before its connection
    moves to the topic's owner go with it, those still in the socket are read there; every
    one is answered OK, in order, once."""
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    topics = topics_of_both(2, prefix="pp")
    sent: dict[str, list[bytes]] = {t: [] for t in topics}
    for i in range(6):
        for t in topics:
            with RawClient(node.tcp_address) as c:
                bodies = [f"{t}-{i}-{j}".encode() for j in range(200)]
                c.send(b"".join(v2.pub(t, b) for b in bodies[:100])
                       + b"".join(v2.mpub(t, bodies[k:k + 10]) for k in range(100, 200, 10)))
                for _ in range(110):
                    c.expect_ok(timeout=10)
                c.expect_nothing(0.1)
                sent[t] += bodies
            with RawClient(node.tcp_address) as c:  # an idempotent producer's batches
                first = f"{t}-{i}-first".encode()
                batches = [[f"{t}-{i}-m{s}-{j}".encode() for j in range(3)] for s in range(5)]
                pid = f"p{i}{t}"
                c.send(v2.pub(t, first) + b"".join(
                    v2.mpub_ext(t, [({"##nsqx_producer": f"{pid}:0:{s}"}, b[0]),
                                    (None, b[1]), (None, b[2])])
                    for s, b in enumerate(batches)))
                for _ in range(6):
                    c.expect_ok(timeout=10)
                c.expect_nothing(0.1)
                sent[t] += [first, *(m for b in batches for m in b)]
    for t in topics:
        got = asyncio.run(consume(node.tcp_address, t, len(sent[t])))
        assert Counter(got) == Counter(sent[t]), t


@pytest.mark.timeout(120)
def test_a_compressed_connection_subscribing_elsewhere_is_relayed(
        nsqd_factory: NsqdFactory) -> None:
    """A snappy or deflate connection's SUB to another worker's topic: its socket cannot
    move (the compressor's state is here), so the owner serves it through a pipe and this
    worker only decompresses/compresses; deliveries, REQ and FIN work as on the owner."""

    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    a, b = topics_of_both(2, prefix="z")
    for i in range(8):  # topics in pairs: the kernel may alternate the workers
        topic = a if (i // 2) % 2 else b
        feature = {"snappy": True} if i % 2 else {"deflate": True, "deflate_level": 6}
        with RawClient(node.tcp_address) as c:
            c.identify({"feature_negotiation": True, "heartbeat_interval": 1000, **feature})
            c.subscribe(topic, f"ch{i}", rdy=1)
            body = (f"m{i}-".encode() * 5000)[:20000]  # several compressed blocks
            assert http_api.pub(node.http_address, topic, body).status == 200
            m = c.read_message(10)
            assert (m.body, m.attempts) == (body, 1)
            c.send(b"REQ " + m.id + b" 0\n")
            m2 = c.read_message(10)
            assert (m2.id, m2.attempts) == (m.id, 2)
            c.send(b"FIN " + m.id + b"\n")
            c.read_frame(2.5, heartbeats=True)  # the owner's heartbeat comes through
            c.send(b"NOP\n")
            c.expect_nothing(0.2)
            ch = http_api.channel_stats(node.http_address, topic, f"ch{i}")
            assert ch is not None and (ch["depth"], ch["in_flight_count"]) == (0, 0), ch
    relayed = node.log_bytes().count(b"relayed to worker")
    assert 0 < relayed < 8, relayed  # some landed on the owner, some were relayed


@pytest.mark.timeout(120)
def test_a_connection_that_cannot_move_has_its_publishes_forwarded_in_order(
        nsqd_factory: NsqdFactory) -> None:
    """A snappy connection stays on its worker: its publishes to the other worker's topic
    are forwarded (PUB, MPUB, DPUB, PUB_EXT, PUB_TRACE), each answered in command order,
    the traced one with the owner's message id, and every message is stored once."""
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    a, b = topics_of_both(2, prefix="f")
    stored: dict[str, list[bytes]] = {a: [], b: []}
    for i in range(4):
        with RawClient(node.tcp_address) as c:
            c.identify({"feature_negotiation": True, "snappy": True})
            cmds = []
            for t in (a, b):
                cmds += [v2.pub(t, f"p-{i}-{t}".encode()),
                         v2.mpub(t, [f"m-{i}-{t}-{j}".encode() for j in range(5)]),
                         v2.dpub(t, 10, f"d-{i}-{t}".encode()),
                         v2.pub_ext(t, f"e-{i}-{t}".encode(), {"k": "v"}),
                         v2.pub_trace(t, 7, f"t-{i}-{t}".encode())]
                stored[t] += [f"p-{i}-{t}".encode(),
                              *[f"m-{i}-{t}-{j}".encode() for j in range(5)],
                              f"d-{i}-{t}".encode(), f"e-{i}-{t}".encode(),
                              f"t-{i}-{t}".encode()]
            c.send(b"".join(cmds))  # pipelined: the answers come back in this order
            for _ in (a, b):
                for _ in range(4):
                    c.expect_ok(timeout=10)
                ftype, traced = c.read_frame(10)
                assert ftype == 0 and len(traced) == 30, traced  # Youzan's traced answer
    for t in (a, b):
        got = asyncio.run(consume(node.tcp_address, t, len(stored[t])))
        assert Counter(got) == Counter(stored[t]), t


@pytest.mark.timeout(120)
def test_http_answers_are_the_owners_whichever_worker_gets_the_request(
        nsqd_factory: NsqdFactory) -> None:
    """Topic create, an ordered topic's refusal, pause and delete over HTTP: the same
    answers for both workers' topics, whichever worker the request lands on."""
    node = nsqd_factory.start(WORKERS)
    workers_up(node)
    for t in topics_of_both(2, prefix="o"):
        r = http_api.post(node.http_address, "/topic/create", topic=t, partition_num=2,
                          orderedmulti="true")
        assert r.status == 200, r
        for _ in range(4):  # fast path and forwarded: the same refusal
            r = http_api.pub(node.http_address, t, b"x")
            assert r.status == 400, r
            assert r.json()["message"].startswith(f"E_BAD_PARTITION topic {t} is ordered"), r
            assert http_api.pub(node.http_address, t, b"x", partition=1).status == 200
        assert http_api.post(node.http_address, "/topic/pause", topic=t).status == 200
        (entry,) = http_api.stats(node.http_address, t)["topics"]
        assert entry["paused"] is True and entry["depth"] == 4
        assert http_api.post(node.http_address, "/topic/delete", topic=t).status == 200
        assert http_api.stats(node.http_address, t)["topics"] == []
        assert http_api.post(node.http_address, "/topic/delete", topic=t).status == 404


@pytest.mark.timeout(120)
def test_https_and_tls_connections(nsqd_factory: NsqdFactory, tls_files: TLSFiles) -> None:
    """HTTPS is bound once too and served by every worker (publishes to both workers'
    topics); a TCP connection upgraded to TLS publishes to both (forwarded: it cannot
    move) and reads back a topic, relayed through its worker when it is the other's."""
    node = nsqd_factory.start([*WORKERS, f"--tls-cert={tls_files.server_cert}",
                               f"--tls-key={tls_files.server_key}"])
    workers_up(node)
    ctx = ssl.create_default_context(cafile=str(tls_files.ca_cert))
    a, b = topics_of_both(2, prefix="s")
    for t in (a, b):
        for i in range(3):
            r = http_api.request("POST", f"https://{node.https_address}/pub?topic={t}",
                                 f"https-{i}".encode(), ssl_context=ctx)
            assert r.status == 200, r
    (ea, eb) = sorted(http_api.request("GET", f"https://{node.https_address}/stats?format=json",
                                       ssl_context=ctx).json()["topics"],
                      key=lambda e: [a, b].index(e["topic_name"]))
    assert (ea["topic_name"], ea["depth"], eb["topic_name"], eb["depth"]) == (a, 3, b, 3)
    outcomes = set()
    for i in range(8):
        with RawClient(node.tcp_address) as c:
            c.identify({"feature_negotiation": True, "tls_v1": True}, ssl_context=ctx)
            c.send(v2.pub(a, b"tls") + v2.pub(b, b"tls"))
            c.expect_ok(timeout=10)
            c.expect_ok(timeout=10)
            topic = a if (i // 2) % 2 else b
            c.subscribe(topic, f"tls{i}", rdy=1)
            assert http_api.pub(node.http_address, topic, f"tls-{i}".encode()).status == 200
            got: list[bytes] = []  # a topic's first channel gets its backlog first
            while f"tls-{i}".encode() not in got:
                m = c.read_message(10)
                got.append(m.body)
                c.send(b"FIN " + m.id + b"\n")
            c.send(b"NOP\n")
            c.expect_nothing(0.2)
            ch = http_api.channel_stats(node.http_address, topic, f"tls{i}")
            assert ch is not None and (ch["depth"], ch["in_flight_count"]) == (0, 0), ch
            outcomes.add(node.log_bytes().count(b"relayed to worker"))
    assert len(outcomes) > 1 and max(outcomes) < 8, outcomes  # some relayed, not all
