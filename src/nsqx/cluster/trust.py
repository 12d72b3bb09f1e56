"""Node identity inside a cluster: HMAC-signed requests with a shared secret.

Every request one cluster member makes to another (a follower's fetches and epoch
queries, the coordinator's route seal/reset calls, its state queries) carries five headers:
the sender's node id, the receiver's cluster address (the one it dialled, as registered in
etcd), a unix timestamp (milliseconds), a nonce and an HMAC-SHA256 over the method, the
path, the sorted query, the body's SHA-256, the node id, the receiver, the timestamp and
the nonce. The receiver recomputes it with the secret from ``--cluster-secret-file``; a
request that is unsigned, signed with another key, signed for another receiver, too old or
too new (``MAX_SKEW``), signed before this receiver started, or whose nonce it has seen
within that window is refused. The last two together make a copied request good once, on
one node, in one run: the nonce window lives in memory, and what a restart forgets is
older than the restart. Who may *act* as a node is decided by the caller
of :meth:`Verifier.verify`: the leader additionally requires the signed node id to be the
follower a fetch names and that follower's etcd registration to be alive.

Why HMAC and not mutual TLS: it works over the plain listener (no certificates to issue
per node), costs a few microseconds per request (a fetch is already a round trip), and
names the node in the request itself, which the ack needs; TLS (``--cluster-tls-*``)
can be layered under it for confidentiality. See docs/design-notes.md, "Cluster trust".
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import math
import os
import secrets
import ssl
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
from yarl import URL

log = logging.getLogger("nsqx.cluster.trust")

__all__ = ["EMPTY_BODY_HASH", "HEADERS", "MAX_SKEW", "Refused", "RefusalLog", "SignedSession",
           "Signer", "Verifier", "generate_secret_file", "load_secret", "receiver_name",
           "tls_contexts"]

H_NODE, H_TIME, H_NONCE, H_SIG, H_TO = ("X-Nsqx-Node", "X-Nsqx-Time", "X-Nsqx-Nonce",
                                        "X-Nsqx-Signature", "X-Nsqx-To")
HEADERS = (H_NODE, H_TIME, H_NONCE, H_SIG)
MAX_SKEW = 30.0  # seconds a signed request stays valid either side of the receiver's clock
MIN_SECRET = 16  # bytes
EMPTY_BODY_HASH = hashlib.sha256(b"").hexdigest()
WARN_EVERY = 60.0  # one warning per (reason, caller address) this often


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """The cluster secret in a file (surrounding whitespace ignored), or a clear error."""
    try:
        raw = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"--cluster-secret-file {path}: cannot read it: {e.strerror}") from None
    if len(raw) < MIN_SECRET:
        raise ValueError(f"--cluster-secret-file {path}: the secret is {len(raw)} bytes, at "
                         f"least {MIN_SECRET} are needed (e.g. `openssl rand -hex 32`)")
    return raw


def generate_secret_file(path: str | os.PathLike[str]) -> Path:
    """Write a new random secret (64 hex digits) readable by the owner only."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return p


def tls_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts of mutual TLS between members (``--cluster-tls-*``): each
    member's certificate (both server and client use) must chain to ``ca``; a bad file is a
    ValueError saying which."""
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
        server.load_cert_chain(cert, key)
        server.verify_mode = ssl.CERT_REQUIRED
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        client.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--cluster-tls-cert/-key/-ca ({cert}, {key}, {ca}): {e}") from None
    return server, client


def receiver_name(address: str) -> str:
    """A cluster address as both ends sign it: ``host:port``, host lower-case, no brackets."""
    host, _, port = address.strip().rpartition(":")
    return f"{host.strip('[]').lower()}:{port}"


def _message(method: str, path: str, query: Iterable[tuple[str, str]], body_hash: str,
             node: str, to: str, ts: str, nonce: str) -> bytes:
    return "\n".join((method.upper(), path, urlencode(sorted(query)), body_hash, node, to, ts,
                      nonce)).encode()


class Signer:
    """Signs this node's requests (nonces: a random prefix and a counter, never reused)."""

    def __init__(self, secret: bytes, node_id: str, clock: Callable[[], float] = time.time
                 ) -> None:
        self.secret = secret
        self.node_id = node_id
        self.clock = clock
        self._prefix = secrets.token_hex(6)
        self._count = itertools.count()

    def headers(self, method: str, path: str, query: Mapping[str, str] | Iterable[tuple[str, str]],
                body: bytes = b"", *, to: str = "") -> dict[str, str]:
        """The signature headers of one request to the member at cluster address ``to``."""
        items = query.items() if isinstance(query, Mapping) else query
        ms = int(self.clock() * 1000)  # ms: a receiver started within the second still tells
        ts = f"{ms // 1000}.{ms % 1000:03d}"
        nonce = f"{self._prefix}{next(self._count):x}"
        to = receiver_name(to) if to else ""
        bh = hashlib.sha256(body).hexdigest() if body else EMPTY_BODY_HASH
        sig = hmac.new(self.secret, _message(method, path, items, bh, self.node_id, to, ts,
                                             nonce), hashlib.sha256).hexdigest()
        return {H_NODE: self.node_id, H_TO: to, H_TIME: ts, H_NONCE: nonce, H_SIG: sig}


class Refused(Exception):
    """A request that is not a cluster member's: HTTP status, reason code, detail."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail


class Verifier:
    """Checks signatures; remembers nonces while their timestamp is acceptable (replay) and
    refuses any signed before it was made (a replay into a later run of the receiver).

    ``receivers``: this node's cluster address(es) (:func:`receiver_name` form); a request
    signed for another is refused. None accepts any (a unit test's verifier): a member
    sets it before its listener serves."""

    def __init__(self, secret: bytes, *, skew: float = MAX_SKEW,
                 clock: Callable[[], float] = time.time,
                 receivers: Iterable[str] | None = None) -> None:
        self.secret = secret
        self.skew = skew
        self.clock = clock
        self.started = int(clock() * 1000) / 1000  # as a signature made then says it
        self.receivers = None if receivers is None else {receiver_name(r) for r in receivers}
        self._seen: set[str] = set()
        self._expiry: deque[tuple[float, str]] = deque()

    def verify(self, method: str, path: str, query: Iterable[tuple[str, str]], body: bytes,
               headers: Mapping[str, str]) -> str:
        """The signing node's id, or :class:`Refused` (401) saying what is wrong."""
        node, ts, nonce, sig = (headers.get(h) for h in HEADERS)
        if not (node and ts and nonce and sig):
            raise Refused(401, "E_UNAUTHENTICATED", "no cluster signature (X-Nsqx-* headers): "
                          "internal endpoints answer cluster members only")
        try:
            t = float(ts)
        except ValueError:
            t = math.nan
        if not math.isfinite(t):
            raise Refused(401, "E_BAD_SIGNATURE", "malformed timestamp")
        now = self.clock()
        if abs(now - t) > self.skew:
            raise Refused(401, "E_STALE_SIGNATURE", f"signed at {t:.0f}, {now - t:+.0f} s from "
                          f"this node's clock (at most {self.skew:.0f} s)")
        to = headers.get(H_TO) or ""
        bh = hashlib.sha256(body).hexdigest() if body else EMPTY_BODY_HASH
        want = hmac.new(self.secret, _message(method, path, query, bh, node, to, ts, nonce),
                        hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, sig):
            raise Refused(401, "E_BAD_SIGNATURE", "signature does not match (another cluster "
                          "secret, or the request was altered)")
        if self.receivers is not None and to not in self.receivers:
            raise Refused(401, "E_WRONG_RECEIVER", f"signed by {node} for {to or 'no receiver'}"
                          f", this node is {', '.join(sorted(self.receivers))} (a request "
                          "copied from another member's traffic?)")
        if t < self.started:
            raise Refused(401, "E_REPLAYED", f"signed by {node} {self.started - t:.3f} s before "
                          "this node started (a request of its previous run replayed, or "
                          "that member's clock is behind)")
        key = f"{node}\0{nonce}"
        self._prune(now)
        if key in self._seen:
            raise Refused(401, "E_REPLAYED", f"nonce {nonce} of {node} was already used")
        self._seen.add(key)
        self._expiry.append((t + self.skew, key))
        return node

    def _prune(self, now: float) -> None:
        exp = self._expiry
        while exp and exp[0][0] < now:
            self._seen.discard(exp.popleft()[1])


class RefusalLog:
    """Counts refused internal requests by reason (for /metrics) and warns once a minute per
    (reason, caller address), so a flood of forged requests cannot flood the log."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts: Counter[str] = Counter()
        self.clock = clock
        self._warned: dict[tuple[str, str], float] = {}

    def record(self, e: Refused, peer: str, path: str) -> None:
        self.counts[e.code] += 1
        now = self.clock()
        k = (e.code, peer)
        if now - self._warned.get(k, -WARN_EVERY) >= WARN_EVERY:
            if len(self._warned) > 4096:
                self._warned.clear()
            self._warned[k] = now
            log.warning("CLUSTER: refused %s from %s: %s (HTTP %d; further refusals of this "
                        "kind from this address are counted, not logged, for %.0f s)",
                        path, peer, e, e.status, WARN_EVERY)

    def prometheus(self) -> str:
        """Counter lines for nsqd's /metrics."""
        name = "nsqx_cluster_refused_requests_total"
        lines = [f"# HELP {name} Internal cluster requests refused, by reason.",
                 f"# TYPE {name} counter"]
        for code, n in sorted(self.counts.items()):
            lines.append(f'{name}{{reason="{code}"}} {n}')
        return "\n".join(lines) + "\n"


class SignedSession:
    """An aiohttp client session whose ``get``/``post`` sign each request (no signer: plain,
    for a cluster without a secret). Bodies, if any, must be bytes (they are hashed). With
    ``ssl`` (the members' client context) every ``http://`` URL is asked over ``https://``:
    the cluster's internal listeners then all speak TLS."""

    def __init__(self, signer: Signer | None, *, timeout: float = 5.0,
                 ssl: ssl.SSLContext | None = None) -> None:
        self.signer = signer
        self.timeout = timeout
        self.ssl = ssl
        self._session: aiohttp.ClientSession | None = None

    @property
    def closed(self) -> bool:
        return self._session is not None and self._session.closed

    def request(self, method: str, url: str, *, params: Mapping[str, str] | None = None,
                data: bytes = b"", **kw: Any) -> Any:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout))
        params = {k: str(v) for k, v in (params or {}).items()}
        if self.signer is not None:
            u = URL(url)
            kw["headers"] = self.signer.headers(method, u.path, params, data,
                                                to=f"{u.host}:{u.port}")
        if self.ssl is not None:
            kw["ssl"] = self.ssl
            if url.startswith("http://"):
                url = "https://" + url[7:]
        return self._session.request(method, url, params=params, data=data or None, **kw)

    def get(self, url: str, **kw: Any) -> Any:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Any:
        return self.request("POST", url, **kw)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
