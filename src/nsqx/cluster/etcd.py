"""An asyncio client for etcd's v3 API through its JSON gateway (``/v3/...`` over HTTP).

Why the gateway: etcd serves it on the client port of every member, so the project needs no
gRPC stack; aiohttp is already a dependency. Keys and values are bytes (base64 on the wire),
int64s travel as decimal strings, as grpc-gateway encodes them.

What the cluster needs and nothing more: KV (get, prefix range, put, delete), transactions
for compare-and-swap, leases (grant, keep-alive, revoke) for liveness, and watches (a
streamed POST to ``/v3/watch``) so that nobody polls. Every call goes to the first endpoint
that answers; :class:`EtcdUnavailable` says clearly when none does.

A secured etcd is reached through options in the endpoint URL itself (so every program that
takes ``--cluster-leadership-addresses`` takes them, without more flags):
``https://host:2379?ca=CA.pem&cert=CLIENT.pem&key=CLIENT.key&user=NAME&password_file=FILE``.
``ca`` verifies the server (default: the system's CAs), ``cert``/``key`` are the client
certificate of etcd's ``--client-cert-auth``, ``user``/``password_file`` log in to etcd's
auth (the token goes in each request's ``Authorization`` header and is renewed when etcd
says it is invalid). With etcd's auth on, the client certificate must have no CommonName:
the JSON gateway refuses one (it could not act as that user).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import aiohttp
import orjson

log = logging.getLogger("nsqx.cluster.etcd")

__all__ = [
    "Compare",
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "Op",
    "WatchEvent",
    "prefix_end",
]


class EtcdError(Exception):
    """etcd answered with an error (the message is etcd's)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered: etcd is down or unreachable."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix`` (etcd's rule)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"  # every key


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(_unb64(kv.get("key")), _unb64(kv.get("value")),
                   int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                   int(kv.get("version", 0)), int(kv.get("lease", 0)))


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # "PUT" or "DELETE"
    kv: KeyValue
    revision: int  # of the change


@dataclass(frozen=True, slots=True)
class Compare:
    """One comparison of a transaction: ``target`` is VERSION, CREATE, MOD or VALUE."""

    key: bytes
    target: str
    value: int | bytes
    result: str = "EQUAL"

    def to_json(self) -> dict[str, Any]:
        field = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision",
                 "VALUE": "value"}[self.target]
        v = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {"key": _b64(self.key), "target": self.target, "result": self.result, field: v}

    @classmethod
    def absent(cls, key: bytes) -> Compare:
        return cls(key, "CREATE", 0)

    @classmethod
    def mod_revision(cls, key: bytes, revision: int) -> Compare:
        return cls(key, "MOD", revision)


@dataclass(frozen=True, slots=True)
class Op:
    """A put or delete inside a transaction."""

    kind: str
    key: bytes
    value: bytes = b""
    lease: int = 0

    @classmethod
    def put(cls, key: bytes, value: bytes, lease: int = 0) -> Op:
        return cls("put", key, value, lease)

    @classmethod
    def delete(cls, key: bytes) -> Op:
        return cls("delete", key)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "put":
            req: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
            if self.lease:
                req["lease"] = str(self.lease)
            return {"request_put": req}
        return {"request_delete_range": {"key": _b64(self.key)}}


class EtcdClient:
    """One client per process; ``endpoints`` as Youzan's ``--cluster-leadership-addresses``."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        parsed = [parse_endpoint(e) for e in endpoints]
        self.endpoints = [p[0] for p in parsed]
        self._ssl: list[ssl.SSLContext | None] = [p[1] for p in parsed]
        self._login = next((p[2] for p in parsed if p[2] is not None), None)
        self._token: str | None = None
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._preferred = 0

    def _headers(self) -> dict[str, str] | None:
        return {"Authorization": self._token} if self._token else None

    async def _authenticate(self, idx: int) -> None:
        """Log in to etcd's auth with the endpoint's user and password: a token."""
        assert self._login is not None
        name, password = self._login
        url = self.endpoints[idx] + "/v3/auth/authenticate"
        async with self._http().post(url, data=orjson.dumps({"name": name, "password": password}),
                                     ssl=self._ssl[idx] or True,
                                     timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
            raw = await resp.read()
        try:
            data = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            data = {"message": raw[:200].decode(errors="replace")}
        if resp.status != 200 or not data.get("token"):
            raise EtcdError(f"etcd {url}: login as {name} refused: "
                            f"{data.get('message') or data.get('error') or resp.status}")
        self._token = str(data["token"])

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(json_serialize=lambda o: orjson.dumps(o).decode())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the first endpoint that answers; a reply with an error raises EtcdError."""
        last: Exception | None = None
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._preferred + i) % n
            url = self.endpoints[idx] + path
            for attempt in range(2):  # a second time after renewing an expired auth token
                try:
                    if self._login is not None and self._token is None:
                        await self._authenticate(idx)
                    async with self._http().post(
                            url, data=orjson.dumps(body), headers=self._headers(),
                            ssl=self._ssl[idx] or True,
                            timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                        raw = await resp.read()
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    last = e
                    break
                self._preferred = idx
                try:
                    data = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError as e:
                    raise EtcdError(f"etcd {url}: not JSON: {raw[:200]!r}") from e
                if resp.status != 200 or "error" in data or "code" in data and "message" in data:
                    why = str(data.get("message") or data.get("error") or resp.status)
                    if self._login is not None and attempt == 0 and "token" in why:
                        self._token = None  # expired or revoked: log in again
                        continue
                    raise EtcdError(f"etcd {url}: {why}")
                return data
        raise EtcdUnavailable(f"etcd unreachable at {', '.join(self.endpoints)}: {last}")

    # -- KV ------------------------------------------------------------------------------------
    async def get(self, key: bytes) -> KeyValue | None:
        data = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = data.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes, *, start: bytes = b"") -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted; from ``start`` on if given, a key under it)
        and the store revision they were read at."""
        data = await self._call("/v3/kv/range", {"key": _b64(start or prefix),
                                                 "range_end": _b64(prefix_end(prefix))})
        kvs = [KeyValue.from_json(kv) for kv in data.get("kvs") or []]
        return kvs, int(data.get("header", {}).get("revision", 0))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        data = await self._call("/v3/kv/put", body)
        return int(data.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        data = await self._call("/v3/kv/deleterange", body)
        return int(data.get("deleted", 0))

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = ()) -> tuple[bool, int]:
        """Atomically: if every comparison holds run ``success`` else ``failure``.

        Returns (succeeded, revision). This is the compare-and-swap the coordinator uses for
        leader epochs and route versions.
        """
        data = await self._call("/v3/kv/txn", {
            "compare": [c.to_json() for c in compare],
            "success": [o.to_json() for o in success],
            "failure": [o.to_json() for o in failure],
        })
        return bool(data.get("succeeded")), int(data.get("header", {}).get("revision", 0))

    # -- leases --------------------------------------------------------------------------------
    async def lease_grant(self, ttl: int) -> int:
        if ttl <= 0:
            raise ValueError("lease TTL must be positive")
        data = await self._call("/v3/lease/grant", {"TTL": str(ttl)})
        return int(data["ID"])

    async def lease_keepalive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its TTL, 0 when it has already expired."""
        data = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)})
        return int(data.get("result", {}).get("TTL", 0))

    async def lease_revoke(self, lease_id: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdError as e:
            if "not found" not in str(e):
                raise

    # -- watches -------------------------------------------------------------------------------
    async def watch_prefix(self, prefix: bytes, start_revision: int = 0
                           ) -> AsyncIterator[list[WatchEvent]]:
        """Yield batches of changes under ``prefix`` from ``start_revision`` (0: from now).

        One streamed request; when it breaks (etcd restarted, endpoint lost) the watch is
        re-created from the revision after the last one seen, so no change is missed while
        etcd keeps that history. Raises EtcdUnavailable only when no endpoint answers.
        """
        next_rev = start_revision
        while True:
            req: dict[str, Any] = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
            if next_rev:
                req["start_revision"] = str(next_rev)
            body = orjson.dumps({"create_request": req})
            stream = None
            for i in range(len(self.endpoints)):
                idx = (self._preferred + i) % len(self.endpoints)
                try:
                    if self._login is not None and self._token is None:
                        await self._authenticate(idx)
                    stream = await self._http().post(
                        self.endpoints[idx] + "/v3/watch", data=body, headers=self._headers(),
                        ssl=self._ssl[idx] or True,
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout))
                    self._preferred = idx
                    break
                except (TimeoutError, aiohttp.ClientError, OSError):
                    continue
            if stream is None:
                raise EtcdUnavailable(f"etcd unreachable at {', '.join(self.endpoints)}")
            try:
                async for line in _json_lines(stream.content):
                    result = line.get("result") or {}
                    if "error" in line:
                        err = line["error"]
                        if isinstance(err, dict) and err.get("grpc_code") == 14:
                            # the gateway lost its etcd (restart): re-create the watch
                            log.info("etcd watch on %r: %s; re-creating from revision %d",
                                     prefix, err.get("message"), next_rev)
                            break
                        if self._login is not None and "token" in str(err):
                            self._token = None  # log in again and re-create the watch
                            break
                        raise EtcdError(f"watch: {err}")
                    if result.get("compact_revision") and not result.get("events"):
                        raise EtcdError(f"watch: history compacted up to {result['compact_revision']}")
                    if result.get("created") and not next_rev:
                        # "from now" is pinned to the revision the watch started at, so a
                        # re-created watch misses nothing that happened in between
                        next_rev = int(result.get("header", {}).get("revision", 0)) + 1
                    events = [
                        WatchEvent(e.get("type", "PUT"), KeyValue.from_json(e.get("kv", {})),
                                   int(e.get("kv", {}).get("mod_revision", 0)))
                        for e in result.get("events") or ()
                    ]
                    if events:
                        next_rev = max(e.revision for e in events) + 1
                        yield events
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                log.info("etcd watch on %r broke (%s); re-creating from revision %d",
                         prefix, e, next_rev)
            finally:
                stream.release()
            await asyncio.sleep(0.2)


def parse_endpoint(url: str) -> tuple[str, ssl.SSLContext | None, tuple[str, str] | None]:
    """(base URL, TLS context for https, (user, password)) of one endpoint with options."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"etcd endpoint {url!r}: expected http(s)://host:port[?options]")
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(opts) - {"ca", "cert", "key", "user", "password_file"}
    if unknown:
        raise ValueError(f"etcd endpoint {url!r}: unknown options {', '.join(sorted(unknown))} "
                         f"(ca, cert, key, user, password_file)")
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    ctx = None
    if parts.scheme == "https":
        try:
            ctx = ssl.create_default_context(cafile=opts.get("ca") or None)
            if opts.get("cert"):
                ctx.load_cert_chain(opts["cert"], opts.get("key") or None)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"etcd endpoint {base}: TLS files: {e}") from None
    elif {"ca", "cert", "key"} & set(opts):
        raise ValueError(f"etcd endpoint {base}: TLS options need an https:// URL")
    login = None
    if "user" in opts:
        if not opts.get("password_file"):
            raise ValueError(f"etcd endpoint {base}: user needs password_file")
        try:
            password = Path(opts["password_file"]).read_text().strip()
        except OSError as e:
            raise ValueError(f"etcd endpoint {base}: password_file: {e.strerror}") from None
        login = (opts["user"], password)
    return base, ctx, login


async def _json_lines(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """grpc-gateway streams one JSON object per line."""
    buf = b""
    async for chunk in content.iter_any():
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].strip(), buf[nl + 1:]
            if line:
                yield orjson.loads(line)
    if buf.strip():
        yield orjson.loads(buf)
