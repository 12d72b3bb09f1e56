"""export_settings / apply_settings: what a cluster leader sends its followers about a
partition's TTL, tracing and channels' max attempts, and how a follower takes it."""

from __future__ import annotations

from types import SimpleNamespace

from nsqx.nsqd.config_api import apply_settings, export_settings


def part(**kw: object) -> SimpleNamespace:
    nsqd = SimpleNamespace(opts=SimpleNamespace(msg_ttl=0.0, max_attempts=5), tracer="T")
    ch = SimpleNamespace(name="work", ephemeral=False, max_attempts=5, max_attempts_set=False)
    base = dict(nsqd=nsqd, name="jobs", partition=0, msg_ttl_ns=0, msg_ttl_set=False,
                tracer=None, channels={"work": ch})
    base.update(kw)
    return SimpleNamespace(**base)


def test_round_trip_and_defaults() -> None:
    leader = part(msg_ttl_ns=90_000_000_000, msg_ttl_set=True, tracer="T")
    leader.channels["work"].max_attempts, leader.channels["work"].max_attempts_set = 3, True
    s = export_settings(leader)
    assert s == {"ttl_ms": 90_000, "trace": True, "channels": {"work": 3}}
    f = part()
    assert apply_settings(f, s) is True
    assert (f.msg_ttl_ns, f.msg_ttl_set, f.tracer) == (90_000_000_000, True, "T")
    assert (f.channels["work"].max_attempts, f.channels["work"].max_attempts_set) == (3, True)
    assert apply_settings(f, s) is False  # nothing new
    back = {"ttl_ms": None, "trace": False, "channels": {"work": None, "gone": 2}}
    assert apply_settings(f, back) is True
    assert (f.msg_ttl_ns, f.msg_ttl_set, f.tracer) == (0, False, None)
    assert (f.channels["work"].max_attempts, f.channels["work"].max_attempts_set) == (5, False)


def test_malformed_settings_change_nothing() -> None:
    for bad in ({"ttl_ms": "soon"}, {"ttl_ms": -5}, {"channels": {"work": "many"}},
                {"channels": {"work": 10**9}}, {"channels": ["work"]}, {"ttl_ms": [1]}):
        f = part()
        apply_settings(f, bad)
        assert (f.msg_ttl_ns, f.msg_ttl_set) == (0, False), bad
        assert (f.channels["work"].max_attempts, f.channels["work"].max_attempts_set) == (5, False)
