"""Signed requests between cluster members (nsqx.cluster.trust), without processes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nsqx.cluster.trust import (
    RefusalLog,
    Refused,
    Signer,
    Verifier,
    generate_secret_file,
    load_secret,
    receiver_name,
)

SECRET = b"0123456789abcdef0123456789abcdef"
Q = {"topic": "t", "partition": "0", "epoch": "3", "node": "n1", "offset": "10"}


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def verify(v: Verifier, headers: dict[str, str], query: dict[str, str] = Q, *,
           method: str = "GET", path: str = "/nsqx/replica/fetch", body: bytes = b"") -> str:
    return v.verify(method, path, query.items(), body, headers)


def refused(fn, *args, **kw) -> Refused:  # type: ignore[no-untyped-def]
    with pytest.raises(Refused) as e:
        fn(*args, **kw)
    return e.value


def test_a_signed_request_names_its_node_and_verifies_once() -> None:
    clock = Clock()
    s, v = Signer(SECRET, "n1", clock), Verifier(SECRET, clock=clock)
    h = s.headers("GET", "/nsqx/replica/fetch", Q)
    # the query's order does not matter: it is signed sorted
    assert verify(v, h, dict(reversed(list(Q.items())))) == "n1"
    e = refused(verify, v, h)
    assert (e.status, e.code) == (401, "E_REPLAYED")
    # every request gets a new nonce
    assert verify(v, s.headers("GET", "/nsqx/replica/fetch", Q)) == "n1"


@pytest.mark.parametrize("change", ["query", "path", "method", "body", "node", "secret"])
def test_anything_altered_is_refused(change: str) -> None:
    clock = Clock()
    s = Signer(b"another secret, long enough" if change == "secret" else SECRET, "n1", clock)
    v = Verifier(SECRET, clock=clock)
    h = s.headers("POST", "/nsqx/route/seal", Q, b"body")
    kw: dict = {"method": "POST", "path": "/nsqx/route/seal", "body": b"body"}
    query = Q
    if change == "query":
        query = {**Q, "offset": "11"}
    elif change == "path":
        kw["path"] = "/nsqx/route/reset/apply"
    elif change == "method":
        kw["method"] = "GET"
    elif change == "body":
        kw["body"] = b"other"
    elif change == "node":
        h["X-Nsqx-Node"] = "n2"
    e = refused(verify, v, h, query, **kw)
    assert (e.status, e.code) == (401, "E_BAD_SIGNATURE")


def test_missing_or_malformed_credentials_and_clock_skew() -> None:
    clock = Clock()
    v = Verifier(SECRET, skew=30, clock=clock)
    assert refused(verify, v, {}).code == "E_UNAUTHENTICATED"
    h = Signer(SECRET, "n1", clock).headers("GET", "/nsqx/replica/fetch", Q)
    assert refused(verify, v, {**h, "X-Nsqx-Time": "soon"}).code == "E_BAD_SIGNATURE"
    clock.t += 31
    e = refused(verify, v, h)
    assert e.code == "E_STALE_SIGNATURE" and "+31 s" in e.detail
    clock.t -= 62
    assert refused(verify, v, h).code == "E_STALE_SIGNATURE"


def test_nonces_are_forgotten_only_after_their_window() -> None:
    clock = Clock()
    s, v = Signer(SECRET, "n1", clock), Verifier(SECRET, skew=30, clock=clock)
    old = s.headers("GET", "/p", {})
    verify(v, old, {}, path="/p")
    for _ in range(100):
        clock.t += 1
        verify(v, s.headers("GET", "/p", {}), {}, path="/p")
    assert len(v._seen) <= 31  # pruned as they expire, so a flood cannot grow it forever
    assert refused(verify, v, old, {}, path="/p").code == "E_STALE_SIGNATURE"


def test_secret_files(tmp_path: Path) -> None:
    p = generate_secret_file(tmp_path / "d" / "secret")
    assert p.stat().st_mode & 0o777 == 0o600
    assert len(load_secret(p)) == 64
    with pytest.raises(ValueError, match="cannot read"):
        load_secret(tmp_path / "none")
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(tmp_path / "short")


def test_refusals_are_counted_always_and_logged_once_a_minute_per_caller(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(0)
    r = RefusalLog(clock)
    e = Refused(401, "E_BAD_SIGNATURE", "x")
    with caplog.at_level(logging.WARNING, "nsqx.cluster.trust"):
        for _ in range(5):
            r.record(e, "10.0.0.9", "/nsqx/replica/fetch")
        r.record(e, "10.0.0.8", "/nsqx/replica/fetch")
        clock.t = 61
        r.record(e, "10.0.0.9", "/nsqx/replica/fetch")
    warned = [m for m in caplog.messages if "refused" in m]
    assert len(warned) == 3 and "10.0.0.9" in warned[0] and "10.0.0.8" in warned[1]
    assert r.counts["E_BAD_SIGNATURE"] == 7
    assert 'nsqx_cluster_refused_requests_total{reason="E_BAD_SIGNATURE"} 7' in r.prometheus()


def test_a_signature_is_good_on_its_receiver_only() -> None:
    """Issue 31: a request copied off the wire worked on another node."""
    clock = Clock()
    s = Signer(SECRET, "n1", clock)
    here = Verifier(SECRET, clock=clock, receivers=["127.0.0.1:4153"])
    there = Verifier(SECRET, clock=clock, receivers=["[::1]:4253"])
    h = s.headers("GET", "/nsqx/replica/fetch", Q, to="127.0.0.1:4153")
    e = refused(verify, there, h)
    assert (e.status, e.code) == (401, "E_WRONG_RECEIVER") and "127.0.0.1:4153" in e.detail
    # naming the other receiver instead breaks the signature
    e = refused(verify, there, {**h, "X-Nsqx-To": "::1:4253"})
    assert e.code == "E_BAD_SIGNATURE"
    assert verify(here, h) == "n1"
    # addresses compare as registered, however the host is bracketed or cased
    assert verify(there, s.headers("GET", "/nsqx/replica/fetch", Q, to="[::1]:4253")) == "n1"
    assert receiver_name("[FE80::1]:7") == receiver_name("fe80::1:7") == "fe80::1:7"


def test_a_restarted_receiver_refuses_what_was_signed_before_it_started() -> None:
    """Issue 31: the nonce window lives in memory, so a restart forgot it; what it forgot
    is older than the restart."""
    clock = Clock()
    s = Signer(SECRET, "n1", clock)
    first = Verifier(SECRET, clock=clock)
    h = s.headers("GET", "/nsqx/replica/fetch", Q)
    assert verify(first, h) == "n1"
    clock.t += 1.2  # the receiver restarts 1.2 s later, well inside the 30 s window
    second = Verifier(SECRET, clock=clock)
    e = refused(verify, second, h)
    assert (e.status, e.code) == (401, "E_REPLAYED") and "before this node started" in e.detail
    clock.t += 0.001  # a millisecond after the start is after it
    assert verify(second, s.headers("GET", "/nsqx/replica/fetch", Q)) == "n1"


def test_a_request_signed_in_the_receivers_first_millisecond_is_accepted() -> None:
    clock = Clock(1_000_000.0004)  # the start and the signature within one millisecond
    v = Verifier(SECRET, clock=clock)
    h = Signer(SECRET, "n1", clock).headers("GET", "/p", {})
    assert h["X-Nsqx-Time"] == "1000000.000"
    assert verify(v, h, {}, path="/p") == "n1"
