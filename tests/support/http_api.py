"""Minimal curl-like client for nsqd's HTTP API (stdlib urllib only, as a shell script would use)."""

from __future__ import annotations

import json
import ssl
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(method: str, url: str, body: bytes | None = None, *, timeout: float = 10.0,
            ssl_context: ssl.SSLContext | None = None,
            headers: dict[str, str] | None = None) -> Response:
    """One request; HTTP error statuses are returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as resp:
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                            resp.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def _url(address: str, path: str, params: dict[str, Any] | None = None,
         scheme: str = "http") -> str:
    q = f"?{urlencode(params)}" if params else ""
    return f"{scheme}://{address}{path}{q}"


def with_secret(address: str, method: str, path: str, params: dict[str, Any],
                body: bytes | None = None, secret: str | None = None) -> Response:
    """A request carrying ``Authorization: Bearer secret`` (none when ``secret`` is None),
    as to a node with ``--auth-http-address``."""
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else None
    return request(method, _url(address, path, params), body, headers=headers)


def pub(address: str, topic: str, body: bytes, defer_ms: int | None = None,
        partition: int | None = None, **kw: Any) -> Response:
    params: dict[str, Any] = {"topic": topic}
    if defer_ms is not None:
        params["defer"] = defer_ms
    if partition is not None:
        params["partition"] = partition
    return request("POST", _url(address, "/pub", params), body, **kw)


def mpub(address: str, topic: str, bodies: list[bytes], *, binary: bool = False,
         **kw: Any) -> Response:
    params: dict[str, Any] = {"topic": topic}
    if binary:
        params["binary"] = "true"
        data = struct.pack(">I", len(bodies)) + b"".join(
            struct.pack(">I", len(b)) + b for b in bodies)
    else:
        assert all(b"\n" not in b for b in bodies)
        data = b"\n".join(bodies)
    return request("POST", _url(address, "/mpub", params), data, **kw)


def post(address: str, path: str, **params: Any) -> Response:
    return request("POST", _url(address, path, params), b"")


def get(address: str, path: str, **params: Any) -> Response:
    return request("GET", _url(address, path, params or None))


def stats(address: str, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"format": "json"}
    if topic:
        params["topic"] = topic
    if channel:
        params["channel"] = channel
    r = request("GET", _url(address, "/stats", params))
    assert r.status == 200, f"GET /stats -> {r.status} {r.body[:300]!r}"
    return r.json()


def channel_stats(address: str, topic: str, channel: str) -> dict[str, Any] | None:
    """The channel's entry in /stats, or None if the topic/channel does not exist."""
    for t in stats(address, topic, channel).get("topics") or []:
        if t.get("topic_name") == topic:
            for c in t.get("channels") or []:
                if c.get("channel_name") == channel:
                    return c
    return None
