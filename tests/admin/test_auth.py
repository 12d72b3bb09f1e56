"""nsqadmin against an nsqd with ``--auth-http-address``: its actions carry the secret of
``--http-client-auth-secret-file`` (nsqx), and fail without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.admin.helpers import AdminFactory, http, nsqd_topic
from tests.support import http_api
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.nsqd_process import NsqdFactory


def test_actions_carry_the_secret(admin_factory: AdminFactory, nsqd_factory: NsqdFactory,
                                  auth_server: AuthServer, tmp_path: Path) -> None:
    auth_server.identities["admin-secret"] = Identity("nsqadmin", [grant(".*", (".*",),
                                                                         ("admin",))])
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    assert http_api.pub(node.http_address, "orders", b"x").status == 200
    secret = tmp_path / "admin.secret"
    secret.write_text("admin-secret\n")
    without = admin_factory.start([f"--nsqd-http-address={node.http_address}"])
    r = http("POST", without.url + "/api/topics/orders", {"action": "pause"},
             headers={"User-Agent": "pytest-script"})
    # nsqadmin answers as upstream: 200 with the nodes' failures in "message"
    assert "AUTH_REQUIRED" in r.json()["message"], r.body
    assert not nsqd_topic(node.http_address, "orders")["paused"]
    admin = admin_factory.start([f"--nsqd-http-address={node.http_address}",
                                 f"--http-client-auth-secret-file={secret}"])
    r = http("POST", admin.url + "/api/topics/orders", {"action": "pause"},
             headers={"User-Agent": "pytest-script"})
    assert (r.status, r.json()) == (200, {"message": ""}), r.body
    assert nsqd_topic(node.http_address, "orders")["paused"]
    assert auth_server.secrets_seen().count("admin-secret") == 1


def test_an_unreadable_secret_file_stops_nsqadmin(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "nsqx.cli.nsqadmin", "--nsqd-http-address=127.0.0.1:1",
                          f"--http-client-auth-secret-file={tmp_path / 'missing'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--http-client-auth-secret-file" in out.stderr
