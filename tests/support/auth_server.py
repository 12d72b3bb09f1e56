"""A tiny auth server speaking upstream nsqd's auth contract (``internal/auth/authorizations.go``).

nsqd calls ``GET /auth?remote_ip=..&tls=true|false&secret=..[&common_name=..]`` (or POSTs the same
as a form with ``--auth-http-request-method=post``) and expects::

    {"ttl": 3600, "identity": "...", "identity_url": "...",
     "authorizations": [{"topic": "<regex>", "channels": ["<regex>"],
                         "permissions": ["subscribe", "publish"]}]}

Secrets unknown to the server get HTTP 403 (nsqd turns that into ``E_AUTH_FAILED``). Every request
is recorded so tests can assert what nsqd sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


def grant(topic: str = ".*", channels: tuple[str, ...] = (".*",),
          permissions: tuple[str, ...] = ("subscribe", "publish")) -> dict[str, Any]:
    """One authorization entry (regexes, as upstream)."""
    return {"topic": topic, "channels": list(channels), "permissions": list(permissions)}


@dataclass
class Identity:
    identity: str
    authorizations: list[dict[str, Any]]
    ttl: int = 3600
    identity_url: str = ""

    def body(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "identity": self.identity, "identity_url": self.identity_url,
                "authorizations": self.authorizations}


@dataclass
class AuthRequest:
    method: str
    path: str
    params: dict[str, str]
    status: int


@dataclass
class AuthServer:
    """Threaded HTTP auth server on 127.0.0.1; ``identities`` maps secret -> Identity."""

    identities: dict[str, Identity] = field(default_factory=dict)
    requests: list[AuthRequest] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        assert self._httpd is not None, "auth server not started"
        return self._httpd.server_address[1]

    @property
    def address(self) -> str:
        """host:port, the form upstream's --auth-http-address takes."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> AuthServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _handle(self, params: dict[str, str]) -> None:
                path = urlsplit(self.path).path
                status, body = server._answer(path, params)
                with server._lock:
                    server.requests.append(AuthRequest(self.command, path, params, status))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle(_flat(parse_qs(urlsplit(self.path).query, keep_blank_values=True)))

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                form = self.rfile.read(n).decode() if n else ""
                params = _flat(parse_qs(urlsplit(self.path).query, keep_blank_values=True))
                params.update(_flat(parse_qs(form, keep_blank_values=True)))
                self._handle(params)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="auth-server", daemon=True)
        self._thread.start()
        return self

    def _answer(self, path: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path != "/auth":
            return 404, {"message": "NOT_FOUND"}
        ident = self.identities.get(params.get("secret", ""))
        if ident is None:
            return 403, {"message": "FORBIDDEN"}
        return 200, ident.body()

    def secrets_seen(self) -> list[str]:
        with self._lock:
            return [r.params.get("secret", "") for r in self.requests]

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def _flat(q: dict[str, list[str]]) -> dict[str, str]:
    return {k: v[-1] for k, v in q.items()}
