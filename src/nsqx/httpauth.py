"""Client authorization through an external auth server (upstream's `--auth-http-address` contract),
shared by nsqd and nsqlookupd.

nsqd's TCP clients send their secret with ``AUTH``; HTTP clients (``/nsqx/fetch``, the operators'
endpoints of :data:`OPERATOR_RULES`) as ``Authorization: Bearer SECRET``, checked by the
node's one :class:`HTTPAuthorizer`. Permissions are upstream's ``subscribe`` and
``publish`` plus nsqx's ``admin`` (every permission on the matching topics and channels,
and the only one for node-wide actions such as ``PUT /config``): upstream nsqd refuses an
answer naming ``admin``, so an auth server grants it only to operators' secrets.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from nsqx.httpbase import HTTPError

log = logging.getLogger("nsqx.auth")

PERMISSIONS = frozenset({"subscribe", "publish", "admin"})
ADMIN = "admin"


@dataclass
class Authorization:
    topic: re.Pattern[str]
    channels: list[re.Pattern[str]]
    permissions: set[str]

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        if (permission not in self.permissions and ADMIN not in self.permissions) \
                or not self.topic.fullmatch(topic):
            return False
        if channel is None:
            return True
        return any(c.fullmatch(channel) for c in self.channels)


@dataclass
class AuthState:
    secret: str
    identity: str
    identity_url: str
    expires: float
    authorizations: list[Authorization] = field(default_factory=list)

    def expired(self) -> bool:
        return time.monotonic() >= self.expires

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        return any(a.allows(topic, channel, permission) for a in self.authorizations)

    def is_admin(self) -> bool:
        """Granted ``admin`` by some authorization: allowed node-wide actions."""
        return any(ADMIN in a.permissions for a in self.authorizations)


def _anchored(expr: str) -> re.Pattern[str]:
    # Upstream anchors each pattern with ^...$ before matching.
    return re.compile(expr if expr.startswith("^") else f"^{expr}$")


def parse_auth_response(secret: str, data: Any) -> AuthState:
    if not isinstance(data, dict):
        raise ValueError("auth response is not a JSON object")
    ttl = data.get("ttl")
    if not isinstance(ttl, int | float) or ttl <= 0:
        raise ValueError(f"invalid TTL {ttl!r}")
    auths = []
    for a in data.get("authorizations") or []:
        perms = {str(p) for p in a.get("permissions") or []}
        if not perms <= PERMISSIONS:
            raise ValueError(f"unknown permission in {sorted(perms)}")
        auths.append(
            Authorization(_anchored(str(a.get("topic", ""))),
                          [_anchored(str(c)) for c in a.get("channels") or []], perms)
        )
    return AuthState(secret, str(data.get("identity", "")), str(data.get("identity_url", "")),
                     time.monotonic() + float(ttl), auths)


class AuthOptions(Protocol):
    """What a server's options say about its auth server (nsqd's and nsqlookupd's)."""

    auth_http_addresses: list[str]
    auth_http_request_method: str
    http_client_connect_timeout: float
    http_client_request_timeout: float


async def query_auth(opts: AuthOptions, secret: str, remote_ip: str, tls: bool,
                     common_name: str) -> AuthState:
    """Ask the auth servers of ``opts`` (``auth_http_addresses``, ``auth_http_request_method``,
    ``http_client_*_timeout``) in random order, first answer wins, as
    upstream does."""
    params = {"remote_ip": remote_ip, "tls": "true" if tls else "false", "secret": secret,
              "common_name": common_name}
    addrs = list(opts.auth_http_addresses)
    random.shuffle(addrs)
    import aiohttp  # the HTTP client loads when auth is first asked, not at start

    timeout = aiohttp.ClientTimeout(total=opts.http_client_request_timeout,
                                    connect=opts.http_client_connect_timeout)
    last: Exception | None = None
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for addr in addrs:
            url = addr if addr.startswith(("http://", "https://")) else f"http://{addr}/auth"
            try:
                if str(opts.auth_http_request_method).lower() == "post":
                    req = session.post(url, data=params)
                else:
                    req = session.get(url, params=params)
                async with req as resp:
                    if resp.status != 200:
                        raise ValueError(f"auth server {addr} answered {resp.status}")
                    return parse_auth_response(secret, await resp.json(content_type=None))
            except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
                last = exc
    raise last or ValueError("no auth server configured")


# ---------------------------------------------------------------- HTTP endpoints

TOPIC, CHANNEL, NODE = "topic", "channel", "node"


@dataclass(frozen=True)
class Rule:
    """What an HTTP endpoint needs: ``permission`` on the request's ``topic`` (scope
    TOPIC), on its ``topic`` and ``channel`` (CHANNEL, the channel matched as SUB matches
    it), or on the node (NODE: ``admin`` in any authorization)."""

    permission: str
    scope: str


_WRITE_TOPIC = Rule("publish", TOPIC)
_WRITE_CHANNEL = Rule("publish", CHANNEL)
_READ_TOPIC = Rule("subscribe", TOPIC)

# (method, route) -> Rule for the operators' endpoints of nsqd and nsqlookupd (each has some),
# when --auth-http-address is set. Why these permissions: docs/operations.md, "Security".
OPERATOR_RULES: dict[tuple[str, str], Rule] = {
    **{("POST", p): _WRITE_TOPIC for p in (
        "/topic/create", "/topic/delete", "/topic/empty", "/topic/pause", "/topic/unpause",
        "/topic/route", "/topic/split", "/topic/merge", "/topic/move", "/topic/config",
        "/topic/trace", "/message/trace/enable", "/message/trace/disable",
        "/topic/tombstone", "/topic/partition/move")},
    **{("POST", p): _WRITE_CHANNEL for p in (
        "/channel/create", "/channel/delete", "/channel/empty", "/channel/pause",
        "/channel/unpause", "/channel/setoffset", "/channel/config")},
    ("GET", "/message/get"): _READ_TOPIC,
    ("GET", "/trace/search"): _READ_TOPIC,
    ("PUT", "/config/{opt}"): Rule(ADMIN, NODE),
    ("POST", "/cluster/node/remove"): Rule(ADMIN, NODE),
}


class HTTPAuthorizer:
    """A server's check of HTTP requests against the auth server: the secret comes from
    ``Authorization: Bearer SECRET``; answers are cached for the TTL the auth server gives
    (per secret, client address and TLS, as they are asked). A refusal is an HTTPError
    (401 ``AUTH_REQUIRED`` without a secret, 401 ``AUTH_FAILED`` when the auth server
    refuses it or cannot be asked, 403 ``UNAUTHORIZED`` without the permission) and one
    WARNING line naming the client."""

    MAX_CACHED = 1024

    def __init__(self, opts: AuthOptions) -> None:
        self.opts = opts  # the server's options (read when asked: tests change them)
        self._cache: dict[tuple[str, str, bool], AuthState] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.opts.auth_http_addresses)

    @staticmethod
    def _refuse(request: Any, status: int, code: str, why: str) -> HTTPError:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(request.remote)
        log.warning("HTTP: %s %s from %s refused %d %s - %s", request.method, request.path,
                    who, status, code, why)
        return HTTPError(status, code)

    async def state(self, request: Any) -> AuthState:
        """The auth server's answer for the request's secret (401 HTTPError if none)."""
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise self._refuse(request, 401, "AUTH_REQUIRED", "no Authorization: Bearer secret")
        remote = request.remote or ""
        key = (secret, remote, bool(request.secure))
        state = self._cache.get(key)
        if state is None or state.expired():
            try:
                state = await query_auth(self.opts, secret, remote, bool(request.secure), "")
            except Exception as exc:
                raise self._refuse(request, 401, "AUTH_FAILED", str(exc)) from None
            if len(self._cache) >= self.MAX_CACHED:
                self._cache.clear()
            self._cache[key] = state
        return state

    async def check(self, request: Any, topic: str, permission: str,
                    channel: str | None = None) -> None:
        """Refuse (HTTPError) unless the secret grants ``permission`` on topic/channel."""
        if not self.enabled:
            return
        state = await self.state(request)
        if not state.allows(topic, channel, permission):
            where = f"topic {topic!r}" + (f" channel {channel!r}" if channel is not None else "")
            raise self._refuse(request, 403, "UNAUTHORIZED",
                               f"identity {state.identity!r} lacks {permission} on {where}")

    async def check_rule(self, request: Any, rule: Rule, topic: str | None,
                         channel: str | None) -> None:
        """An endpoint of OPERATOR_RULES: authenticate first (401 before any argument
        error), then 400 ``MISSING_ARG_TOPIC``/``_CHANNEL``, then the permission."""
        if not self.enabled:
            return
        state = await self.state(request)
        if rule.scope == NODE:
            if not state.is_admin():
                raise self._refuse(request, 403, "UNAUTHORIZED",
                                   f"identity {state.identity!r} lacks {rule.permission}")
            return
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if rule.scope == CHANNEL and not channel:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        await self.check(request, topic, rule.permission,
                         channel if rule.scope == CHANNEL else None)

