"""RegistrationDB unit tests (upstream registration_db semantics, with a fake clock)."""

from __future__ import annotations

from nsqx.lookupd.registry import (
    CHANNEL,
    CLIENT,
    TOPIC,
    Producer,
    Registration,
    RegistrationDB,
    filter_by_active,
)
from nsqx.protocol.lookup_v1 import PeerInfo

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


def info(n: int) -> PeerInfo:
    return PeerInfo(remote_address=f"10.0.0.{n}:5000", hostname=f"h{n}",
                    broadcast_address=f"b{n}", tcp_port=4150 + n, http_port=4250 + n,
                    version="1.3.0")


def make() -> tuple[RegistrationDB, Clock]:
    clock = Clock()
    return RegistrationDB(clock=clock), clock


def test_add_and_remove_producers():
    db, _ = make()
    p1 = db.new_peer("a", info(1))
    p2 = db.new_peer("b", info(2))
    t = Registration(TOPIC, "t", "")
    assert db.add_producer(t, Producer(p1)) is True
    assert db.add_producer(t, Producer(p1)) is False  # already there
    assert db.add_producer(t, Producer(p2)) is True
    assert [p.peer.id for p in db.find_producers(TOPIC, "t", "")] == ["a", "b"]
    assert db.remove_producer(t, "a") == (True, 1)
    assert db.remove_producer(t, "a") == (False, 1)
    assert db.remove_producer(t, "b") == (True, 0)
    # the registration stays, empty (upstream leaves keys in the DB)
    assert db.find_registrations(TOPIC, "t", "") == [t]
    assert db.find_producers(TOPIC, "t", "") == []
    assert db.remove_producer(Registration(TOPIC, "nope", ""), "a") == (False, 0)


def test_add_registration_without_producers_and_remove_registration():
    db, _ = make()
    c = Registration(CHANNEL, "t", "c")
    db.add_registration(c)
    db.add_registration(c)
    assert db.find_registrations(CHANNEL, "t", "*") == [c]
    peer = db.new_peer("a", info(1))
    db.add_producer(c, Producer(peer))
    assert db.lookup_registrations("a") == [c]
    db.remove_registration(c)
    assert db.find_registrations(CHANNEL, "t", "*") == []
    assert db.lookup_registrations("a") == []  # index follows
    db.remove_registration(c)  # absent: no-op
    db.remove_registration(Registration("nope", "x", "y"))


def test_wildcards():
    db, _ = make()
    a = db.new_peer("a", info(1))
    b = db.new_peer("b", info(2))
    for topic, chans, peer in (("t1", ["c1", "c2"], a), ("t2", ["c1"], b), ("t1", ["c2"], b)):
        db.add_producer(Registration(TOPIC, topic, ""), Producer(peer))
        for ch in chans:
            db.add_producer(Registration(CHANNEL, topic, ch), Producer(peer))
    assert [r.key for r in db.find_registrations(TOPIC, "*", "")] == ["t1", "t2"]
    assert [r.subkey for r in db.find_registrations(CHANNEL, "t1", "*")] == ["c1", "c2"]
    assert sorted(r.key for r in db.find_registrations(CHANNEL, "*", "c1")) == ["t1", "t2"]
    assert len(db.find_registrations(CHANNEL, "*", "*")) == 3
    assert db.find_registrations(CHANNEL, "t3", "*") == []
    assert db.find_registrations(CLIENT, "", "") == []
    # producers are de-duplicated by peer id across the matched registrations
    assert sorted(p.peer.id for p in db.find_producers(CHANNEL, "t1", "*")) == ["a", "b"]
    assert sorted(p.peer.id for p in db.find_producers(TOPIC, "*", "")) == ["a", "b"]
    assert Registration(CHANNEL, "t1", "c1").is_match(CHANNEL, "*", "c1")
    assert not Registration(CHANNEL, "t1", "c1").is_match(TOPIC, "*", "*")


def test_lookup_and_remove_peer():
    db, _ = make()
    a = db.new_peer("a", info(1))
    regs = [Registration(CLIENT, "", ""), Registration(TOPIC, "t", ""),
            Registration(CHANNEL, "t", "c")]
    for r in regs:
        db.add_producer(r, Producer(a))
    assert db.lookup_registrations("a") == regs
    assert db.remove_peer("a") == regs
    assert db.lookup_registrations("a") == []
    assert all(db.find_producers(r.category, r.key, r.subkey) == [] for r in regs)
    assert db.remove_peer("a") == []


def test_tombstone_lifetime_and_inactivity():
    db, clock = make()
    a = db.new_peer("a", info(1))
    b = db.new_peer("b", info(2))
    t = Registration(TOPIC, "t", "")
    pa, pb = Producer(a), Producer(b)
    db.add_producer(t, pa)
    db.add_producer(t, pb)
    inactive, lifetime = 300 * S, 45 * S

    def active() -> list[str]:
        return [p.peer.id for p in filter_by_active(db.find_producers(TOPIC, "t", ""),
                                                    inactive, lifetime, clock())]

    assert active() == ["a", "b"]
    pa.tombstone(clock())
    assert pa.is_tombstoned(lifetime, clock())
    assert active() == ["b"]
    # a re-REGISTER on the same connection keeps the tombstoned producer
    assert db.add_producer(t, Producer(a)) is False
    assert active() == ["b"]
    clock.now += 44 * S
    assert active() == ["b"]
    clock.now += 2 * S
    assert active() == ["a", "b"]  # tombstone expired
    assert pa.tombstoned  # the flag stays (shown by /debug)
    # inactivity: no PING for longer than the timeout
    clock.now += 299 * S
    db.touch(b)
    clock.now += 2 * S
    assert active() == ["b"]
    db.touch(a)
    assert active() == ["a", "b"]
    # tombstone lifetime 0 (what /nodes uses) never hides
    pb.tombstone(clock())
    assert [p.peer.id for p in filter_by_active([pa, pb], inactive, 0, clock())] == ["a", "b"]


def test_touch_returns_elapsed():
    db, clock = make()
    a = db.new_peer("a", info(1))
    assert a.last_update == clock.now
    clock.now += 5 * S
    assert db.touch(a) == 5 * S
    assert a.last_update == clock.now
    assert a.node_address() == "b1:4251"


def test_items_lists_everything():
    db, _ = make()
    a = db.new_peer("a", info(1))
    db.add_registration(Registration(TOPIC, "empty", ""))
    db.add_producer(Registration(TOPIC, "t", ""), Producer(a))
    got = {r: [p.peer.id for p in ps] for r, ps in db.items()}
    assert got == {Registration(TOPIC, "empty", ""): [], Registration(TOPIC, "t", ""): ["a"]}
    assert db.producer(Registration(TOPIC, "t", ""), "a") is not None
    assert db.producer(Registration(TOPIC, "t", ""), "zz") is None
    assert db.producer(Registration(TOPIC, "x", ""), "a") is None
