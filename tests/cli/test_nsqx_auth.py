"""The nsqx CLI against an nsqd with ``--auth-http-address``: the secret comes from
``nsqx --auth-secret`` or ``NSQX_AUTH_SECRET`` and every command's requests carry it."""

from __future__ import annotations

import pytest

from nsqx.cli.common import AUTH_SECRET_ENV
from nsqx.cli.nsqx_cmd import main
from tests.support import http_api
from tests.support.auth_server import AuthServer, Identity, grant
from tests.support.nsqd_process import NsqdFactory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_commands_pass_the_secret(nsqd_factory: NsqdFactory, auth_server: AuthServer,
                                  capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    auth_server.identities["ops"] = Identity("ops", [grant("orders", (".*",),
                                                           ("subscribe", "publish"))])
    auth_server.identities["reader"] = Identity("r", [grant("orders", (".*",), ("subscribe",))])
    node = nsqd_factory.start([f"--auth-http-address={auth_server.address}"])
    a = f"--nsqd-http-address={node.http_address}"
    monkeypatch.delenv(AUTH_SECRET_ENV, raising=False)

    code, _, err = run(capsys, "topic", "create", "orders", "--partitions", "2", a)
    assert code == 1 and "nsqd answered 401 AUTH_REQUIRED" in err
    code, out, err = run(capsys, "--auth-secret", "ops", "topic", "create", "orders",
                         "--partitions", "2", a)
    assert code == 0, err
    assert AUTH_SECRET_ENV not in __import__("os").environ  # given back after the command
    assert http_api.pub(node.http_address, "orders", b"hello",
                        partition=0).status == 200  # /pub needs no secret, as upstream

    code, _, err = run(capsys, "--auth-secret", "reader", "trace", "enable", "orders", a)
    assert code == 1 and "403 UNAUTHORIZED" in err
    monkeypatch.setenv(AUTH_SECRET_ENV, "ops")
    assert run(capsys, "trace", "enable", "orders", a)[0] == 0
    code, _, err = run(capsys, "topic", "split", "orders", "0", "--at", "1", a)
    assert code == 1 and "TOPIC_NOT_ROUTE_MANAGED" in err  # authorized, refused by the rules
    assert http_api.post(node.http_address, "/channel/create", topic="orders",
                         channel="c").status == 401
    monkeypatch.setenv(AUTH_SECRET_ENV, "reader")
    code, out, err = run(capsys, "message", "get", "orders", "--offset", "0", "--partition",
                         "0", a)
    assert code == 0 and "hello" in out, err
    code, _, err = run(capsys, "channel", "reset", "orders", "c", "--earliest", a)
    assert code == 1 and "403 UNAUTHORIZED" in err
    monkeypatch.setenv(AUTH_SECRET_ENV, "ops")
    code, _, err = run(capsys, "channel", "reset", "orders", "c", "--earliest", a)
    assert code == 1 and "404 CHANNEL_NOT_FOUND" in err  # authorized: the channel is missing
