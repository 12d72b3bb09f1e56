"""What nsqadmin knows about the cluster, learned only through the public HTTP APIs of
nsqlookupd (``/topics``, ``/channels``, ``/lookup``, ``/nodes``, ``/topic/*``; in cluster
mode ``/cluster/stats``, ``/topic/create`` with partitions, ``/cluster/node/remove``) and nsqd
(``/info``, ``/stats``, ``/topic/*``, ``/channel/*``) -- upstream's ``internal/clusterinfo``.

Every fan-out runs concurrently with the connect/request timeouts of the options. A node
that fails is recorded as down (:attr:`ClusterClient.health`) and the answer is built from
the nodes that did reply: callers get ``(value, errors)``; only when *every* node failed is
:class:`UpstreamError` raised (upstream's ``PartialErr`` vs. plain error).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import orjson

from .options import Options, auth_secret

__all__ = ["ClusterClient", "ClusterRefused", "NodeStatus", "UpstreamError", "http_address",
           "parse_version"]

log = logging.getLogger("nsqx.admin")

T = TypeVar("T")

# a node whose last contact failed is shown as down for this long afterwards
DOWN_MEMORY = 600.0


class UpstreamError(Exception):
    """Every node asked failed (upstream answers 502 ``UPSTREAM_ERROR: ...``)."""

    def __init__(self, what: str, errors: list[str]) -> None:
        super().__init__(f"failed to query any {what}: " + "\n".join(errors))
        self.errors = errors


@dataclass
class NodeStatus:
    address: str
    kind: str  # "nsqd" | "nsqlookupd"
    ok: bool = True
    error: str = ""
    last_ok: float = 0.0
    last_checked: float = 0.0
    latency_ms: float = 0.0


def parse_version(v: str) -> tuple[int, int, int]:
    """A lenient semver parse ("1.3.0", "1.3.0-alpha" -> (1, 3, 0)); junk -> (0, 0, 0)."""
    core = (v or "").split("-", 1)[0].split("+", 1)[0]
    parts = core.split(".")
    if len(parts) != 3:
        return (0, 0, 0)
    try:
        return (int(parts[0]), int(parts[1]), int(parts[2]))
    except ValueError:
        return (0, 0, 0)


def join_host_port(host: str, port: int | str) -> str:
    """net.JoinHostPort: brackets around an IPv6 host."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def http_address(producer: dict[str, Any]) -> str:
    """Upstream ``Producer.HTTPAddress()``: broadcast_address:http_port (the node's id)."""
    return join_host_port(producer.get("broadcast_address", ""), producer.get("http_port", 0))


def tcp_address(producer: dict[str, Any]) -> str:
    return join_host_port(producer.get("broadcast_address", ""), producer.get("tcp_port", 0))


def _q(v: str) -> str:
    return quote(v, safe="")


def _ssl_context(opts: Options) -> ssl.SSLContext | None:
    if not (opts.http_client_tls_root_ca_file or opts.http_client_tls_cert
            or opts.http_client_tls_insecure_skip_verify):
        return None
    ctx = ssl.create_default_context(cafile=opts.http_client_tls_root_ca_file or None)
    if opts.http_client_tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert:
        ctx.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
    return ctx


class ClusterClient:
    """An HTTP client for the nodes of one cluster (one per nsqadmin)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.health: dict[str, NodeStatus] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ssl = _ssl_context(opts)
        secret = auth_secret(opts)  # for nodes with --auth-http-address; never to graphite
        self._auth = {"Authorization": f"Bearer {secret}"} if secret else None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.opts.http_client_request_timeout,
                                            sock_connect=self.opts.http_client_connect_timeout)
            connector = aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl else True)
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=connector,
                headers={"Accept": "application/vnd.nsq; version=1.0",
                         "User-Agent": "nsqadmin (nsqx)"})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "ClusterClient not started"
        return self._session

    @property
    def lookupd_addrs(self) -> list[str]:
        return list(self.opts.nsqlookupd_http_addresses)

    @property
    def nsqd_addrs(self) -> list[str]:
        return list(self.opts.nsqd_http_addresses)

    # -- health ---------------------------------------------------------------------------
    def _mark(self, kind: str, addr: str, ok: bool, error: str = "", latency: float = 0.0
              ) -> None:
        st = self.health.get(addr)
        if st is None:
            st = self.health[addr] = NodeStatus(addr, kind)
        now = time.time()
        st.kind = kind
        st.last_checked = now
        st.latency_ms = latency * 1000.0
        if ok:
            if not st.ok:
                log.info("%s %s is reachable again", kind, addr)
            st.ok, st.error, st.last_ok = True, "", now
        else:
            if st.ok:
                log.warning("%s %s is down: %s", kind, addr, error)
            st.ok, st.error = False, error

    def down_nodes(self) -> list[NodeStatus]:
        now = time.time()
        return sorted((s for s in self.health.values()
                       if not s.ok and now - s.last_checked < DOWN_MEMORY),
                      key=lambda s: (s.kind, s.address))

    def is_down(self, addr: str) -> bool:
        st = self.health.get(addr)
        return st is not None and not st.ok

    # -- transport ------------------------------------------------------------------------
    @staticmethod
    def url(addr: str, path: str) -> str:
        base = addr.rstrip("/") if "://" in addr else f"http://{addr}"
        return base + path

    async def _request(self, kind: str, addr: str, method: str, path: str,
                       body: bytes | None = None) -> bytes:
        url = self.url(addr, path)
        t0 = time.monotonic()
        try:
            async with self.session.request(method, url, data=body, headers=self._auth) as resp:
                body = await resp.read()
                if resp.status != 200:
                    # the node answered: it is up, the request was refused
                    self._mark(kind, addr, True, latency=time.monotonic() - t0)
                    msg = body.decode("utf-8", "replace").strip()[:200]
                    try:
                        msg = orjson.loads(body).get("message", msg)
                    except Exception:
                        pass
                    raise RequestError(f"{method} {url}: {resp.status} {msg}", resp.status,
                                       str(msg))
        except RequestError:
            raise
        except TimeoutError:
            err = f"{method} {url}: timeout after {self.opts.http_client_request_timeout:g}s"
            self._mark(kind, addr, False, err)
            raise RequestError(err, 0) from None
        except (aiohttp.ClientError, OSError) as e:
            err = f"{method} {url}: {e.__class__.__name__}: {e}"
            self._mark(kind, addr, False, err)
            raise RequestError(err, 0) from None
        self._mark(kind, addr, True, latency=time.monotonic() - t0)
        return body

    async def _request_json(self, kind: str, addr: str, method: str, path: str) -> Any:
        body = await self._request(kind, addr, method, path)
        try:
            return orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            raise RequestError(f"{method} {self.url(addr, path)}: invalid JSON", 200) from None

    async def get_json(self, kind: str, addr: str, path: str) -> Any:
        return await self._request_json(kind, addr, "GET", path)

    async def post(self, kind: str, addr: str, path: str) -> None:
        await self._request(kind, addr, "POST", path)

    async def post_json(self, kind: str, addr: str, path: str) -> Any:
        return await self._request_json(kind, addr, "POST", path)

    async def _fan_out(self, what: str, addrs: Iterable[T],
                       fn: Callable[[T], Awaitable[Any]], *, all_or_nothing: bool = True
                       ) -> tuple[list[tuple[T, Any]], list[str]]:
        """Run ``fn`` for every address concurrently -> ([(addr, value) in order], errors);
        raises UpstreamError if every one failed (and there was at least one)."""
        addrs = list(addrs)
        if not addrs:
            return [], []
        results = await asyncio.gather(*(fn(a) for a in addrs), return_exceptions=True)
        ok: list[tuple[T, Any]] = []
        errors: list[str] = []
        for a, r in zip(addrs, results, strict=True):
            if isinstance(r, RequestError):
                errors.append(str(r))
            elif isinstance(r, BaseException):
                if isinstance(r, asyncio.CancelledError):
                    raise r
                errors.append(f"{a}: {r.__class__.__name__}: {r}")
            else:
                ok.append((a, r))
        if all_or_nothing and not ok and errors:
            raise UpstreamError(what, errors)
        return ok, errors

    # -- lookupd queries ------------------------------------------------------------------
    async def lookupd_topics(self) -> tuple[list[str], list[str]]:
        res, errs = await self._fan_out(
            "nsqlookupd", self.lookupd_addrs,
            lambda a: self.get_json("nsqlookupd", a, "/topics"))
        topics: set[str] = set()
        for _, r in res:
            topics.update((r or {}).get("topics") or [])
        return sorted(topics), errs

    async def lookupd_topic_channels(self, topic: str) -> tuple[list[str], list[str]]:
        res, errs = await self._fan_out(
            "nsqlookupd", self.lookupd_addrs,
            lambda a: self.get_json("nsqlookupd", a, f"/channels?topic={_q(topic)}"))
        chans: set[str] = set()
        for _, r in res:
            chans.update((r or {}).get("channels") or [])
        return sorted(chans), errs

    async def lookupd_producers(self) -> tuple[list[dict[str, Any]], list[str]]:
        """GetLookupdProducers: every nsqd known to any lookupd, merged by TCP address."""
        res, errs = await self._fan_out(
            "nsqlookupd", self.lookupd_addrs,
            lambda a: self.get_json("nsqlookupd", a, "/nodes"))
        by_addr: dict[str, dict[str, Any]] = {}
        producers: list[dict[str, Any]] = []
        max_version = (0, 0, 0)
        for laddr, r in res:
            for raw in (r or {}).get("producers") or []:
                key = tcp_address(raw)
                p = by_addr.get(key)
                if p is None:
                    p = _producer_from_lookupd(raw)
                    by_addr[key] = p
                    producers.append(p)
                    max_version = max(max_version, parse_version(p["version"]))
                p["remote_addresses"].append(f"{laddr}/{raw.get('remote_address') or 'N/A'}")
        for p in producers:
            p["out_of_date"] = parse_version(p["version"]) < max_version
        producers.sort(key=lambda p: p["hostname"])
        return producers, errs

    async def lookupd_topic_producers(self, topic: str) -> tuple[list[dict[str, Any]], list[str]]:
        async def one(a: str) -> Any:
            try:
                return await self.get_json("nsqlookupd", a, f"/lookup?topic={_q(topic)}")
            except RequestError as e:
                if e.status == 404:  # TOPIC_NOT_FOUND: this lookupd has no producers
                    return {"producers": []}
                raise

        res, errs = await self._fan_out("nsqlookupd", self.lookupd_addrs, one)
        seen: set[str] = set()
        producers: list[dict[str, Any]] = []
        for _, r in res:
            for raw in (r or {}).get("producers") or []:
                p = _producer_from_lookupd(raw)
                if http_address(p) in seen:
                    continue
                seen.add(http_address(p))
                producers.append(p)
        return producers, errs

    # -- nsqd queries ---------------------------------------------------------------------
    async def _nsqd_info(self, addr: str) -> dict[str, Any]:
        info = await self.get_json("nsqd", addr, "/info") or {}
        bcast = info.get("broadcast_address") or ""
        http_port = info.get("http_port") or 0
        host_port = addr.split("://", 1)[-1]
        host, _, port = host_port.rpartition(":")
        if not bcast:
            bcast = host.strip("[]")
            http_port = int(port) if port.isdigit() else 0
        version = info.get("version") or ""
        return {
            "remote_addresses": [],
            "remote_address": "",
            "hostname": info.get("hostname") or host.strip("[]"),
            "broadcast_address": bcast,
            "tcp_port": info.get("tcp_port") or 0,
            "http_port": http_port,
            "version": version,
            "topology_zone": info.get("topology_zone") or "",
            "topology_region": info.get("topology_region") or "",
            "topics": [],
            "out_of_date": False,
            "_addr": addr,
        }

    async def nsqd_producers(self, topic: str | None = None
                             ) -> tuple[list[dict[str, Any]], list[str]]:
        """GetNSQDProducers / GetNSQDTopicProducers (``--nsqd-http-address`` mode)."""

        async def one(addr: str) -> dict[str, Any] | None:
            path = "/stats?format=json&include_clients=false&include_mem=false"
            if topic is not None:
                path += f"&topic={_q(topic)}"
            stats = await self.get_json("nsqd", addr, path) or {}
            names = [t.get("topic_name", "") for t in stats.get("topics") or []]
            if topic is not None and topic not in names:
                return None
            p = await self._nsqd_info(addr)
            p["topics"] = [{"topic": n, "tombstoned": False} for n in sorted(names)]
            p["health"] = stats.get("health", "")
            return p

        res, errs = await self._fan_out("nsqd", self.nsqd_addrs, one)
        producers = [p for _, p in res if p is not None]
        max_version = max((parse_version(p["version"]) for p in producers), default=(0, 0, 0))
        for p in producers:
            p["out_of_date"] = parse_version(p["version"]) < max_version
        return producers, errs

    async def nsqd_topics(self) -> tuple[list[str], list[str]]:
        res, errs = await self._fan_out(
            "nsqd", self.nsqd_addrs,
            lambda a: self.get_json("nsqd", a,
                                    "/stats?format=json&include_clients=false&include_mem=false"))
        topics: set[str] = set()
        for _, r in res:
            topics.update(t.get("topic_name", "") for t in (r or {}).get("topics") or [])
        return sorted(topics), errs

    async def nsqd_stats(self, producers: list[dict[str, Any]], topic: str = "",
                         channel: str = "", include_clients: bool = True,
                         all_or_nothing: bool = True) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str]]:
        """``/stats`` of every producer -> ([(producer, stats JSON)], errors)."""

        def path() -> str:
            p = "/stats?format=json&include_mem=false"
            if topic:
                p += f"&topic={_q(topic)}"
                if channel:
                    p += f"&channel={_q(channel)}"
            if not include_clients:
                p += "&include_clients=false"
            return p

        async def one(p: dict[str, Any]) -> dict[str, Any]:
            return await self.get_json("nsqd", node_url_addr(p), path()) or {}

        return await self._fan_out("nsqd", producers, one, all_or_nothing=all_or_nothing)

    # -- the two modes --------------------------------------------------------------------
    async def topics(self) -> tuple[list[str], list[str]]:
        if self.lookupd_addrs:
            return await self.lookupd_topics()
        return await self.nsqd_topics()

    async def producers(self) -> tuple[list[dict[str, Any]], list[str]]:
        if self.lookupd_addrs:
            return await self.lookupd_producers()
        return await self.nsqd_producers()

    async def topic_producers(self, topic: str) -> tuple[list[dict[str, Any]], list[str]]:
        if self.lookupd_addrs:
            return await self.lookupd_topic_producers(topic)
        return await self.nsqd_producers(topic)

    async def lookupd_info(self) -> list[dict[str, Any]]:
        """Every configured lookupd with its version, or marked down."""

        async def one(a: str) -> dict[str, Any]:
            try:
                info = await self.get_json("nsqlookupd", a, "/info") or {}
                return {"address": a, "up": True, "version": info.get("version", ""),
                        "error": ""}
            except RequestError as e:
                return {"address": a, "up": False, "version": "", "error": str(e)}

        return list(await asyncio.gather(*(one(a) for a in self.lookupd_addrs)))

    # -- cluster mode (nsqlookupd's /cluster/* API; nsqadmin never talks to etcd) -----------
    async def _cluster_call(self, method: str, path: str, data: bytes | None = None
                            ) -> tuple[int, Any, list[str]]:
        """The first lookupd that answers at all -> (status, JSON body, errors of the ones
        before it); every lookupd unreachable -> UpstreamError."""
        errs: list[str] = []
        for a in self.lookupd_addrs:
            url = self.url(a, path)
            t0 = time.monotonic()
            try:
                async with self.session.request(method, url, data=data,
                                                headers=self._auth) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                err = f"{method} {url}: {e.__class__.__name__}: {e}"
                self._mark("nsqlookupd", a, False, err)
                errs.append(err)
                continue
            self._mark("nsqlookupd", a, True, latency=time.monotonic() - t0)
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                body = {"message": raw.decode("utf-8", "replace").strip()[:200]}
            return status, body, errs
        raise UpstreamError("nsqlookupd", errs)

    @staticmethod
    def _refused(status: int, body: Any) -> ClusterRefused:
        if isinstance(body, dict):
            text = str(body.get("message") or f"HTTP {status}")
            if body.get("detail"):
                text += f": {body['detail']}"
        else:
            text = f"HTTP {status}"
        return ClusterRefused(status, text[:500])

    async def cluster_stats(self, log_ends: bool = True
                            ) -> tuple[dict[str, Any] | None, list[str]]:
        """lookupd's ``/cluster/stats`` -> (stats, errors); (None, ...) when nsqadmin has no
        lookupd or the lookupd is not in cluster mode (a standalone one answers 404)."""
        if not self.lookupd_addrs:
            return None, []
        status, body, errs = await self._cluster_call(
            "GET", "/cluster/stats" + ("?log_ends=true" if log_ends else ""))
        if status == 404 or status == 405:
            return None, errs
        if status != 200 or not isinstance(body, dict):
            raise self._refused(status, body)
        return body, errs

    async def cluster_route(self, topic: str) -> dict[str, Any] | None:
        """lookupd's ``GET /topic/route`` (cluster mode): the route history of a route-managed
        topic, or None (no lookupd, a standalone one, not route-managed)."""
        if not self.lookupd_addrs:
            return None
        status, body, _ = await self._cluster_call("GET", f"/topic/route?topic={_q(topic)}")
        if status != 200 or not isinstance(body, dict) or not body.get("versions"):
            return None
        return body

    async def cluster_route_change(self, topic: str, action: str, qs: str) -> dict[str, Any]:
        """lookupd's ``POST /topic/split|merge|move`` (run by the elected coordinator);
        a refusal raises ClusterRefused with lookupd's status and text."""
        status, body, _ = await self._cluster_call("POST", f"/topic/{action}?{qs}")
        if status != 200 or not isinstance(body, dict):
            raise self._refused(status, body)
        return body

    async def cluster_reset_channel(self, topic: str, channel: str, position: str
                                    ) -> dict[str, Any]:
        """lookupd's ``POST /channel/setoffset`` for a route-managed topic: the coordinator
        resets the channel on every node at once (a per-node reset would break the
        cross-node barrier); a refusal raises ClusterRefused with lookupd's status and text."""
        path = f"/channel/setoffset?topic={_q(topic)}&channel={_q(channel)}"
        status, body, _ = await self._cluster_call("POST", path, position.encode())
        if status != 200 or not isinstance(body, dict):
            raise self._refused(status, body)
        return body

    async def cluster_create_topic(self, topic: str, partitions: int, replicas: int,
                                   ordered: bool) -> dict[str, Any]:
        qs = f"topic={_q(topic)}&partition_num={partitions}"
        if replicas:
            qs += f"&replicator={replicas}"
        if ordered:
            qs += "&orderedmulti=true"
        status, body, _ = await self._cluster_call("POST", f"/topic/create?{qs}")
        if status != 200 or not isinstance(body, dict):
            raise self._refused(status, body)
        return body

    async def cluster_drain(self, node: str, undo: bool = False) -> dict[str, Any]:
        path = f"/cluster/node/remove?remove_node={_q(node)}" + ("&undo=true" if undo else "")
        status, body, _ = await self._cluster_call("POST", path)
        if status != 200 or not isinstance(body, dict):
            raise self._refused(status, body)
        return body

    # -- actions --------------------------------------------------------------------------
    async def _post_all(self, kind: str, addrs: list[str], path: str) -> list[str]:
        _, errs = await self._fan_out(kind, addrs, lambda a: self.post(kind, a, path),
                                      all_or_nothing=False)
        return errs

    async def _post_producers(self, producers: list[dict[str, Any]], path: str) -> list[str]:
        _, errs = await self._fan_out(
            "nsqd", producers, lambda p: self.post("nsqd", node_url_addr(p), path),
            all_or_nothing=False)
        return errs

    async def create_topic_channel(self, topic: str, channel: str = "") -> list[str]:
        errs: list[str] = []
        qs = f"topic={_q(topic)}"
        if self.lookupd_addrs:
            errs += await self._post_all("nsqlookupd", self.lookupd_addrs, f"/topic/create?{qs}")
            if channel:
                cqs = f"{qs}&channel={_q(channel)}"
                errs += await self._post_all("nsqlookupd", self.lookupd_addrs,
                                             f"/channel/create?{cqs}")
                producers, perrs = await self.lookupd_topic_producers(topic)
                errs += perrs
                errs += await self._post_producers(producers, f"/channel/create?{cqs}")
        else:
            # nsqx: without lookupd, create on every nsqd given (upstream does nothing)
            errs += await self._post_all("nsqd", self.nsqd_addrs, f"/topic/create?{qs}")
            if channel:
                errs += await self._post_all("nsqd", self.nsqd_addrs,
                                             f"/channel/create?{qs}&channel={_q(channel)}")
        return errs

    async def delete_topic(self, topic: str) -> list[str]:
        producers, errs = await self.topic_producers(topic)
        qs = f"topic={_q(topic)}"
        errs += await self._post_all("nsqlookupd", self.lookupd_addrs, f"/topic/delete?{qs}")
        errs += await self._post_producers(producers, f"/topic/delete?{qs}")
        return errs

    async def delete_channel(self, topic: str, channel: str) -> list[str]:
        producers, errs = await self.topic_producers(topic)
        qs = f"topic={_q(topic)}&channel={_q(channel)}"
        errs += await self._post_all("nsqlookupd", self.lookupd_addrs, f"/channel/delete?{qs}")
        errs += await self._post_producers(producers, f"/channel/delete?{qs}")
        return errs

    async def topic_channel_action(self, action: str, topic: str, channel: str = "") -> list[str]:
        """pause / unpause / empty of a topic or channel on every producer of the topic."""
        producers, errs = await self.topic_producers(topic)
        if channel:
            path = f"/channel/{action}?topic={_q(topic)}&channel={_q(channel)}"
        else:
            path = f"/topic/{action}?topic={_q(topic)}"
        errs += await self._post_producers(producers, path)
        return errs

    async def set_channel_offset(self, topic: str, channel: str, position: str,
                                 partition: int | None = None, node: str = ""
                                 ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """``POST /channel/setoffset`` (body ``position``) on every producer of the topic, or
        only on ``node`` -> ([(node, nsqd's answer)], errors). Offsets are per node's log."""
        producers, errs = await self.topic_producers(topic)
        if node:
            producers = [p for p in producers if http_address(p) == node]
            if not producers:
                return [], errs + [f"{node}: not a producer of topic {topic}"]
        path = f"/channel/setoffset?topic={_q(topic)}&channel={_q(channel)}"
        if partition is not None:
            path += f"&partition={partition}"

        async def one(p: dict[str, Any]) -> dict[str, Any]:
            data = await self._request("nsqd", node_url_addr(p), "POST", path, position.encode())
            return orjson.loads(data) if data else {}

        res, errs2 = await self._fan_out("nsqd", producers, one, all_or_nothing=False)
        return [(http_address(p), doc) for p, doc in res], errs + errs2

    async def get_message(self, topic: str, query: str
                          ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """``GET /message/get?<query>`` on every producer of the topic -> ([(node, message)],
        errors); a node without it (404) is neither. Without cluster partitions each node
        numbers its own log, so one id may name a message on several nodes."""
        return await self._ask_topic_nodes(topic, f"/message/get?topic={_q(topic)}&{query}")

    async def trace_search(self, topic: str, query: str
                           ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """``GET /trace/search?<query>`` on every producer of the topic (each node keeps the
        trace events of its own partitions) -> ([(node, answer)], errors)."""
        return await self._ask_topic_nodes(topic, f"/trace/search?topic={_q(topic)}&{query}")

    async def _ask_topic_nodes(self, topic: str, path: str
                               ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """GET ``path`` on every producer of ``topic``; a 404 answer counts as nothing."""
        producers, errs = await self.topic_producers(topic)

        async def one(p: dict[str, Any]) -> dict[str, Any] | None:
            try:
                return await self.get_json("nsqd", node_url_addr(p), path)
            except RequestError as e:
                if e.status == 404:
                    return None
                raise

        res, errs2 = await self._fan_out("nsqd", producers, one, all_or_nothing=False)
        return [(http_address(p), doc) for p, doc in res if doc], errs + errs2

    async def tombstone_topic_producer(self, topic: str, node: str) -> list[str]:
        errs = await self._post_all("nsqlookupd", self.lookupd_addrs,
                                    f"/topic/tombstone?topic={_q(topic)}&node={_q(node)}")
        try:
            await self._nsqd_info(node)
            errs += await self._post_all("nsqd", [node], f"/topic/delete?topic={_q(topic)}")
        except RequestError as e:
            errs.append(str(e))
        return errs


class ClusterRefused(Exception):
    """nsqlookupd answered a cluster-mode request with an error (its status and text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RequestError(Exception):
    def __init__(self, message: str, status: int, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail  # what a node that refused said (its ``message``), as is


def node_url_addr(p: dict[str, Any]) -> str:
    """Where to reach a producer's HTTP API: the address we were configured with
    (``--nsqd-http-address`` mode) or broadcast_address:http_port (lookupd mode)."""
    return p.get("_addr") or http_address(p)


def _producer_from_lookupd(raw: dict[str, Any]) -> dict[str, Any]:
    topics = raw.get("topics") or []
    tombs = raw.get("tombstones") or []
    pts = [{"topic": t, "tombstoned": bool(tombs[i]) if i < len(tombs) else False}
           for i, t in enumerate(topics)]
    pts.sort(key=lambda x: x["topic"])
    return {
        "remote_addresses": [],
        "remote_address": raw.get("remote_address", ""),
        "hostname": raw.get("hostname", ""),
        "broadcast_address": raw.get("broadcast_address", ""),
        "tcp_port": raw.get("tcp_port", 0),
        "http_port": raw.get("http_port", 0),
        "version": raw.get("version", ""),
        "topology_zone": raw.get("topology_zone", ""),
        "topology_region": raw.get("topology_region", ""),
        "topics": pts,
        "out_of_date": False,
    }
