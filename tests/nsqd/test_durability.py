"""Black-box durability: SIGKILL nsqd at random moments while publishing, restart it on the
same data path, and check that nothing acknowledged is lost or duplicated.

With DEFAULT settings an OK to PUB means the message is in the log: a killed process (not a
lost machine) must come back with it. A PUB that got no OK may or may not be there; it is
never retried, so a duplicate can only come from the server.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import orjson
import pytest

from nsqx.protocol import v2
from tests.support import http_api
from tests.support.nsqd_process import NsqdFactory, NsqdProcess
from tests.support.rawclient import NoFrame, RawClient, consumer

pytestmark = pytest.mark.slow

CYCLES = 15
TOPIC = "durable"
CHANNEL = "from_start"


def create(node: NsqdProcess, topic: str, channel: str | None = None) -> None:
    r = http_api.post(node.http_address, "/topic/create", topic=topic)
    assert r.status == 200, r
    if channel:
        r = http_api.post(node.http_address, "/channel/create", topic=topic, channel=channel)
        assert r.status == 200, r


def publish_until_killed(node: NsqdProcess, cycle: int, seq: list[int], acked: list[bytes],
                         uncertain: list[list[bytes]], budget: float) -> None:
    publish_until_killed_topic(node, TOPIC, cycle, seq, acked, uncertain, budget)


def publish_until_killed_topic(node: NsqdProcess, topic: str, cycle: int, seq: list[int],
                               acked: list[bytes], uncertain: list[list[bytes]],
                               budget: float) -> None:
    """PUB (and now and then MPUB) one at a time, waiting for each OK, until the connection
    dies or the budget is spent. A command without an OK goes to ``uncertain``."""
    end = time.monotonic() + budget
    try:
        c = RawClient(node.tcp_address, timeout=5)
    except OSError:
        return
    with c:
        while time.monotonic() < end:
            n = seq[0]
            if n % 50 == 49:
                batch = [b"c%02d-%07d-%d" % (cycle, n, k) for k in range(10)]
                cmd = v2.mpub(topic, batch)
            else:
                batch = [b"c%02d-%07d" % (cycle, n)]
                cmd = v2.pub(topic, batch[0])
            seq[0] += 1
            try:
                c.send(cmd)
                c.expect_ok()
            except (OSError, AssertionError):
                uncertain.append(batch)
                return
            acked.extend(batch)


@pytest.mark.parametrize("flags,cycles", [
    ([], CYCLES),  # DEFAULT settings: the claim of the issue
    (["--max-bytes-per-file=8192"], 6),  # many segment rolls, torn tails at segment ends
], ids=["defaults", "small-segments"])
def test_sigkill_while_publishing_loses_nothing_acknowledged(nsqd_factory: NsqdFactory,
                                                            flags: list[str],
                                                            cycles: int) -> None:
    rng = random.Random(20261122)
    node = nsqd_factory.start(flags)
    create(node, TOPIC, CHANNEL)
    acked: list[bytes] = []
    uncertain: list[list[bytes]] = []
    seq = [0]
    kills_during_publish = 0
    for cycle in range(cycles):
        delay = rng.choice([0.0, 0.02]) if cycle % 5 == 4 else rng.uniform(0.05, 0.8)
        pid = node.pid
        assert pid is not None
        killer = threading.Timer(delay, node.kill)
        before = len(acked)
        killer.start()
        try:
            publish_until_killed(node, cycle, seq, acked, uncertain, budget=2.0)
        finally:
            killer.join(5)
        node.kill()  # no-op if the timer already did it; reaps the process
        if len(acked) > before:
            kills_during_publish += 1
        node.start()
    assert len(acked) > 200, f"too few messages published ({len(acked)}): test is not testing"
    assert kills_during_publish >= cycles // 2

    # the channel that existed from the start holds every acknowledged message
    st = http_api.channel_stats(node.http_address, TOPIC, CHANNEL)
    assert st is not None, "channel lost after SIGKILL"
    unsure = {b for batch in uncertain for b in batch}
    assert len(acked) <= st["depth"] <= len(acked) + len(unsure), (st, len(acked), len(unsure))

    with consumer(node.tcp_address, TOPIC, CHANNEL, rdy=500) as c:
        got = [m.body for m in c.drain_messages(quiet=1.0, limit=60)]
    counts = Counter(got)
    dups = [b for b, n in counts.items() if n > 1]
    assert not dups, f"{len(dups)} messages delivered twice, e.g. {dups[:5]}"
    missing = set(acked) - counts.keys()
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    phantom = counts.keys() - set(acked) - unsure
    assert not phantom, f"messages nobody published: {sorted(phantom)[:5]}"
    # an MPUB without an OK is all-or-nothing
    for batch in uncertain:
        present = [b in counts for b in batch]
        assert all(present) or not any(present), f"MPUB partially stored: {batch}"
    # one producer at a time: the log keeps publish order
    assert got == sorted(got), "delivery order differs from publish order"


def test_topics_channels_and_paused_state_survive_sigkill(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start()
    create(node, "keep1", "c1")
    create(node, "keep1", "c2")
    create(node, "keep2")
    create(node, "keep3", "c")
    assert http_api.post(node.http_address, "/topic/pause", topic="keep2").status == 200
    assert http_api.post(node.http_address, "/channel/pause", topic="keep1",
                         channel="c1").status == 200
    with RawClient(node.tcp_address) as p:
        p.mpub("keep2", [b"p1", b"p2"])
        p.pub("keep1", b"k1")
    eph = consumer(node.tcp_address, "keep1", "e#ephemeral", rdy=0)
    assert http_api.post(node.http_address, "/topic/delete", topic="keep3").status == 200
    time.sleep(0.2)
    node.kill()
    eph.close()
    node.start()

    st = http_api.stats(node.http_address)
    topics = {t["topic_name"]: t for t in st["topics"]}
    assert set(topics) == {"keep1", "keep2"}
    assert topics["keep2"]["paused"] is True and topics["keep1"]["paused"] is False
    chans = {c["channel_name"]: c for c in topics["keep1"]["channels"]}
    assert set(chans) == {"c1", "c2"}  # the ephemeral one is gone
    assert chans["c1"]["paused"] is True and chans["c2"]["paused"] is False
    assert chans["c1"]["depth"] == 1  # (c2: see test_every_channel_keeps_unconsumed_...)
    assert topics["keep2"]["depth"] == 2

    # the paused topic kept its messages for its first channel
    with consumer(node.tcp_address, "keep2", "late", rdy=10) as c:
        c.expect_nothing(0.5)
        assert http_api.post(node.http_address, "/topic/unpause", topic="keep2").status == 200
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [b"p1", b"p2"]
    with consumer(node.tcp_address, "keep1", "c1", rdy=10) as c:
        c.expect_nothing(0.5)
        assert http_api.post(node.http_address, "/channel/unpause", topic="keep1",
                             channel="c1").status == 200
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [b"k1"]


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_every_channel_keeps_unconsumed_messages_across_restart(nsqd_factory: NsqdFactory,
                                                                how: str) -> None:
    """Channels that never had a consumer keep what was published to them."""
    node = nsqd_factory.start()
    create(node, "idle", "c1")
    create(node, "idle", "c2")
    with RawClient(node.tcp_address) as p:
        p.mpub("idle", [b"i1", b"i2", b"i3"])
    time.sleep(1.5)  # let any periodic persistence run
    node.restart(graceful=how == "sigterm")
    for ch in ("c1", "c2"):
        st = http_api.channel_stats(node.http_address, "idle", ch)
        assert st is not None, f"channel {ch} lost"
        with consumer(node.tcp_address, "idle", ch, rdy=10) as c:
            got = [m.body for m in c.drain_messages(quiet=0.5)]
        assert got == [b"i1", b"i2", b"i3"], (ch, got, st)


def _consume_and_fin(node: NsqdProcess, n: int) -> list[bytes]:
    with consumer(node.tcp_address, "resume", "c", rdy=n) as c:
        msgs = c.read_messages(n, timeout=10)
        c.send(v2.rdy(0))  # FINs must not open the window for more
        for m in msgs:
            c.send(v2.fin(m.id))
        # wait until the server has processed the FINs
        deadline = time.monotonic() + 5
        while True:
            st = http_api.channel_stats(node.http_address, "resume", "c")
            if st is not None and st["in_flight_count"] == 0:
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.05)
        c.send(v2.cls())
        c.expect_response(b"CLOSE_WAIT")
    return [m.body for m in msgs]


@pytest.mark.parametrize("how", ["sigterm", "sigkill_after_quiet", "sigkill_at_once"])
def test_channel_cursor_resumes_after_restart(nsqd_factory: NsqdFactory, how: str) -> None:
    node = nsqd_factory.start()
    create(node, "resume", "c")
    all_bodies = [b"r%03d" % i for i in range(100)]
    with RawClient(node.tcp_address) as p:
        p.mpub("resume", all_bodies)
    first = _consume_and_fin(node, 60)
    assert first == all_bodies[:60]
    # 5 more taken and never answered: in flight when the node goes down
    with consumer(node.tcp_address, "resume", "c", rdy=5) as c:
        held = [m.body for m in c.read_messages(5)]
    assert held == all_bodies[60:65]
    if how == "sigterm":
        node.restart(graceful=True)
    elif how == "sigkill_after_quiet":
        time.sleep(3.0)  # cursor state is persisted periodically (well within this)
        node.restart(graceful=False)
    else:
        node.restart(graceful=False)
    with consumer(node.tcp_address, "resume", "c", rdy=100) as c:
        rest = [m.body for m in c.drain_messages(quiet=0.8)]
    assert len(rest) == len(set(rest)), "a message delivered twice in one session"
    if how == "sigkill_at_once":
        # at-least-once: finished ones may come again, unfinished ones must all come
        assert set(all_bodies[60:]) <= set(rest), "unfinished messages lost"
        assert set(rest) <= set(all_bodies)
        return
    assert not set(rest) & set(first), "finished messages were delivered again"
    assert sorted(rest) == all_bodies[60:], "unfinished messages lost or duplicated"


def test_deferred_message_survives_sigterm(nsqd_factory: NsqdFactory) -> None:
    """Upstream flushes deferred messages to the backend on a clean exit: not lost."""
    node = nsqd_factory.start()
    create(node, "deferred", "c")
    with RawClient(node.tcp_address) as p:
        p.dpub("deferred", 2500, b"later")
        p.pub("deferred", b"now")
    node.restart(graceful=True)
    with consumer(node.tcp_address, "deferred", "c", rdy=10) as c:
        got = sorted(m.body for m in c.read_messages(2, timeout=8))
    assert got == [b"later", b"now"]


class _Consumer(threading.Thread):
    """FINs everything it gets on one channel, reconnecting across crashes and restarts."""

    def __init__(self, node: NsqdProcess, topic: str, channel: str) -> None:
        super().__init__(daemon=True)
        self.node, self.topic, self.channel = node, topic, channel
        self.got: list[bytes] = []
        self.stop = threading.Event()
        self.connected = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                address = self.node.tcp_address
                c = consumer(address, self.topic, self.channel, rdy=50, timeout=2)
            except (AssertionError, OSError):
                time.sleep(0.05)
                continue
            self.connected.set()
            with c:
                try:
                    while not self.stop.is_set():
                        try:
                            m = c.read_message(0.2)
                        except NoFrame:
                            continue
                        self.got.append(m.body)
                        c.send(v2.fin(m.id))
                except (AssertionError, OSError):
                    pass  # killed: reconnect


def test_sigkill_with_an_active_consumer_loses_nothing(nsqd_factory: NsqdFactory) -> None:
    """A consumer FINs while nsqd is killed again and again: every acknowledged message
    reaches it at least once (redelivery after a crash is allowed, loss is not)."""
    rng = random.Random(7)
    node = nsqd_factory.start()
    reader = _Consumer(node, "busy", "c")
    reader.start()
    assert reader.connected.wait(10)
    acked: list[bytes] = []
    uncertain: list[list[bytes]] = []
    seq = [0]
    try:
        for cycle in range(8):
            killer = threading.Timer(rng.uniform(0.1, 0.7), node.kill)
            killer.start()
            try:
                publish_until_killed_topic(node, "busy", cycle, seq, acked, uncertain, 2.0)
            finally:
                killer.join(5)
            node.kill()
            node.start()
        # let the reader catch up
        deadline = time.monotonic() + 20
        while not set(acked) <= set(reader.got) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        reader.stop.set()
        reader.join(5)
    missing = set(acked) - set(reader.got)
    assert not missing, f"{len(missing)} acknowledged messages never delivered: {sorted(missing)[:5]}"
    unsure = {b for batch in uncertain for b in batch}
    assert set(reader.got) <= set(acked) | unsure
    assert len(acked) > 100


def test_data_path_is_locked(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start()
    other = nsqd_factory.create(data_path=node.data_path, name="intruder")
    with pytest.raises(AssertionError):
        other.start(timeout=10)
    assert not other.is_running()
    assert b"in use" in other.log_bytes() or b"lock" in other.log_bytes().lower()
    with RawClient(node.tcp_address) as p:
        p.pub("still", b"fine")
    # after a SIGKILL the lock is free again
    node.restart(graceful=False)
    with consumer(node.tcp_address, "still", "c", rdy=1) as c:
        assert c.read_message().body == b"fine"


def test_topic_missing_from_metadata_is_adopted(nsqd_factory: NsqdFactory) -> None:
    """A topic whose log is on disk but not in nsqd.dat (kill -9 between the PUB's ack and
    the coalesced metadata write, simulated by removing it from nsqd.dat) is loaded at
    start with its channel, so its acknowledged messages are delivered without waiting
    for another publish; a deleted topic does not come back."""
    node = nsqd_factory.start()
    with RawClient(node.tcp_address) as p:
        p.mpub("unlisted", [b"u1", b"u2"])
        p.pub("gone", b"g1")
    with consumer(node.tcp_address, "unlisted", "c", rdy=1) as c:
        m = c.read_message()
        c.send(v2.rdy(0))  # the FIN must not let u2 out
        c.send(v2.fin(m.id))
        deadline = time.monotonic() + 5
        while http_api.channel_stats(node.http_address, "unlisted", "c")["in_flight_count"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert http_api.post(node.http_address, "/topic/delete", topic="gone").status == 200
    node.stop()
    dat = node.data_path / "nsqd.dat"
    meta = orjson.loads(dat.read_bytes())
    meta["topics"] = [t for t in meta["topics"] if t["name"] != "unlisted"]
    dat.write_bytes(orjson.dumps(meta))
    node.start()
    stats = orjson.loads(http_api.get(node.http_address, "/stats", format="json").body)
    topics = {t["topic_name"]: t for t in stats["topics"]}
    assert "gone" not in topics
    assert [ch["channel_name"] for ch in topics["unlisted"]["channels"]] == ["c"]
    with consumer(node.tcp_address, "unlisted", "c", rdy=10) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [b"u2"]
    assert b"adopted from" in node.log_bytes()


def test_topic_buffer_and_empty_survive_sigkill(nsqd_factory: NsqdFactory) -> None:
    """Messages waiting in a channel-less topic survive; an emptied topic stays empty."""
    node = nsqd_factory.start()
    with RawClient(node.tcp_address) as p:
        p.mpub("buffered", [b"b1", b"b2"])
        p.mpub("emptied", [b"e1", b"e2"])
    assert http_api.post(node.http_address, "/topic/empty", topic="emptied").status == 200
    with RawClient(node.tcp_address) as p:
        p.pub("emptied", b"e3")
    node.restart(graceful=False)
    with consumer(node.tcp_address, "buffered", "c", rdy=10) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [b"b1", b"b2"]
    with consumer(node.tcp_address, "emptied", "c", rdy=10) as c:
        assert [m.body for m in c.drain_messages(quiet=0.5)] == [b"e3"]


def test_channel_empty_survives_sigkill(nsqd_factory: NsqdFactory) -> None:
    node = nsqd_factory.start()
    create(node, "chempty", "c")
    with RawClient(node.tcp_address) as p:
        p.mpub("chempty", [b"x1", b"x2", b"x3"])
    assert http_api.post(node.http_address, "/channel/empty", topic="chempty",
                         channel="c").status == 200
    node.restart(graceful=False)
    st = http_api.channel_stats(node.http_address, "chempty", "c")
    assert st is not None and st["depth"] == 0, st
    with consumer(node.tcp_address, "chempty", "c", rdy=10) as c:
        c.expect_nothing(0.5)


@pytest.mark.parametrize("graceful", [True, False])
def test_requeued_with_delay_survives_restart(nsqd_factory: NsqdFactory, graceful: bool) -> None:
    """A REQ'd message with a long delay is not lost by a restart (nor by SIGKILL after the
    periodic cursor persist)."""
    node = nsqd_factory.start()
    create(node, "reqd", "c")
    with RawClient(node.tcp_address) as p:
        p.mpub("reqd", [b"q1", b"q2"])
    with consumer(node.tcp_address, "reqd", "c", rdy=2) as c:
        ms = c.read_messages(2)
        c.send(v2.req(ms[0].id, 600_000) + v2.fin(ms[1].id))
        c.expect_nothing(0.3)
    if not graceful:
        time.sleep(2.5)
    node.restart(graceful=graceful)
    st = http_api.channel_stats(node.http_address, "reqd", "c")
    assert st is not None
    assert st["deferred_count"] + st["depth"] + st["in_flight_count"] >= 1, st
    assert st["deferred_count"] == 1, st  # still deferred, not delivered early
