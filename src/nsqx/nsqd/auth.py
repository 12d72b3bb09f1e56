"""Client authorization through an external auth server (upstream's `--auth-http-address` contract)."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsqx.nsqd.interfaces import NodeContext


@dataclass
class Authorization:
    topic: re.Pattern[str]
    channels: list[re.Pattern[str]]
    permissions: set[str]

    def allows(self, topic: str, channel: str | None, permission: str) -> bool:
        if permission not in self.permissions or not self.topic.fullmatch(topic):
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
        if not perms <= {"subscribe", "publish"}:
            raise ValueError(f"unknown permission in {sorted(perms)}")
        auths.append(
            Authorization(_anchored(str(a.get("topic", ""))),
                          [_anchored(str(c)) for c in a.get("channels") or []], perms)
        )
    return AuthState(secret, str(data.get("identity", "")), str(data.get("identity_url", "")),
                     time.monotonic() + float(ttl), auths)


async def query_auth(nsqd: NodeContext, secret: str, remote_ip: str, tls: bool, common_name: str) -> AuthState:
    """Ask the auth servers (random order, first answer wins), as upstream does."""
    opts = nsqd.opts
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
