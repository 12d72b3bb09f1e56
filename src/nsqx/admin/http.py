"""nsqadmin's HTTP server (upstream ``nsqadmin/http.go``): the pages, upstream's ``/api``
JSON (so scripts keep working), ``/config``, the Graphite proxy, and nsqx's
``/api/graphs/...`` for the built-in charts.

Security:

* every state-changing request (POST/PUT/DELETE) that comes from a browser must carry the
  CSRF token of the ``nsqadmin_csrf`` cookie in an ``X-CSRF-Token`` header (double submit),
  and its ``Origin``/``Sec-Fetch-Site`` must be this site. Requests with none of the
  headers a browser always sends (``Origin``, ``Sec-Fetch-*``, ``Cookie``) are scripts
  (curl against upstream's API) and pass -- a browser cannot send a request without them.
* with ``--admin-user``, only those users (named by the ``--acl-http-header`` a trusted
  proxy sets) may act; others get 403 ``FORBIDDEN`` and read-only pages.
* pages have no inline script or style, and a strict Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import mimetypes
import re
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import orjson
from aiohttp import web

from nsqx import NSQ_VERSION
from nsqx.httpapi import (
    HTTPError,
    client_address,
    client_fault,
    go_json,
    trace_search_args,
    v1_error,
    v1_json,
)
from nsqx.protocol.errors import ProtocolError
from nsqx.protocol.names import is_ephemeral, valid_channel_name, valid_topic_name
from nsqx.protocol.v2 import parse_start_position

from . import pages
from .aggregate import aggregate_channels, aggregate_topic, node_topic_stats, strip_omitempty
from .cluster import (
    ClusterClient,
    ClusterRefused,
    RequestError,
    UpstreamError,
    http_address,
    node_url_addr,
)
from .notify import Notifier, admin_action
from .options import LOG_LEVELS, PROGRAM, Options
from .sampler import Sampler

__all__ = ["CSRF_COOKIE", "CSRF_HEADER", "AdminHTTP"]

log = logging.getLogger("nsqx.admin")

CSRF_COOKIE = "nsqadmin_csrf"
CSRF_HEADER = "X-CSRF-Token"
STATIC_DIR = Path(__file__).parent / "static"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
_V1 = ("X-NSQ-Content-Type", "nsq; version=1.0")
# a cluster node id: broadcast address:tcp port:http port by default (IPv6 in brackets)
_NODE_ID = re.compile(r"[A-Za-z0-9._:\-\[\]]{1,255}")
MAX_PARTITIONS = 1024  # nsqlookupd's limits (nsqx.cluster.model.TopicMeta)
MAX_REPLICAS = 16


def _bounded_int(body: dict[str, Any], key: str, lo: int, hi: int, default: int | None,
                 code: str) -> int:
    """A JSON number or decimal string in lo..hi (empty/absent -> default), else 400."""
    v = body.get(key)
    if v is None or v == "":
        if default is None:
            raise HTTPError(400, code)
        return default
    if isinstance(v, str) and v.isascii() and v.strip().isdigit() and len(v.strip()) <= 6:
        v = int(v.strip())
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise HTTPError(400, code)
    return v


def _warn(messages: list[str]) -> str:
    """upstream maybeWarnMsg."""
    return "WARNING: " + "; ".join(messages) if messages else ""


CLUSTER_ROUTES = "nsqlookupd"  # a cluster topic's routes are changed through lookupd
_ROUTE_ARGS = {"split": ("partition", "at"), "merge": ("a", "b"), "move": ("partition", "node")}


def _upstream(e: UpstreamError) -> HTTPError:
    return HTTPError(502, f"UPSTREAM_ERROR: {e}")


def _public(p: dict[str, Any]) -> dict[str, Any]:
    """A producer as upstream's JSON (internal keys dropped, omitempty topology)."""
    out = {k: v for k, v in p.items() if not k.startswith("_") and k != "health"}
    for k in ("topology_zone", "topology_region"):
        if not out.get(k):
            out.pop(k, None)
    out["remote_addresses"] = out.get("remote_addresses") or None
    return out


class AdminHTTP:
    def __init__(self, opts: Options, cluster: ClusterClient, sampler: Sampler,
                 notifier: Notifier) -> None:
        self.opts = opts
        self.cluster = cluster
        self.sampler = sampler
        self.notifier = notifier
        self._static: dict[str, bytes] = {}

    # ================================================================== plumbing
    @property
    def base(self) -> str:
        return "" if self.opts.base_path == "/" else self.opts.base_path

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1024 * 1024 + 1)
        r = app.router
        b = self.base
        page_routes = {
            "/": self.page_topics, "/topics": self.page_topics,
            "/topics/{topic}": self.page_topic, "/topics/{topic}/{channel}": self.page_channel,
            "/nodes": self.page_nodes, "/nodes/{node}": self.page_node,
            "/counter": self.page_counter, "/lookup": self.page_lookup,
            "/messages": self.page_messages, "/trace": self.page_trace,
            "/cluster": self.page_cluster,
        }
        for path, fn in page_routes.items():
            r.add_get(b + path, fn)
        if b:
            r.add_get(b, self.page_topics)  # upstream: path.Join(base, "/")
        r.add_get(b + "/ping", self.ping)
        r.add_get(b + "/static/{asset}", self.static)
        if self.opts.proxy_graphite:
            r.add_get(b + "/render", self.graphite_proxy)
        r.add_get(b + "/api/topics", self.api_topics)
        r.add_get(b + "/api/topics/{topic}", self.api_topic)
        r.add_get(b + "/api/topics/{topic}/{channel}", self.api_channel)
        r.add_get(b + "/api/nodes", self.api_nodes)
        r.add_get(b + "/api/nodes/{node}", self.api_node)
        r.add_post(b + "/api/topics", self.api_create)
        r.add_post(b + "/api/topics/{topic}", self.api_topic_action)
        r.add_post(b + "/api/topics/{topic}/{channel}", self.api_channel_action)
        r.add_delete(b + "/api/nodes/{node}", self.api_tombstone)
        r.add_delete(b + "/api/topics/{topic}", self.api_delete_topic)
        r.add_delete(b + "/api/topics/{topic}/{channel}", self.api_delete_channel)
        r.add_get(b + "/api/counter", self.api_counter)
        r.add_get(b + "/api/graphite", self.api_graphite)
        r.add_get(b + "/api/graphs/topics/{topic}", self.api_graph)
        r.add_get(b + "/api/graphs/topics/{topic}/{channel}", self.api_graph)
        r.add_get(b + "/api/health", self.api_health)
        r.add_get(b + "/api/messages", self.api_messages)
        r.add_get(b + "/api/trace", self.api_trace)
        r.add_get(b + "/api/cluster", self.api_cluster)
        r.add_post(b + "/api/cluster/topics", self.api_cluster_create)
        r.add_post(b + "/api/cluster/nodes/{node}", self.api_cluster_node)
        r.add_get(b + "/config/{opt}", self.config)
        r.add_put(b + "/config/{opt}", self.config)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.method not in _SAFE_METHODS:
                self._check_csrf(request)
            resp = await handler(request)
        except HTTPError as e:
            resp = v1_error(e.status, e.code)
        except web.HTTPNotFound:
            resp = v1_error(404, "NOT_FOUND")
        except web.HTTPMethodNotAllowed:
            resp = v1_error(405, "METHOD_NOT_ALLOWED")
        except web.HTTPException as e:
            resp = v1_error(e.status, e.reason.upper().replace(" ", "_"))
        except Exception as exc:
            if (reason := client_fault(request, exc)) is not None:
                log.warning("HTTP: bad request from %s - %s", client_address(request), reason)
                resp = v1_error(400, "INVALID_REQUEST")
            else:
                log.exception("%s %s failed", request.method, request.path)
                resp = v1_error(500, "INTERNAL_ERROR")
        h = resp.headers
        if request.path.startswith(self.base + "/api") or request.path.startswith(
                self.base + "/config"):
            h[_V1[0]] = _V1[1]
        h.setdefault("X-Content-Type-Options", "nosniff")
        h.setdefault("Referrer-Policy", "same-origin")
        h.setdefault("X-Frame-Options", "DENY")
        img = "'self' data:"
        if self.opts.graphite_url and not self.opts.proxy_graphite:
            parts = urlsplit(self.opts.graphite_url)
            img += f" {parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port
                                                             else "")
        h.setdefault("Content-Security-Policy",
                     "default-src 'self'; script-src 'self'; style-src 'self'; "
                     f"img-src {img}; connect-src 'self'; object-src 'none'; "
                     "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
        return resp

    def _check_csrf(self, request: web.Request) -> None:
        hdrs = request.headers
        origin = hdrs.get("Origin")
        from_browser = (origin is not None or "Sec-Fetch-Site" in hdrs
                        or "Sec-Fetch-Mode" in hdrs or "Cookie" in hdrs)
        if not from_browser:
            return  # a script (curl, upstream tooling): no ambient credentials to abuse
        if origin is not None:
            o = urlsplit(origin)
            hosts = {request.host, hdrs.get("X-Forwarded-Host", "")}
            if origin == "null" or not o.netloc or o.netloc not in hosts:
                raise HTTPError(403, "CSRF_ORIGIN_MISMATCH")
        site = hdrs.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPError(403, "CSRF_ORIGIN_MISMATCH")
        token = hdrs.get(CSRF_HEADER, "")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not token or not cookie or not secrets.compare_digest(token, cookie):
            raise HTTPError(403, "CSRF_TOKEN_INVALID")

    def is_admin(self, request: web.Request) -> bool:
        """upstream isAuthorizedAdminRequest."""
        if not self.opts.admin_users:
            return True
        user = request.headers.get(self.opts.acl_http_header, "")
        return user in self.opts.admin_users

    def _require_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise HTTPError(403, "FORBIDDEN")

    def _notify(self, action: str, topic: str, channel: str, node: str,
                request: web.Request) -> None:
        if self.opts.notification_http_endpoint:
            self.notifier.notify(admin_action(action, topic, channel, node, request,
                                              self.opts.acl_http_header))

    @staticmethod
    async def _json_body(request: web.Request, code: str | None = None) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise HTTPError(400, code or str(e)) from None
        if not isinstance(body, dict):
            raise HTTPError(400, code or "INVALID_BODY")
        return body

    # ================================================================== pages
    def _ctx(self, request: web.Request, errors: list[str]) -> tuple[pages.Ctx, str | None]:
        down = self.cluster.down_nodes()
        covered = {d.error for d in down}
        messages = [_warn([m for m in errors if m not in covered])]
        token = request.cookies.get(CSRF_COOKIE)
        new = None
        if not token or len(token) < 32:
            token = new = secrets.token_urlsafe(32)
        ctx = pages.Ctx(
            base_path=self.opts.base_path, version=NSQ_VERSION, is_admin=self.is_admin(request),
            lookupd=list(self.opts.nsqlookupd_http_addresses), messages=messages,
            down=down,
            graphite={"enabled": bool(self.opts.graphite_url), "proxy": self.opts.proxy_graphite,
                      "url": self.opts.graphite_url, "statsd_prefix": self.opts.statsd_prefix,
                      "statsd_gauge_format": self.opts.statsd_gauge_format,
                      "statsd_counter_format": self.opts.statsd_counter_format},
            sample_interval=self.sampler.interval if self.sampler.enabled else 0,
            csrf_cookie=CSRF_COOKIE)
        return ctx, new

    def _html(self, request: web.Request, ctx_new: tuple[pages.Ctx, str | None], html: str,
              status: int = 200) -> web.Response:
        resp = web.Response(text=html, status=status, content_type="text/html", charset="utf-8")
        resp.headers["Cache-Control"] = "no-store"
        _, new = ctx_new
        if new:
            resp.set_cookie(CSRF_COOKIE, new, path=self.opts.base_path, samesite="Strict",
                            httponly=False, secure=request.secure)
        return resp

    def _page_error(self, request: web.Request, e: UpstreamError) -> web.Response:
        cn = self._ctx(request, [])
        return self._html(request, cn, pages.render_error(cn[0], 502, f"UPSTREAM_ERROR: {e}"),
                          status=502)

    async def _all_topic_stats(self) -> tuple[dict[str, list[dict[str, Any]]],
                                              list[dict[str, Any]], list[str]]:
        """{topic: [per-node TopicStats]} over every node, producers, errors."""
        producers, errs = await self.cluster.producers()
        stats, errs2 = await self.cluster.nsqd_stats(producers, include_clients=False)
        now = time.time()
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for p, st in stats:
            for t in st.get("topics") or []:
                by_topic.setdefault(t.get("topic_name", ""), []).append(
                    node_topic_stats(t, p, now))
        return by_topic, producers, errs + errs2

    async def page_topics(self, request: web.Request) -> web.Response:
        try:
            by_topic, _, errs = await self._all_topic_stats()
            names, errs2 = await self.cluster.topics()
        except UpstreamError as e:
            return self._page_error(request, e)
        rows = []
        for name in sorted(by_topic):
            agg = aggregate_topic(name, by_topic[name])
            agg["in_flight_count"] = sum(c["in_flight_count"] for c in agg["channels"])
            agg["channel_depth"] = sum(c["depth"] for c in agg["channels"])
            rows.append(agg)
        inactive = [t for t in names if t not in by_topic]
        cn = self._ctx(request, errs + errs2)
        rates = self.sampler.latest_topic_rates() if self.sampler.enabled else {}
        return self._html(request, cn, pages.render_topics(cn[0], rows, rates, inactive))

    async def _topic_agg(self, topic: str, channel: str = "", include_clients: bool = False
                         ) -> tuple[dict[str, Any], list[str]]:
        producers, errs = await self.cluster.topic_producers(topic)
        stats, errs2 = await self.cluster.nsqd_stats(producers, topic, channel, include_clients)
        now = time.time()
        per_node = [node_topic_stats(t, p, now) for p, st in stats
                    for t in st.get("topics") or [] if t.get("topic_name") == topic]
        return aggregate_topic(topic, per_node), errs + errs2

    async def page_topic(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        try:
            agg, errs = await self._topic_agg(topic)
        except UpstreamError as e:
            return self._page_error(request, e)
        cstats, cerr = await self._cluster_stats_for_page()
        ctopic = (cstats.get("topics") or {}).get(topic) if cstats else None
        routes = await self._topic_routes(topic, [n["node"] for n in agg.get("nodes") or []])
        cn = self._ctx(request, errs + ([cerr] if cerr else []))
        rates = self.sampler.latest_topic_rates() if self.sampler.enabled else {}
        return self._html(request, cn, pages.render_topic(
            cn[0], topic, agg, rates, bool(self.opts.nsqlookupd_http_addresses),
            cluster_topic=ctopic, cluster=cstats, routes=routes))

    async def _topic_routes(self, topic: str, nodes: list[str]
                            ) -> tuple[str, dict[str, Any]] | None:
        """A route-managed ordered topic's history: in cluster mode lookupd's (its
        coordinator changes it; ``"nsqlookupd"`` is returned as the node), else from the
        first nsqd that has one (``GET /topic/route``; other topics answer 400 there)."""
        try:
            body = await self.cluster.cluster_route(topic)
        except UpstreamError:
            body = None
        if body is not None:
            return CLUSTER_ROUTES, body
        for node in nodes:
            try:
                body = await self.cluster.get_json("nsqd", node,
                                                   f"/topic/route?topic={quote(topic)}")
            except RequestError:
                continue
            if isinstance(body, dict) and body.get("versions"):
                return node, body
        return None

    async def page_channel(self, request: web.Request) -> web.Response:
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        try:
            agg, errs = await self._topic_agg(topic, channel, include_clients=True)
        except UpstreamError as e:
            return self._page_error(request, e)
        chan = next((c for c in agg["channels"] if c["channel_name"] == channel), None)
        cn = self._ctx(request, errs)
        return self._html(request, cn, pages.render_channel(cn[0], topic, channel, chan))

    async def page_nodes(self, request: web.Request) -> web.Response:
        try:
            producers, errs = await self.cluster.producers()
        except UpstreamError as e:
            return self._page_error(request, e)
        stats, errs2 = await self.cluster.nsqd_stats(producers, include_clients=False,
                                                      all_or_nothing=False)
        health: dict[str, dict[str, Any]] = {}
        for p in producers:
            p["_node"] = http_address(p)
            health[p["_node"]] = {"down": True, "error": self._down_error(p)}
        for p, st in stats:
            health[p["_node"]] = {"down": False, "health": st.get("health", "")}
        lookupds = await self.cluster.lookupd_info() if self.opts.nsqlookupd_http_addresses \
            else []
        cn = self._ctx(request, errs + errs2)
        return self._html(request, cn, pages.render_nodes(cn[0], producers, health, lookupds))

    def _down_error(self, p: dict[str, Any]) -> str:
        st = self.cluster.health.get(node_url_addr(p))
        return st.error if st else ""

    async def page_node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        try:
            producers, errs = await self.cluster.producers()
        except UpstreamError as e:
            return self._page_error(request, e)
        producer = next((p for p in producers if http_address(p) == node), None)
        topics: list[dict[str, Any]] = []
        down = ""
        if producer is not None:
            stats, errs2 = await self.cluster.nsqd_stats([producer], include_clients=True,
                                                          all_or_nothing=False)
            errs += errs2
            if stats:
                now = time.time()
                topics = [node_topic_stats(t, producer, now)
                          for t in stats[0][1].get("topics") or []]
            else:
                down = self._down_error(producer) or "no answer"
        cn = self._ctx(request, errs)
        return self._html(request, cn, pages.render_node(cn[0], node, producer, topics, down))

    async def page_counter(self, request: web.Request) -> web.Response:
        cn = self._ctx(request, [])
        return self._html(request, cn, pages.render_counter(cn[0]))

    async def page_lookup(self, request: web.Request) -> web.Response:
        topics: dict[str, list[str]] = {}
        inactive: set[str] = set()
        errs: list[str] = []
        if self.opts.nsqlookupd_http_addresses:
            try:
                names, errs = await self.cluster.lookupd_topics()
                producers, errs2 = await self.cluster.lookupd_producers()
            except UpstreamError as e:
                return self._page_error(request, e)
            errs += errs2
            active = {t["topic"] for p in producers for t in p["topics"]}
            chans = await asyncio.gather(*(self.cluster.lookupd_topic_channels(t)
                                           for t in names), return_exceptions=True)
            for t, c in zip(names, chans, strict=True):
                topics[t] = c[0] if isinstance(c, tuple) else []
                if t not in active:
                    inactive.add(t)
        cn = self._ctx(request, errs)
        return self._html(request, cn, pages.render_lookup(cn[0], topics, inactive))

    def _message_query(self, q: Any) -> tuple[str, str] | None:
        """(topic, nsqd /message/get query) from the search form; None when it is empty."""
        topic = (q.get("topic") or "").strip()
        mid = (q.get("id") or "").strip()
        offset = (q.get("offset") or "").strip()
        partition = (q.get("partition") or "").strip()
        if not topic or not (mid or offset):
            return None  # the page shows the (prefilled) form
        if not valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if mid and offset:
            raise HTTPError(400, "GIVE_ID_OR_OFFSET")
        if mid:
            if len(mid) > 20 or not mid.isascii() or not mid.isalnum():
                raise HTTPError(400, "INVALID_ID")
            query = f"search_mode=id&search_pos={mid}"
        else:
            if not (offset.isascii() and offset.isdigit()) or len(offset) > 20:
                raise HTTPError(400, "INVALID_OFFSET")
            query = f"search_mode=count&search_pos={offset}"
        if partition:
            if not (partition.isascii() and partition.isdigit()) or len(partition) > 5:
                raise HTTPError(400, "INVALID_PARTITION")
            query += f"&partition={partition}"
        return topic, query

    async def _find_message(self, q: Any) -> tuple[list[dict[str, Any]], list[str]]:
        parsed = self._message_query(q)
        if parsed is None:
            raise HTTPError(400, "GIVE_ID_OR_OFFSET" if q.get("topic") else "MISSING_ARG_TOPIC")
        topic, query = parsed
        found, errs = await self.cluster.get_message(topic, query)
        return [{"node": n, **m} for n, m in found], errs

    async def api_messages(self, request: web.Request) -> web.Response:
        """nsqx: the message search: ``?topic=T&id=ID`` or ``&offset=N[&partition=P]`` ->
        ``{"messages": [{node, id, offset, timestamp, attempts, body, ...}], "message"}``."""
        try:
            found, errs = await self._find_message(request.query)
        except UpstreamError as e:
            raise _upstream(e) from None
        return v1_json({"messages": found, "message": _warn(errs)})

    async def page_messages(self, request: web.Request) -> web.Response:
        return await self._search_page(request, self._message_query, self._find_message,
                                       pages.render_messages,
                                       ("topic", "partition", "id", "offset"))

    async def _search_page(self, request: web.Request, parse: Any, find: Any, render: Any,
                           fields: tuple[str, ...]) -> web.Response:
        """A search form page (messages, traces): the form, then what the nodes found, or
        the error; 400 for a malformed query."""
        q = request.query
        found: Any = None
        errs: list[str] = []
        error = ""
        try:
            if parse(q) is not None:
                found, errs = await find(q)
        except HTTPError as e:
            error = e.code
        except UpstreamError as e:
            error = f"UPSTREAM_ERROR: {e}"
        cn = self._ctx(request, errs)
        return self._html(request, cn, render(cn[0], {k: q.get(k, "") for k in fields},
                                              found, error),
                          status=400 if error.startswith(("INVALID", "GIVE")) else 200)

    @staticmethod
    def _trace_query(q: Any) -> tuple[str, str] | None:
        """(topic, nsqd /trace/search query) from the trace form; None when it is empty."""
        topic = (q.get("topic") or "").strip()
        given = {k: (q.get(k) or "").strip() for k in ("id", "trace_id", "header")}
        given = {k: v for k, v in given.items() if v}
        if not topic or not given:
            return None
        if not valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if len(given) > 1:
            raise HTTPError(400, "GIVE_ONE_OF_ID_TRACE_ID_HEADER")
        (k, v), = given.items()
        if k == "header" and len(v) > 1000:
            raise HTTPError(400, "INVALID_HEADER")
        # the value checked as nsqd and nsqlookupd check it (same codes), sent as checked
        checked = trace_search_args({"topic": [topic], k: [v]}).params()
        return topic, urlencode({k: checked[k]}, errors="surrogateescape")

    async def _find_trace(self, q: Any) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        parsed = self._trace_query(q)
        if parsed is None:
            raise HTTPError(400, "GIVE_ONE_OF_ID_TRACE_ID_HEADER" if q.get("topic")
                            else "MISSING_ARG_TOPIC")
        return await self.cluster.trace_search(*parsed)

    async def api_trace(self, request: web.Request) -> web.Response:
        """nsqx: message timelines: ``?topic=T&id=ID|trace_id=N|header=k:v`` ->
        ``{"nodes": [{"node", ...nsqd's /trace/search answer}], "message"}``."""
        try:
            found, errs = await self._find_trace(request.query)
        except UpstreamError as e:
            raise _upstream(e) from None
        return v1_json({"nodes": [{"node": n, **doc} for n, doc in found],
                        "message": _warn(errs)})

    async def page_trace(self, request: web.Request) -> web.Response:
        return await self._search_page(request, self._trace_query, self._find_trace,
                                       pages.render_trace, ("topic", "id", "trace_id", "header"))
    # ================================================================== cluster mode
    async def _cluster_stats_for_page(self) -> tuple[dict[str, Any] | None, str]:
        """lookupd's /cluster/stats, or None when not in cluster mode; a failure is a
        warning on the page (the rest of the page is still shown)."""
        try:
            stats, _ = await self.cluster.cluster_stats()
        except UpstreamError as e:
            return None, f"cluster stats: UPSTREAM_ERROR: {e}"
        except ClusterRefused as e:
            return None, f"cluster stats: {e.message}"
        return stats, ""

    async def page_cluster(self, request: web.Request) -> web.Response:
        stats, err = await self._cluster_stats_for_page()
        cn = self._ctx(request, [err] if err else [])
        return self._html(request, cn, pages.render_cluster(cn[0], stats, failed=bool(err)))

    async def _require_cluster_mode(self, **kw: Any) -> tuple[dict[str, Any], list[str]]:
        """lookupd's cluster stats and the errors met; 404 ``CLUSTER_MODE_OFF`` when the
        lookupd is standalone, 502 when it cannot be asked."""
        try:
            stats, errs = await self.cluster.cluster_stats(**kw)
        except UpstreamError as e:
            raise _upstream(e) from None
        except ClusterRefused as e:
            raise HTTPError(502, f"UPSTREAM_ERROR: {e.message}") from None
        if stats is None:
            raise HTTPError(404, "CLUSTER_MODE_OFF")
        return stats, errs

    async def api_cluster(self, request: web.Request) -> web.Response:
        """nsqx: lookupd's ``/cluster/stats?log_ends=true`` as is (404 ``CLUSTER_MODE_OFF``
        when the lookupd is standalone)."""
        stats, errs = await self._require_cluster_mode()
        return v1_json({**stats, "message": _warn(errs)})

    async def api_cluster_create(self, request: web.Request) -> web.Response:
        """nsqx: ``{"topic", "partitions", "replicas"?, "ordered"?}`` -> lookupd's
        ``/topic/create?partition_num&replicator&orderedmulti``; lookupd's refusal (e.g.
        ``E_TOPIC_EXISTS`` with another shape) comes back as 400 with its text."""
        self._require_admin(request)
        body = await self._json_body(request, "INVALID_BODY")
        topic = body.get("topic")
        if (not isinstance(topic, str) or not valid_topic_name(topic)
                or is_ephemeral(topic)):
            raise HTTPError(400, "INVALID_TOPIC")
        partitions = _bounded_int(body, "partitions", 1, MAX_PARTITIONS, 1, "INVALID_PARTITIONS")
        replicas = _bounded_int(body, "replicas", 0, MAX_REPLICAS, 0, "INVALID_REPLICAS")
        ordered = body.get("ordered", False)
        if not isinstance(ordered, bool):
            raise HTTPError(400, "INVALID_ORDERED")
        await self._require_cluster_mode(log_ends=False)
        try:
            placed = await self.cluster.cluster_create_topic(topic, partitions, replicas, ordered)
        except UpstreamError as e:
            raise _upstream(e) from None
        except ClusterRefused as e:
            raise HTTPError(400 if e.status == 400 else 502, e.message) from None
        self._notify("create_topic", topic, "", "", request)
        return v1_json({"message": "", "topic": topic,
                        "partitions": placed.get("partitions") or []})

    async def api_cluster_node(self, request: web.Request) -> web.Response:
        """nsqx: ``{"action": "drain"|"undrain"}`` -> lookupd's ``/cluster/node/remove``."""
        self._require_admin(request)
        node = request.match_info["node"]
        if not _NODE_ID.fullmatch(node):
            raise HTTPError(400, "INVALID_NODE")
        body = await self._json_body(request, "INVALID_BODY")
        action = body.get("action")
        if action not in ("drain", "undrain"):
            raise HTTPError(400, "INVALID_ACTION")
        await self._require_cluster_mode(log_ends=False)
        try:
            await self.cluster.cluster_drain(node, undo=action == "undrain")
        except UpstreamError as e:
            raise _upstream(e) from None
        except ClusterRefused as e:
            raise HTTPError(e.status if e.status in (400, 404) else 502, e.message) from None
        self._notify(f"{action}_node", "", "", node, request)
        return v1_json({"message": "", "node": node, "draining": action == "drain"})

    # ================================================================== misc
    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", content_type="text/plain")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        if "/" in name or "\\" in name or name.startswith("."):
            raise HTTPError(404, "NOT_FOUND")
        data = self._static.get(name)
        if data is None:
            root = Path(self.opts.dev_static_dir) if self.opts.dev_static_dir else STATIC_DIR
            try:
                data = (root / name).read_bytes()
            except OSError:
                raise HTTPError(404, "NOT_FOUND") from None
            if not self.opts.dev_static_dir:
                self._static[name] = data
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith(".js"):
            ctype = "text/javascript"
        resp = web.Response(body=data, content_type=ctype)
        resp.headers["Cache-Control"] = "public, max-age=300"
        return resp

    async def graphite_proxy(self, request: web.Request) -> web.Response:
        target = urlsplit(self.opts.graphite_url)
        netloc = target.hostname or ""
        if target.port:
            netloc += f":{target.port}"
        url = f"{target.scheme}://{netloc}{request.raw_path[len(self.base):]}"
        auth = (aiohttp.BasicAuth(target.username, target.password or "")
                if target.username else None)
        try:
            async with self.cluster.session.get(url, auth=auth) as r:
                body = await r.read()
                return web.Response(body=body, status=r.status,
                                    content_type=r.content_type or "application/octet-stream")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.error("graphite proxy: %s", e)
            raise HTTPError(502, "BAD_GATEWAY") from None

    # ================================================================== /api (upstream)
    async def api_topics(self, request: web.Request) -> web.Response:
        try:
            topics, errs = await self.cluster.topics()
        except UpstreamError as e:
            raise _upstream(e) from None
        if request.query.get("inactive") == "true":
            inactive: dict[str, list[str]] = {}
            if self.opts.nsqlookupd_http_addresses:
                for t in topics:
                    producers, _ = await self.cluster.lookupd_topic_producers(t)
                    if not producers:
                        chans, _ = await self.cluster.lookupd_topic_channels(t)
                        inactive[t] = chans
            return v1_json({"topics": inactive, "message": _warn(errs)})
        return v1_json({"topics": topics, "message": _warn(errs)})

    async def api_topic(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        try:
            agg, errs = await self._topic_agg(topic)
        except UpstreamError as e:
            raise _upstream(e) from None
        out = strip_omitempty(agg)
        out["message"] = _warn(errs)
        return v1_json(out)

    async def api_channel(self, request: web.Request) -> web.Response:
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        try:
            agg, errs = await self._topic_agg(topic, channel, include_clients=True)
        except UpstreamError as e:
            raise _upstream(e) from None
        chan = next((c for c in agg["channels"] if c["channel_name"] == channel), None)
        if chan is None:
            chan = aggregate_channels([], topic, channel)
        out = strip_omitempty(chan)
        out["message"] = _warn(errs)
        return v1_json(out)

    async def api_nodes(self, request: web.Request) -> web.Response:
        try:
            producers, errs = await self.cluster.producers()
        except UpstreamError as e:
            raise _upstream(e) from None
        return v1_json({"nodes": [_public(p) for p in producers], "message": _warn(errs)})

    async def api_node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        try:
            producers, errs = await self.cluster.producers()
        except UpstreamError as e:
            raise _upstream(e) from None
        producer = next((p for p in producers if http_address(p) == node), None)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        try:
            stats, _ = await self.cluster.nsqd_stats([producer], include_clients=True)
        except UpstreamError as e:
            raise _upstream(e) from None
        now = time.time()
        topics = [strip_omitempty(node_topic_stats(t, producer, now))
                  for t in stats[0][1].get("topics") or []]
        return v1_json({
            "node": node, "topics": topics,
            "total_messages": sum(t["message_count"] for t in topics),
            "total_clients": sum(len(c["clients"]) for t in topics for c in t["channels"]),
            "message": _warn(errs)})

    async def api_counter(self, request: web.Request) -> web.Response:
        try:
            by_topic, _, errs = await self._all_topic_stats()
        except UpstreamError as e:
            raise _upstream(e) from None
        stats: dict[str, dict[str, Any]] = {}
        for tname, per_node in by_topic.items():
            for t in per_node:
                for c in t["channels"]:
                    key = f"{tname}:{c['channel_name']}:{t['node']}"
                    s = stats.setdefault(key, {"node": t["node"], "topic_name": tname,
                                               "channel_name": c["channel_name"],
                                               "message_count": 0})
                    s["message_count"] += c["message_count"]
        return v1_json({"stats": stats, "message": _warn(errs)})

    async def api_create(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        body = await self._json_body(request)
        topic = body.get("topic")
        channel = body.get("channel") or ""
        if not isinstance(topic, str) or not valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and (not isinstance(channel, str) or not valid_channel_name(channel)):
            raise HTTPError(400, "INVALID_CHANNEL")
        errs = await self.cluster.create_topic_channel(topic, channel)
        self._check_total_failure(errs, "create topic/channel")
        self._notify("create_topic", topic, "", "", request)
        if channel:
            self._notify("create_channel", topic, channel, "", request)
        return v1_json({"message": _warn(errs)})

    def _check_total_failure(self, errs: list[str], what: str) -> None:
        if errs:
            log.warning("%s: %s", what, "; ".join(errs))

    async def _action(self, request: web.Request, topic: str, channel: str) -> web.Response:
        self._require_admin(request)
        body = await self._json_body(request)
        action = body.get("action")
        if action == "reset" and channel:
            return await self._reset(request, topic, channel, body)
        if action in _ROUTE_ARGS and not channel:
            return await self._route_change(request, topic, action, body)
        if action not in ("pause", "unpause", "empty"):
            raise HTTPError(400, "INVALID_ACTION")
        try:
            errs = await self.cluster.topic_channel_action(action, topic, channel)
        except UpstreamError as e:
            raise _upstream(e) from None
        self._check_total_failure(errs, f"{action} {topic}/{channel}")
        self._notify(f"{action}_{'channel' if channel else 'topic'}", topic, channel, "",
                     request)
        return v1_json({"message": _warn(errs)})

    async def _reset(self, request: web.Request, topic: str, channel: str,
                     body: dict[str, Any]) -> web.Response:
        """nsqx: ``{"action": "reset", "position": "timestamp:<unix s>"|"msgcount:<n>"|
        "earliest"|"latest", "partition": P?, "node": "host:port"?}`` -> nsqd's
        ``/channel/setoffset`` on every producer (or ``node``); answers each node's result."""
        position = body.get("position")
        if not isinstance(position, str) or len(position) > 64:
            raise HTTPError(400, "INVALID_POSITION")
        try:
            parse_start_position(position.encode())
        except ProtocolError:
            raise HTTPError(400, "INVALID_POSITION") from None
        partition = body.get("partition")
        if partition is not None and (not isinstance(partition, int) or isinstance(
                partition, bool) or not 0 <= partition <= 0xFFFF):
            raise HTTPError(400, "INVALID_PARTITION")
        node = body.get("node") or ""
        if not isinstance(node, str):
            raise HTTPError(400, "INVALID_NODE")
        if partition is None and not node:
            routed = await self._cluster_reset(request, topic, channel, position)
            if routed is not None:
                return routed
        try:
            results, errs = await self.cluster.set_channel_offset(topic, channel, position,
                                                                  partition, node)
        except UpstreamError as e:
            raise _upstream(e) from None
        if not results and errs:
            raise HTTPError(502, "UPSTREAM_ERROR: " + "; ".join(errs)[:500])
        self._check_total_failure(errs, f"reset {topic}/{channel}")
        self._notify("reset_channel", topic, channel, node, request)
        return v1_json({"message": _warn(errs), "results": [
            {"node": n, "offset": d.get("offset"), "earliest": d.get("earliest"),
             "latest": d.get("latest"), "clamped": d.get("clamped", False)}
            for n, d in results]})

    async def _cluster_reset(self, request: web.Request, topic: str, channel: str,
                             position: str) -> web.Response | None:
        """A cluster route-managed topic's channel is reset by lookupd's coordinator on
        every node at once (its answer: each physical partition's new offset); None for any
        other topic, which nsqd resets node by node."""
        try:
            if await self.cluster.cluster_route(topic) is None:
                return None
            doc = await self.cluster.cluster_reset_channel(topic, channel, position)
        except UpstreamError:
            return None  # no lookupd answers: the nodes answer for themselves
        except ClusterRefused as e:
            raise HTTPError(e.status if 400 <= e.status < 600 else 502, e.message) from None
        self._notify("reset_channel", topic, channel, "", request)
        parts = doc.get("partitions") or {}
        return v1_json({"message": "", "route_version": doc.get("route_version"), "results": [
            {"node": f"{CLUSTER_ROUTES} (partition {p})", "offset": off, "clamped": False}
            for p, off in sorted(parts.items(), key=lambda kv: int(kv[0]))]})

    async def _route_change(self, request: web.Request, topic: str, action: str,
                            body: dict[str, Any]) -> web.Response:
        """nsqx: ``{"action": "split", "partition": P, "at": A}``, ``{"action": "merge",
        "a": P1, "b": P2}`` or ``{"action": "move", "partition": P, "node": N}`` on a
        route-managed ordered topic -> nsqd's ``POST /topic/<action>`` on the node that
        keeps its routes. Values go to nsqd as given (numbers or strings) and nsqd checks
        them: its refusal (a boundary outside the range, partitions not adjacent, a change
        pending, ...) is answered with its status and text as is. Success:
        ``{"message", "node", "version"}`` (the newest route version)."""
        params = {"topic": topic}
        for k in _ROUTE_ARGS[action]:
            v = body.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            if not isinstance(v, str) or len(v) > 256:
                raise HTTPError(400, f"INVALID_{k.upper()}")
            params[k] = v.strip()
        try:
            producers, errs = await self.cluster.topic_producers(topic)
        except UpstreamError as e:
            raise _upstream(e) from None
        if not producers:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        found = await self._topic_routes(topic, [node_url_addr(p) for p in producers])
        if found is None:
            raise HTTPError(400, "TOPIC_NOT_ROUTE_MANAGED")
        node = found[0]
        try:
            if node == CLUSTER_ROUTES:
                h = await self.cluster.cluster_route_change(topic, action, urlencode(params))
            else:
                h = await self.cluster.post_json("nsqd", node,
                                                 f"/topic/{action}?{urlencode(params)}")
        except ClusterRefused as e:
            raise HTTPError(e.status if 400 <= e.status < 600 else 502, e.message) from None
        except RequestError as e:
            if e.status in (400, 404) and e.detail:
                raise HTTPError(e.status, e.detail) from None
            raise HTTPError(502, f"UPSTREAM_ERROR: {e}") from None
        versions = (h or {}).get("versions") or [{}]
        self._notify(f"{action}_topic", topic, "", node, request)
        return v1_json({"message": _warn(errs), "node": node,
                        "version": versions[-1].get("version")})

    async def api_topic_action(self, request: web.Request) -> web.Response:
        return await self._action(request, request.match_info["topic"], "")

    async def api_channel_action(self, request: web.Request) -> web.Response:
        return await self._action(request, request.match_info["topic"],
                                  request.match_info["channel"])

    async def api_delete_topic(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        topic = request.match_info["topic"]
        try:
            errs = await self.cluster.delete_topic(topic)
        except UpstreamError as e:
            raise _upstream(e) from None
        self._check_total_failure(errs, f"delete topic {topic}")
        self._notify("delete_topic", topic, "", "", request)
        return v1_json({"message": _warn(errs)})

    async def api_delete_channel(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        topic, channel = request.match_info["topic"], request.match_info["channel"]
        try:
            errs = await self.cluster.delete_channel(topic, channel)
        except UpstreamError as e:
            raise _upstream(e) from None
        self._check_total_failure(errs, f"delete channel {topic}/{channel}")
        self._notify("delete_channel", topic, channel, "", request)
        return v1_json({"message": _warn(errs)})

    async def api_tombstone(self, request: web.Request) -> web.Response:
        self._require_admin(request)
        node = request.match_info["node"]
        body = await self._json_body(request, "INVALID_BODY")
        topic = body.get("topic")
        if not isinstance(topic, str) or not valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        errs = await self.cluster.tombstone_topic_producer(topic, node)
        self._check_total_failure(errs, f"tombstone {topic} on {node}")
        self._notify("tombstone_topic_producer", topic, "", node, request)
        return v1_json({"message": _warn(errs)})

    async def api_graphite(self, request: web.Request) -> web.Response:
        if request.query.get("metric") != "rate":
            raise HTTPError(400, "INVALID_ARG_METRIC")
        target = request.query.get("target")
        if target is None:
            raise HTTPError(400, "INVALID_ARG_TARGET")
        if not self.opts.graphite_url:
            raise HTTPError(500, "INTERNAL_ERROR")
        interval = int(self.opts.statsd_interval)
        params = {"from": f"-{interval * 2}sec", "until": f"-{interval}sec", "format": "json",
                  "target": target}
        url = self.opts.graphite_url.rstrip("/") + "/render"
        try:
            async with self.cluster.session.get(url, params=params) as r:
                data = orjson.loads(await r.read())
            value = data[0]["datapoints"][0][0]
        except Exception as e:
            log.error("graphite request failed - %s", e)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        if value is None or value < 0:
            return v1_json({"rate": "N/A"})
        return v1_json({"rate": f"{value / max(interval, 1):.2f}"})

    # ================================================================== nsqx additions
    async def api_graph(self, request: web.Request) -> web.Response:
        if not self.sampler.enabled:
            raise HTTPError(404, "GRAPHS_DISABLED")
        topic = request.match_info["topic"]
        channel = request.match_info.get("channel")
        metric = request.query.get("metric", "")
        allowed = ("rate", "depth", "in_flight_count", "deferred_count", "requeue_count",
                   "timeout_count", "client_count", "message_count")
        metrics = tuple(m for m in metric.split(",") if m) or ("rate", "depth")
        if any(m not in allowed for m in metrics):
            raise HTTPError(400, "INVALID_ARG_METRIC")
        if channel is None and any(m not in ("rate", "depth", "message_count") for m in metrics):
            raise HTTPError(400, "INVALID_ARG_METRIC")
        return v1_json(self.sampler.query(topic, channel, metrics))

    async def api_health(self, request: web.Request) -> web.Response:
        return v1_json({"nodes": [
            {"address": s.address, "kind": s.kind, "ok": s.ok, "error": s.error,
             "last_ok": s.last_ok, "last_checked": s.last_checked,
             "latency_ms": round(s.latency_ms, 2)}
            for s in sorted(self.cluster.health.values(), key=lambda s: (s.kind, s.address))]})

    # ================================================================== /config
    async def config(self, request: web.Request) -> web.Response:
        opt = request.match_info["opt"]
        cidr = self.opts.allow_config_from_cidr
        if cidr:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            try:
                ip = ipaddress.ip_address(peer[0]) if peer else None
            except ValueError:
                ip = None
            if ip is None:
                raise HTTPError(400, "INVALID_REMOTE_ADDR")
            net = ipaddress.ip_network(cidr, strict=False)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if ip.version != net.version or ip not in net:
                raise HTTPError(403, "FORBIDDEN")
        if request.method == "PUT":
            body = await request.content.read(1024 * 1024 + 1)
            if len(body) > 1024 * 1024 or not body:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    v = orjson.loads(body)
                except orjson.JSONDecodeError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise HTTPError(400, "INVALID_VALUE")
                self.opts.nsqlookupd_http_addresses = v
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").strip().lower()
                if level not in LOG_LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                self.opts.log_level = level
                logging.getLogger().setLevel(
                    {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50}[level])
            else:
                raise HTTPError(400, "INVALID_OPTION")
        flag = PROGRAM.cfg_index.get(opt)
        if flag is None:
            raise HTTPError(400, "INVALID_OPTION")
        value = getattr(self.opts, flag.dest)
        if flag.kind == "duration":
            value = round(value * 1e9)  # Go time.Duration
        return web.Response(body=go_json(value), content_type="application/json")
