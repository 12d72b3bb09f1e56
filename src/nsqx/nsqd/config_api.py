"""Per-topic and per-channel settings over HTTP (nsqx additions; upstream has none).

``POST /topic/config?topic=T&ttl=D``
    Messages of T published longer ago than D are skipped at delivery (``expired_count``).
    D is a Go duration (``90s``, ``2h``) or milliseconds; ``0`` turns the TTL off;
    ``default`` returns to ``--msg-ttl``.
``POST /topic/config?topic=T&sync_every=N``
    T's partitions fsync after every N messages (``1``: each publish is acknowledged only
    once fsynced); ``default`` (or 0) returns to ``--sync-every``. ``ttl`` and
    ``sync_every`` may be given together.
``POST /channel/config?topic=T&channel=C&max_attempts=N``
    A message delivered N times on C goes to ``T.dlq`` instead of an (N+1)-th delivery;
    ``0`` turns it off, ``default`` returns to ``--max-attempts``.

Both answer 200 with the settings now in force (JSON), persist them in ``nsqd.dat``, and
refuse bad input the way the rest of the API does: 400 ``MISSING_ARG_*`` /
``INVALID_TTL`` / ``INVALID_SYNC_EVERY`` / ``INVALID_MAX_ATTEMPTS``, 404 ``TOPIC_NOT_FOUND`` / ``CHANNEL_NOT_FOUND``
(nothing is created by a setting).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from nsqx.flags import parse_go_duration
from nsqx.httpapi import HTTPError, topic_channel_args
from nsqx.httpapi import first as _first
from nsqx.httpapi import query as _query
from nsqx.nsqd.http_publish import existing_topic
from nsqx.protocol.v2 import TRACE_TOPIC

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeAPI

log = logging.getLogger("nsqx.nsqd.http")

MAX_TTL_MS = 366 * 24 * 3600 * 1000
MAX_ATTEMPTS = 65535  # the frame's attempts field is 16 bits
MAX_SYNC_EVERY = 1 << 30

__all__ = ["add_routes", "apply_settings", "export_settings"]


def _json(obj: Any) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _ttl_ms(raw: str) -> int:
    try:
        ms = int(raw) if raw.isascii() and raw.isdigit() else round(parse_go_duration(raw) * 1000)
    except (ValueError, TypeError):
        raise HTTPError(400, "INVALID_TTL") from None
    if not 0 <= ms <= MAX_TTL_MS:
        raise HTTPError(400, "INVALID_TTL")
    return ms


def export_settings(part: Any) -> dict[str, Any]:
    """A partition's per-topic and per-channel settings as a leader sends them to its
    followers (cluster mode: with the channel cursors), so a failover keeps them."""
    return {"ttl_ms": part.msg_ttl_ns // 1_000_000 if part.msg_ttl_set else None,
            "trace": part.tracer is not None,
            "channels": {c.name: c.max_attempts if c.max_attempts_set else None
                         for c in part.channels.values() if not c.ephemeral}}


def apply_settings(part: Any, settings: Any) -> bool:
    """A follower takes its leader's settings (see :func:`export_settings`); True if any
    changed (the caller persists). Malformed values are ignored, with a warning."""
    nsqd, changed = part.nsqd, False
    try:
        ttl = settings.get("ttl_ms")
        want = (int(ttl) * 1_000_000, True) if ttl is not None else \
            (int(nsqd.opts.msg_ttl * 1e9), False)
        if (part.msg_ttl_ns, part.msg_ttl_set) != want and 0 <= want[0] <= MAX_TTL_MS * 10**6:
            part.msg_ttl_ns, part.msg_ttl_set = want
            changed = True
        trace = settings.get("trace") is True
        if (part.tracer is not None) != trace and part.name != TRACE_TOPIC:
            tracer = nsqd.tracer  # (the node makes its recorder when asked)
            if tracer is not None:
                part.tracer = tracer if trace else None
                changed = True
        for name, n in (settings.get("channels") or {}).items():
            ch = part.channels.get(name)
            if ch is None:
                continue
            val = (int(n), True) if n is not None else (nsqd.opts.max_attempts, False)
            if (ch.max_attempts, ch.max_attempts_set) != val and 0 <= val[0] <= MAX_ATTEMPTS:
                ch.max_attempts, ch.max_attempts_set = val
                changed = True
    except (AttributeError, TypeError, ValueError) as e:
        log.warning("TOPIC(%s) PARTITION(%d): ignoring malformed settings from the leader: %s",
                    part.name, part.partition, e)
    return changed


def _sync_every(raw: str) -> int:
    if raw == "default":
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > MAX_SYNC_EVERY:
        raise HTTPError(400, "INVALID_SYNC_EVERY")
    return int(raw)


class _ConfigAPI:
    def __init__(self, nsqd: NodeAPI) -> None:
        self.nsqd = nsqd

    def _topic(self, name: str) -> Any:
        return existing_topic(self.nsqd, name)

    async def topic_config(self, request: web.Request) -> web.Response:
        params = _query(request)
        name = _first(params, "topic")
        if not name:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self._topic(name)
        raw = _first(params, "ttl")
        raw_sync = _first(params, "sync_every")
        if raw is None and raw_sync is None:
            raise HTTPError(400, "MISSING_ARG_TTL")
        sync = None if raw_sync is None else _sync_every(raw_sync)
        if raw is not None:
            if raw == "default":
                ns, is_set = int(self.nsqd.opts.msg_ttl * 1e9), False
            else:
                ns, is_set = _ttl_ms(raw) * 1_000_000, True
            for part in topic.partitions:
                part.msg_ttl_ns, part.msg_ttl_set = ns, is_set
            log.info("TOPIC(%s): TTL %s", name, f"{ns // 1_000_000} ms" if ns else "off")
        if sync is not None:
            for part in topic.partitions:
                part.set_sync_every(sync)
            log.info("TOPIC(%s): fsync every %s", name,
                     f"{sync} messages" if sync else f"{self.nsqd.opts.sync_every} (default)")
        self.nsqd.metadata_changed()
        self.nsqd.persist_metadata()
        return _json({"topic": name, "ttl_ms": topic.msg_ttl_ns // 1_000_000,
                      "sync_every": topic.sync_every or self.nsqd.opts.sync_every})

    async def channel_config(self, request: web.Request) -> web.Response:
        params = _query(request)
        tname, cname = topic_channel_args(params)
        topic = self._topic(tname)
        if cname not in topic.channels:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        raw = _first(params, "max_attempts")
        if raw is None:
            raise HTTPError(400, "MISSING_ARG_MAX_ATTEMPTS")
        if raw == "default":
            n, is_set = self.nsqd.opts.max_attempts, False
        else:
            # ASCII digits only ("²".isdigit() but int() refuses it), and few of them
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or int(raw) > MAX_ATTEMPTS:
                raise HTTPError(400, "INVALID_MAX_ATTEMPTS")
            n, is_set = int(raw), True
        for part in topic.partitions:
            ch = part.channels.get(cname)
            if ch is not None:
                ch.max_attempts, ch.max_attempts_set = n, is_set
                ch.wake()
        self.nsqd.metadata_changed()
        self.nsqd.persist_metadata()
        log.info("TOPIC(%s) CHANNEL(%s): max attempts %s", tname, cname, n or "off")
        return _json({"topic": tname, "channel": cname, "max_attempts": n})


def add_routes(app: web.Application, nsqd: NodeAPI) -> None:
    api = _ConfigAPI(nsqd)
    app.router.add_post("/topic/config", api.topic_config)
    app.router.add_post("/channel/config", api.channel_config)
