"""``nsqx.httpapi.trace_search_args``: the one check of ``/trace/search``'s query that nsqd
and nsqlookupd share (their HTTP tests cover the 400 codes end to end)."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from nsqx.httpapi import TRACE_SCAN_DEFAULT, HTTPError, parse_go_query, trace_search_args


def args(**q: str):  # type: ignore[no-untyped-def]
    return trace_search_args({k: [v] for k, v in q.items()})


def test_parsed_and_forwarded_unchanged() -> None:
    a = args(topic="o", id="000100000000002a")
    assert (a.msg_id, a.limit) == ((1, 42), TRACE_SCAN_DEFAULT)
    assert a.search_kw() == {"limit": TRACE_SCAN_DEFAULT, "msg_id": (1, 42)}
    assert args(topic="o", trace_id="0042", limit="5").search_kw() == {"limit": 5, "trace_id": 42}
    # what nsqlookupd forwards parses back to the same query, bytes of a header value too
    for q in ({"topic": "o", "id": "000100000000002a"}, {"topic": "o", "trace_id": "7"},
              {"topic": "o", "header": "k:v:w", "limit": "9"}):
        a = args(**q)
        assert trace_search_args(parse_go_query(urlencode(a.params()))) == a
    a = trace_search_args(parse_go_query("topic=o&header=k%3A%FF%20x"))
    assert a.header == ("k", b"\xff x")
    qs = urlencode(a.params(), errors="surrogateescape")
    assert trace_search_args(parse_go_query(qs)) == a


@pytest.mark.parametrize(("q", "code"), [
    ({}, "MISSING_ARG_TOPIC"),
    ({"topic": "bad!", "id": "x"}, "INVALID_TOPIC"),
    ({"topic": "o", "limit": "0"}, "INVALID_LIMIT"),  # the limit is checked before the key
    ({"topic": "o", "id": "0" * 16, "limit": "2000001"}, "INVALID_LIMIT"),
    ({"topic": "o"}, "MISSING_ARG_ID"),
    ({"topic": "o", "id": "0" * 16, "header": "a:b"}, "MISSING_ARG_ID"),
    ({"topic": "o", "id": "0" * 15 + "G"}, "INVALID_ID"),
    ({"topic": "o", "trace_id": str(1 << 64)}, "INVALID_TRACE_ID"),
    ({"topic": "o", "header": ":v"}, "INVALID_HEADER"),
])
def test_refusals(q: dict[str, str], code: str) -> None:
    with pytest.raises(HTTPError) as exc:
        args(**q)
    assert (exc.value.status, exc.value.code) == (400, code)
