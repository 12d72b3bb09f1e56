"""The fetch head and commit rows (nsqx.cluster.replication): one definition for leader and
follower, the same bytes on the wire as the dict the leader built before them."""

from __future__ import annotations

import base64

import orjson

from nsqx.cluster.replication import Commit, FetchHead


def _old_head(start: int, count: int, end: int, hw: int, spans: list, commits: list | None,
              hdrs: dict, channels: dict | None, settings: dict | None) -> dict:
    """The head as ``_serve_fetch`` wrote it by hand (kept here as the wire's reference)."""
    head: dict = {"start": start, "count": count, "end": end, "hw": hw}
    if count:
        head["spans"] = spans
        if commits is not None:
            head["commits"] = commits
        if hdrs:
            head["headers"] = {str(off): {k: base64.b64encode(v).decode()
                                          for k, v in h.items()} for off, h in hdrs.items()}
    if channels is not None:
        head["channels"] = channels
        head["settings"] = settings
    return head


def test_the_head_has_the_bytes_the_leader_always_sent() -> None:
    rows = [(10, 2, 111, 112, 3, 40, None), (12, 2, 113, 113, 4, 0, [40, 44])]
    hdrs = {11: {"k": b"\x00v"}}
    head = FetchHead(start=10, count=4, end=20, hw=9, spans=[(3, 10), (4, 12)],
                     commits=[Commit.from_row(r) for r in rows], headers=hdrs,
                     channels={"c": 7}, settings={"ttl": 5})
    old = _old_head(10, 4, 20, 9, [(3, 10), (4, 12)], rows, hdrs, {"c": 7}, {"ttl": 5})
    assert orjson.dumps(head.to_wire()) == orjson.dumps(old)
    # an empty answer at the tail: no spans, commits or headers
    empty = FetchHead(start=20, count=0, end=20, hw=20)
    assert orjson.dumps(empty.to_wire()) == orjson.dumps(
        _old_head(20, 0, 20, 20, [], None, {}, None, None))


def test_the_follower_reads_what_the_leader_wrote() -> None:
    rows = [(0, 3, 5, 6, 1, 0, [40, 41, 42])]
    head = FetchHead(start=0, count=3, end=3, hw=2, spans=[(1, 0)],
                     commits=[Commit.from_row(r) for r in rows], headers={2: {"h": b"\xff"}},
                     channels={"c": 1}, settings={"max_attempts": 3})
    back = FetchHead.from_wire(orjson.loads(orjson.dumps(head.to_wire())))
    assert back == head
    assert back.commits is not None and back.commits[0].size == 123
    assert Commit.from_row((0, 3, 5, 6, 1, 40, None)).size == 120
    # a head without the optional parts (an older leader, or nothing new)
    bare = FetchHead.from_wire({"start": 4, "count": 0, "end": 4})
    assert bare.hw is None and bare.commits is None and not bare.headers and not bare.channels
