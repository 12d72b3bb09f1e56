"""Blocking HTTP client for nsqd's ``/nsqx/*`` log API and nsqlookupd's ``/lookup``.

Used by the Spark data source on the driver (offsets) and on executors (fetch, publish). It is
stdlib only (``http.client`` with keep-alive) so it works in Spark's Python workers without an
event loop. Errors raise :class:`NsqSparkError` with a message that says which node and what.
"""

from __future__ import annotations

import http.client
import json
import struct
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

__all__ = ["NsqSparkError", "NodeClient", "cluster_leaders", "resolve_nodes",
           "encode_pub_body"]


class NsqSparkError(RuntimeError):
    """A request to nsqd/nsqlookupd failed; ``code`` is nsqd's error code when it gave one."""

    def __init__(self, message: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _split(address: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of ``host:port`` or ``http(s)://host:port[/path]``."""
    if "://" not in address:
        address = "http://" + address
    u = urlsplit(address)
    if not u.hostname or u.scheme not in ("http", "https"):
        raise NsqSparkError(f"bad address {address!r} (expected host:port or http://host:port)")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise NsqSparkError(f"bad port in address {address!r}") from None
    return u.scheme, u.hostname, port, u.path.rstrip("/")


class NodeClient:
    """One nsqd's HTTP API over one keep-alive connection (reconnects once on a stale one)."""

    def __init__(self, address: str, *, timeout: float = 30.0, secret: str | None = None,
                 retries: int = 2) -> None:
        self.address = address
        self.scheme, self.host, self.port, self.base = _split(address)
        self.timeout = timeout
        self.secret = secret
        self.retries = retries
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = (http.client.HTTPSConnection if self.scheme == "https"
                   else http.client.HTTPConnection)
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(self, method: str, path: str, params: dict[str, Any],
                body: bytes | None = None) -> bytes:
        target = f"{self.base}{path}?{urlencode(params, quote_via=quote)}"
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        if self.secret:
            headers["Authorization"] = f"Bearer {self.secret}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                last = exc
                if attempt < self.retries:
                    time.sleep(0.2 * (attempt + 1))
                continue
            if resp.status != 200:
                code = None
                try:
                    code = json.loads(data).get("message")
                except (ValueError, AttributeError):
                    pass
                raise NsqSparkError(
                    f"nsqd {self.address} {method} {path} {params.get('topic', '')!s}: "
                    f"HTTP {resp.status} {code or data[:200]!r}", code, resp.status)
            return data
        raise NsqSparkError(f"nsqd {self.address} unreachable: {last}")

    # -- API -----------------------------------------------------------------------------
    def offsets(self, topic: str, timestamp_ns: int | None = None) -> list[dict[str, int]]:
        params: dict[str, Any] = {"topic": topic}
        if timestamp_ns is not None:
            params["timestamp_ns"] = int(timestamp_ns)
        return json.loads(self.request("GET", "/nsqx/offsets", params))["partitions"]

    def cluster_state(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Cluster mode: this node's partitions, (topic, partition) -> role, epoch, log end
        (the source checks ``role``: does the node lead the partition still)."""
        doc = json.loads(self.request("GET", "/nsqx/cluster/state", {}))
        return {(str(p["topic"]), int(p["partition"])): p for p in doc.get("partitions") or []}

    def fetch(self, topic: str, partition: int, offset: int, end: int, max_bytes: int,
              headers: bool = False) -> bytes:
        params: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset,
                                  "end": end, "max_bytes": max_bytes}
        if headers:
            params["headers"] = 1
        return self.request("GET", "/nsqx/fetch", params)

    def pub(self, topic: str, body: bytes, *, writer: str, batch: str, task: str,
            partition: int = 0, keys: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"topic": topic, "writer": writer, "batch": batch, "task": task,
                                  "partition": partition}
        if keys:
            params["keys"] = 1
        return json.loads(self.request("POST", "/nsqx/pub", params, body))


def encode_pub_body(bodies: Sequence[bytes], keys: Sequence[bytes | None] | None = None) -> bytes:
    """Binary MPUB body; with keys, each message is [u32 klen][key][u32 size][body]."""
    n = len(bodies)
    if keys is None:
        parts = [b""] * (2 * n)
        parts[0::2] = [struct.pack(">I", len(b)) for b in bodies]
        parts[1::2] = bodies
        return struct.pack(">I", n) + b"".join(parts)
    parts = [b""] * (4 * n)
    ks = [k or b"" for k in keys]
    parts[0::4] = [struct.pack(">I", len(k)) for k in ks]
    parts[1::4] = ks
    parts[2::4] = [struct.pack(">I", len(b)) for b in bodies]
    parts[3::4] = bodies
    return struct.pack(">I", n) + b"".join(parts)


def _lookup_doc(address: str, path: str, timeout: float) -> dict[str, Any] | None:
    """One nsqlookupd answer as JSON (unwrapped from an old-style ``data``), None on 404."""
    scheme, host, port, base = _split(address)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=timeout)
    try:
        conn.request("GET", f"{base or ''}{path}",
                     headers={"Accept": "application/vnd.nsq; version=1.0"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise NsqSparkError(f"nsqlookupd {address} unreachable: {exc}") from None
    finally:
        conn.close()
    if resp.status == 404:
        return None
    if resp.status != 200:
        raise NsqSparkError(f"nsqlookupd {address}: HTTP {resp.status} {data[:200]!r}")
    doc = json.loads(data)
    if "producers" not in doc and isinstance(doc.get("data"), dict):
        doc = doc["data"]
    return doc


def _http_address(p: dict[str, Any]) -> str | None:
    """``host:port`` of a peer's HTTP API (upstream's PeerInfo shape)."""
    h = p.get("broadcast_address") or p.get("address") or p.get("hostname")
    hp = p.get("http_port")
    if not (h and hp):
        return None
    return f"[{h}]:{hp}" if ":" in h else f"{h}:{hp}"


def _lookup_http_nodes(address: str, topic: str | None, timeout: float) -> list[str]:
    """HTTP addresses of the producers of ``topic`` (``/lookup``), or of every nsqd (``/nodes``)
    when topic is None."""
    path = "/nodes" if topic is None else f"/lookup?{urlencode({'topic': topic})}"
    doc = _lookup_doc(address, path, timeout)
    if doc is None:
        return []
    return [a for p in doc.get("producers") or [] if (a := _http_address(p))]


def cluster_leaders(lookupd: str, topic: str, timeout: float = 10.0
                    ) -> tuple[int, dict[int, str]] | None:
    """For a topic of an nsqx cluster: (partition count, partition -> HTTP address of its
    leader now), from the first of the comma separated lookupds that answers; a partition
    without a leader at the moment (a failover under way) is missing from the map. None when
    the lookupds do not know the topic as a cluster topic (standalone nsqlookupd: their
    ``/lookup`` has no ``partitions`` map)."""
    errors = []
    q = urlencode({"topic": topic, "access": "r", "metainfo": "true"})
    for a in (x.strip() for x in lookupd.split(",") if x.strip()):
        try:
            doc = _lookup_doc(a, f"/lookup?{q}", timeout)
        except NsqSparkError as exc:
            errors.append(str(exc))
            continue
        if doc is None or not isinstance(doc.get("partitions"), dict):
            continue
        leaders = {int(p): addr for p, peer in doc["partitions"].items()
                   if isinstance(peer, dict) and (addr := _http_address(peer))}
        meta = doc.get("meta") or {}
        count = int(meta.get("partition_num") or (max(leaders) + 1 if leaders else 0))
        return count, leaders
    if errors and len(errors) == len([x for x in lookupd.split(",") if x.strip()]):
        raise NsqSparkError("; ".join(errors))
    return None


def resolve_nodes(nsqd: str | None, lookupd: str | None, topic: str,
                  timeout: float = 10.0, *, any_node: bool = False) -> list[str]:
    """nsqd HTTP addresses serving ``topic``: the ``nsqd`` list, or what the lookupds say
    (with ``any_node``, every nsqd the lookupds know when none has the topic yet: writers)."""
    if nsqd:
        nodes = [a.strip() for a in nsqd.split(",") if a.strip()]
        for a in nodes:
            _split(a)
        return nodes
    if not lookupd:
        raise NsqSparkError("option 'nsqd' or 'lookupd' is required")
    found: set[str] = set()
    errors = []
    for a in (x.strip() for x in lookupd.split(",") if x.strip()):
        try:
            found.update(_lookup_http_nodes(a, topic, timeout))
        except NsqSparkError as exc:
            errors.append(str(exc))
    if errors and not found:
        raise NsqSparkError("; ".join(errors))
    if not found and any_node:
        for a in (x.strip() for x in lookupd.split(",") if x.strip()):
            try:
                found.update(_lookup_http_nodes(a, None, timeout))
            except NsqSparkError:
                continue
    return sorted(found)
