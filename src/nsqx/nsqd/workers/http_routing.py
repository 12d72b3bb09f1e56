"""The HTTP API of a worker (``nsqd --workers``) answers as the one node would.

A request naming a topic (``?topic=``) another worker owns is proxied to that worker's
internal HTTP socket, whatever its path (publish, topic and channel create, delete,
pause, empty, config, fetch, routes, trace, replay); ``/stats`` and ``/metrics`` merge
every worker's topics into one answer. Requests that came in on an internal socket are
the owner's to answer and are never routed again. aiohttp is imported where it is used:
the worker imports this module at its start, and the node loads aiohttp with its HTTP
API, in a thread, after ``/ping`` answers (``install`` runs then).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from nsqx import NSQ_VERSION
from nsqx.nsqd.metrics import memory_stats, prometheus_text
from nsqx.nsqd.stats_text import format_stats
from nsqx.nsqd.workers.limits import FORWARD_TIMEOUT, RETRY_CAP, RETRY_FIRST

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web

__all__ = ["install", "merge_stats"]

log = logging.getLogger("nsqx.nsqd.workers")

_BOOL = {"true": True, "1": True, "false": False, "0": False}
_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                  "upgrade", "te", "trailer", "proxy-connection"})
_SKIP_ANSWER = _HOP | {"date", "server", "content-encoding"}
STATS_TIMEOUT = 5.0


def install(app: web.Application, rt: Any) -> None:
    app.middlewares.append(_middleware(rt))


def _internal(request: web.Request) -> bool:
    tr = request.transport
    name = tr.get_extra_info("sockname") if tr is not None else None
    return isinstance(name, (str, bytes))  # a unix socket: another worker's request


def _middleware(rt: Any) -> Any:
    from aiohttp import web

    @web.middleware
    async def route_to_worker(request: web.Request, handler: Any) -> web.StreamResponse:
        if _internal(request):
            return await handler(request)
        path = request.path
        if path == "/stats" or path == "/metrics":
            return await _merged(rt, request, path)
        topic = request.query.get("topic")
        if topic and not rt.owned(topic):
            return await _proxy(rt, rt.owner(topic), request)
        return await handler(request)
    return route_to_worker


def _session(rt: Any, k: int) -> aiohttp.ClientSession:
    import aiohttp

    session = rt.http_sessions.get(k)
    if session is None or session.closed:
        session = rt.http_sessions[k] = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=rt.path(k, "http")), auto_decompress=False)
    return session


async def _proxy(rt: Any, k: int, request: web.Request) -> web.StreamResponse:
    """The request, as it came, to worker ``k``; its answer, as it came, back. A worker
    that is down (restarting) is tried again until FORWARD_TIMEOUT; only a connection
    that was never made is retried, so no request runs twice."""
    import aiohttp
    from aiohttp import web
    from yarl import URL

    body = await request.read()
    headers = {h: v for h, v in request.headers.items() if h.lower() not in _HOP}
    url = URL("http://nsqd-worker" + request.raw_path, encoded=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FORWARD_TIMEOUT
    delay = RETRY_FIRST
    while True:
        try:
            async with _session(rt, k).request(request.method, url, data=body,
                                               headers=headers,
                                               allow_redirects=False) as r:
                data = await r.read()
                out = web.Response(status=r.status, body=data)
                for h, v in r.headers.items():
                    if h.lower() not in _SKIP_ANSWER:
                        out.headers[h] = v
                return out
        except aiohttp.ClientConnectorError as exc:
            if loop.time() > deadline:
                log.warning("workers: worker %d not reachable for %s: %s", k, request.path, exc)
                return web.json_response(
                    {"message": f"worker {k} (this topic's owner) is not reachable"},
                    status=503)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)


async def _stats_of(rt: Any, k: int, params: dict[str, str]) -> dict[str, Any] | None:
    """Worker ``k``'s stats; None when it does not answer within STATS_TIMEOUT. A worker
    that is down (restarting, or not up yet after the node's start: the listeners accept
    before every worker is) is tried again until then, as a proxied request is."""
    import aiohttp

    delay = RETRY_FIRST
    try:
        async with asyncio.timeout(STATS_TIMEOUT):
            while True:
                try:
                    async with _session(rt, k).get("http://nsqd-worker/stats",
                                                   params=params) as r:
                        if r.status != 200:
                            return None
                        data: Any = orjson.loads(await r.read())
                        return data if isinstance(data, dict) else None
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_CAP)
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
        log.warning("workers: /stats of worker %d failed: %r", k, exc)
        return None


def merge_stats(local: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's stats from every worker's: topics (each in one worker) in name order,
    producers (connections, each in one worker) together, without the workers' own
    forwarding connections (user agent ``nsqx-worker``)."""
    topics = list(local.get("topics") or [])
    producers = list(local.get("producers") or [])
    for o in others:
        topics.extend(o.get("topics") or [])
        producers.extend(o.get("producers") or [])
    producers = [p for p in producers if p.get("user_agent") != "nsqx-worker"]
    topics.sort(key=lambda t: t.get("topic_name", ""))
    return {**local, "topics": topics, "producers": producers}


async def _merged(rt: Any, request: web.Request, path: str) -> web.StreamResponse:
    from aiohttp import web

    q = request.query
    node = rt.node
    metrics = path == "/metrics"
    topic = None if metrics else (q.get("topic") or None)
    channel = None if metrics else (q.get("channel") or None)
    include_clients = False if metrics else _BOOL.get(q.get("include_clients") or "", True)
    include_mem = False if metrics else _BOOL.get(q.get("include_mem") or "", True)
    params = {"format": "json", "include_clients": str(include_clients).lower(),
              "include_mem": "false"}
    if topic:
        params["topic"] = topic
    if channel:
        params["channel"] = channel
    others_k = [k for k in range(rt.count) if k != rt.index]
    answers = await asyncio.gather(*(_stats_of(rt, k, params) for k in others_k))
    local = node.stats_dict(topic=topic, channel=channel, include_clients=include_clients,
                            include_mem=include_mem)
    stats = merge_stats(local, [a for a in answers if a is not None])
    missing = [k for k, a in zip(others_k, answers, strict=True) if a is None]
    health = node.health()
    if missing:
        health = f"NOK - workers {', '.join(map(str, missing))} not answering"
    unhealthy = [a["health"] for a in answers if a is not None and a.get("health") != "OK"]
    if unhealthy and not missing:
        health = unhealthy[0]
    if metrics:
        text = prometheus_text(stats, healthy=health == "OK",
                               node_id=node.opts.node_id,
                               start_time=float(node.start_time))
        return web.Response(body=text.encode(), headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    memory = (stats.get("memory") or memory_stats()) if include_mem else None
    if q.get("format") != "json":
        return web.Response(text=format_stats(stats, memory, health, float(node.start_time)),
                            content_type="text/plain")
    out: dict[str, Any] = {"version": NSQ_VERSION, "health": health,
                           "start_time": int(node.start_time), "topics": stats["topics"]}
    if memory is not None:
        out["memory"] = memory
    out["producers"] = stats["producers"]
    return web.Response(body=orjson.dumps(out), content_type="application/json")
