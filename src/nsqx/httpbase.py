"""The parts of upstream's "V1" HTTP conventions that need no HTTP library: the header,
the error a handler raises, reading query parameters, limits.

Split from :mod:`nsqx.httpapi` (which re-exports them) so that what a node needs before its
HTTP API is loaded (``nsqd.http_fast``, ``nsqd.http_publish``, ``nsqd.trace``) does not load
aiohttp: importing it is most of an nsqd start.
"""

from __future__ import annotations

from nsqx.protocol.names import valid_topic_name

__all__ = ["JSON_TYPE", "TRACE_SCAN_DEFAULT", "TRACE_SCAN_MAX", "V1_HEADER", "V1_VALUE",
           "HTTPError", "first", "topic_arg"]

V1_HEADER = "X-NSQ-Content-Type"
V1_VALUE = "nsq; version=1.0"
JSON_TYPE = "application/json"
TRACE_SCAN_DEFAULT = 200_000  # trace events /trace/search reads (the newest), unless told
TRACE_SCAN_MAX = 2_000_000


class HTTPError(Exception):
    """An upstream ``http_api.Err``: answered as ``{"message": code}`` with ``status``."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status = status
        self.code = code


def first(params: dict[str, list[str]], key: str) -> str | None:
    """``ReqParams.Get``: the first value, or None when the key is absent ("" if empty)."""
    v = params.get(key)
    return v[0] if v else None


def topic_arg(params: dict[str, list[str]], invalid: str | None = "INVALID_TOPIC") -> str:
    """The ``topic`` parameter: 400 MISSING_ARG_TOPIC when absent, 400 ``invalid`` when not a
    valid name (upstream's nsqd answers INVALID_TOPIC, its ``GetTopicChannelArgs``
    INVALID_ARG_TOPIC; None: not checked, for calls that only look a name up)."""
    topic = first(params, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if invalid is not None and not valid_topic_name(topic):
        raise HTTPError(400, invalid)
    return topic
